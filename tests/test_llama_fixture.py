"""The Llama fixture (fixtures/llama): a standard MindSpore architecture with three healthy
objectives must pass the CI gate with no false alarm.

- the objectives against numpy float64 references (fast, random logits);
- the trained checkpoint is clearly better than random on the demo data;
- `objdebug run --profile ci-gate` as a real subprocess: grad + decompose + stress for the masked
  CE (the long-input lengths of the gate), grad + decompose for the other two;
- OBJ506/OBJ507 on a standard model: label -1 and input id -1 are silently scored -> INFO,
  exit 0 under ci-gate.

The full gate for all three objectives is `slow` (numbers in the closing note of issue 8).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from .conftest import FIXTURES, ROOT, TARGETS

LLAMA = FIXTURES / "llama"
OBJECTIVES = ["llama_ce", "llama_smooth", "llama_entropy"]


def _log_softmax64(x):
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _gate(tmp_path, target: str, stages: str, profile: str = "ci-gate") -> tuple[int, dict, str]:
    report = tmp_path / f"{target}.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), GLOG_v="3")
    proc = subprocess.run(
        [sys.executable, "-m", "objdebug.cli", "run", "--config", str(TARGETS / target / "objdebug.toml"),
         "--profile", profile, "--stages", stages, "--json", str(report)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    data = json.loads(report.read_text()) if report.is_file() else {}
    return proc.returncode, data, proc.stdout + proc.stderr


def _findings(data: dict) -> list[dict]:
    return [f for r in data["results"] for f in r["findings"]]


def _assert_clean(rc: int, data: dict, out: str) -> list[dict]:
    findings = _findings(data)
    bad = [f"{f['verdict']} {f['code']}: {f['message']}" for f in findings
           if f["verdict"] in ("WARN", "FAIL", "ERROR")]
    assert rc == 0 and not bad, "\n".join(bad) or out[-3000:]
    return findings


# --------------------------------------------------------------------------- objectives (fast)
@pytest.fixture(scope="module")
def graph_mode():
    from objdebug.engine import runtime
    runtime.setup("CPU", "graph", 0)


def test_objectives_match_float64_references(graph_mode):
    import mindspore as ms

    from fixtures.llama.objectives import EntropyRegularizedCE, MaskedMeanCE, SmoothedCE

    rng = np.random.default_rng(0)
    logits = rng.normal(scale=3.0, size=(12, 512)).astype(np.float32)
    labels = rng.integers(0, 512, 12).astype(np.int32)
    labels[[2, 7, 11]] = -100
    keep = labels != -100
    logp = _log_softmax64(logits)
    nll = -logp[np.arange(12), np.where(keep, labels, 0)]
    ce = nll[keep].mean()
    smooth = (0.9 * nll - 0.1 * logp.mean(-1))[keep].mean()
    entropy = (-(np.exp(logp) * logp).sum(-1))[keep].mean()
    x, y = ms.Tensor(logits), ms.Tensor(labels)
    assert float(MaskedMeanCE()(x, y).asnumpy()) == pytest.approx(ce, rel=1e-5)
    assert float(SmoothedCE(smoothing=0.1)(x, y).asnumpy()) == pytest.approx(smooth, rel=1e-5)
    total, c, e = (float(t.asnumpy()) for t in EntropyRegularizedCE(beta=0.1)(x, y))
    assert (c, e) == (pytest.approx(ce, rel=1e-5), pytest.approx(entropy, rel=1e-5))
    assert total == pytest.approx(ce - 0.1 * entropy, rel=1e-5)
    assert EntropyRegularizedCE.components == ["ce", "entropy"]
    # all labels ignored: max(mask.sum(), 1) keeps the mean at 0, not NaN
    none = ms.Tensor(np.full(12, -100, np.int32))
    assert float(MaskedMeanCE()(x, none).asnumpy()) == 0.0


def test_checkpoint_is_trained_and_the_model_is_causal(graph_mode):
    import mindspore as ms

    from objdebug.core.config import load_config
    from objdebug.engine.data import Sample, pack
    from objdebug.demo import corpus
    from objdebug.engine.target import load_target

    assert (LLAMA / "llama.ckpt").stat().st_size < 2 * 1024 * 1024
    target = load_target(load_config(TARGETS / "llama_ce" / "objdebug.toml"))  # strict load
    model = target.model
    names = [p.name for p in model.trainable_params()]
    assert "embed.embedding_table" in names and not any("lm_head" in n for n in names)  # tied
    assert sum(p.size for p in model.trainable_params()) == 253632
    rows = [json.loads(line) for line in (ROOT / "objdebug/demo/align.jsonl").read_text().splitlines()]
    samples = [Sample(id=r["id"], prompt=corpus.encode(r["prompt"]), response=corpus.encode(r["good"]))
               for r in rows]
    ids, labels = pack(samples, 64, 0, -100, True)
    logits = model(ms.Tensor(ids)).asnumpy()
    assert logits.shape == (len(rows), 64, 512) and logits.dtype == np.float32
    keep = labels != -100
    nll = -np.take_along_axis(_log_softmax64(logits), np.where(keep, labels, 0)[..., None], -1)[..., 0]
    mean = float(nll[keep].mean())
    assert mean < 0.25 * math.log(512), mean  # random: log(512) = 6.24
    # causal: changing the last token changes no earlier logit
    changed = ids.copy()
    changed[:, -1] = (changed[:, -1] + 1) % 256
    again = model(ms.Tensor(changed)).asnumpy()
    np.testing.assert_array_equal(again[:, :-1], logits[:, :-1])


# --------------------------------------------------------------------------- the CI gate (subprocess)
def test_masked_ce_passes_the_ci_gate_on_grad_and_decompose(tmp_path):
    """The ci-gate profile with 8 random FD directions as in the full profile (the old OBJ206 warned
    on this target with them: 0.014). The stress stage on this model is the slow test below (~60 s:
    one forward + backward graph per length on a 4-layer model); the healthy-objective stress claim
    runs fast on the demo and the nn.CrossEntropyLoss fixtures (tests/test_stress.py)."""
    rc, data, out = _gate(tmp_path, "llama_ce", "grad,decompose", str(LLAMA / "ci-gate-fd8.toml"))
    findings = _assert_clean(rc, data, out)
    codes = {f["code"]: f for f in findings}
    assert codes["OBJ206"]["verdict"] == "PASS" and codes["OBJ206"]["value"] < 2e-3
    fd = next(r["value"] for r in data["results"] if r["check"] == "finite-differences")
    assert fd["n_directions"] == 9 and fd["directions"][0]["direction"] == "gradient"
    assert data["summary"]["WARN"] == data["summary"]["FAIL"] == 0


@pytest.mark.slow
def test_masked_ce_passes_the_ci_gate_on_stress(tmp_path):
    """The stress stage under ci-gate with long inputs at 512 tokens: MindSpore's nature (label -1
    scored as V-1, input id -1 read as 511) is a note, never a failure."""
    rc, data, out = _gate(tmp_path, "llama_ce", "stress", str(LLAMA / "ci-gate-fd8-short.toml"))
    findings = _assert_clean(rc, data, out)
    codes = {f["code"]: f for f in findings}
    assert codes["OBJ506"]["verdict"] == "INFO" and "label -1: accepted" in codes["OBJ506"]["message"]
    assert "label 512: rejected" in codes["OBJ506"]["message"]
    assert codes["OBJ507"]["verdict"] == "INFO" and "(wrapped)" in codes["OBJ507"]["message"]
    assert codes["OBJ506"]["fix"] and codes["OBJ507"]["fix"]
    assert data["summary"]["INFO"] >= 2 and data["summary"]["WARN"] == data["summary"]["FAIL"] == 0
    assert codes["OBJ501"]["verdict"] == "PASS" and codes["OBJ513"]["verdict"] == "PASS"


@pytest.mark.slow
def test_masked_ce_long_inputs_under_the_ci_gate(tmp_path):
    """The ci-gate's own long inputs: T=2048 either ran with its measured peak beside the calibrated
    prediction, or was skipped because the calibrated prediction (not a guess) does not fit this
    machine; never a failure."""
    rc, data, out = _gate(tmp_path, "llama_ce", "stress", str(LLAMA / "ci-gate-fd8.toml"))
    findings = _assert_clean(rc, data, out)
    codes = {f["code"]: f for f in findings}
    long = next(r["value"] for r in data["results"] if r["check"] == "long-inputs")
    row = long["lengths"]["2048"]
    assert row["estimate_from"] == "calibration", row
    if row["ran"]:
        assert row["peak_rss_bytes"] > 0 and row["estimate_bytes"] > 0
    else:
        assert "predicted" in row["reason"] and long["longest_fitting"] > 0, row
        assert "the longest length that fits is" in codes["OBJ501"]["message"]
    assert codes["OBJ513"]["verdict"] == "PASS"  # the objective alone ran at every long length


@pytest.mark.parametrize("target", [
    # 20-30 s each; in CI the masked CE runs grad and decompose on this model, the composite is covered by
    # decompose_healthy (OBJ305) and label smoothing by tests/test_pitfalls.py's likelihood fit
    pytest.param("llama_smooth", marks=pytest.mark.slow),
    pytest.param("llama_entropy", marks=pytest.mark.slow)])
def test_other_objectives_pass_the_ci_gate_on_grad_and_decompose(tmp_path, target):
    rc, data, out = _gate(tmp_path, target, "grad,decompose")
    findings = _assert_clean(rc, data, out)
    codes = {f["code"]: f for f in findings}
    assert codes["OBJ206"]["verdict"] == "PASS"
    if target == "llama_entropy":  # two components on comparable scales: judged, not skipped
        assert codes["OBJ303"]["verdict"] == "PASS"


@pytest.mark.slow
@pytest.mark.parametrize("target", OBJECTIVES)
def test_every_objective_passes_the_full_ci_gate(tmp_path, target):
    rc, data, out = _gate(tmp_path, target, "grad,decompose,stress")
    _assert_clean(rc, data, out)
    print(target, json.dumps(data.get("timings", {})))
