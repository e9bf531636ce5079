"""The seed's named pitfalls: OBJ305 (multi-task seesaw), OBJ208 (likelihood shape), OBJ513 (the
objective alone on long logits), and the likelihood-shape numbers against numpy float64.

Targets are listed in MUST_FAIL / MUST_PASS: adding a fixture directory (e.g. a Llama-style
model pointing at fixtures/pitfall_objectives.py) to a list is all a new case needs.
"""

import os
import tempfile

import numpy as np
import pytest

from objdebug.engine import runtime
from objdebug.core.config import load_config
from objdebug.pipeline.context import Context
from objdebug.engine.core import Engine
from objdebug.core.errors import InputError
from objdebug.core.findings import Verdict
from objdebug.stages.grad.likelihood import analyse
from objdebug.pipeline.profile import load_profile
from objdebug.rules import get_rule
from objdebug.stages import decompose, grad
from objdebug.pipeline.runner import run_check  # the runner reviews verdicts (untrained-model notes)

from .conftest import TARGETS

PROFILE = load_profile("default")
# fewer rows and one gradient batch: the verdicts are the same, the compiles fewer
PROFILE.data["decompose"].update(max_samples=16, grad_batches=1)

# target directory -> (stage, code) that must FAIL / must PASS; SLOW ones run with -m slow only
MUST_FAIL = {
    "demo_seesaw": [("decompose", "OBJ305")],
    "demo_mse": [("grad", "OBJ208")],
    "demo_argmax": [("grad", "OBJ208")],
    # the same pitfalls on the Llama-style fixture (RoPE, GQA, RMSNorm, SwiGLU, tied nn.Embedding)
    "llama_seesaw": [("decompose", "OBJ305")],
    "llama_mse": [("grad", "OBJ208")],
}
MUST_PASS = {
    "decompose_healthy": [("decompose", "OBJ305"), ("grad", "OBJ208")],
    "demo_entreg": [("decompose", "OBJ305"), ("grad", "OBJ208")],
    "demo_smoothing": [("grad", "OBJ208")],
}
SLOW = {"demo_entreg", "demo_smoothing"}  # ~20 s each on 2 cores; decompose_healthy covers the claim


def cases(table):
    return [pytest.param(n, s, c, marks=[pytest.mark.slow] if n in SLOW else [])
            for n, cs in table.items() for s, c in cs]


@pytest.fixture(scope="module", autouse=True)
def scratch_cwd():
    old = os.getcwd()
    os.chdir(tempfile.mkdtemp(prefix="objdebug-test-pitfalls-"))
    yield
    os.chdir(old)


_CTX: dict[str, Context] = {}


def context(name: str) -> Context:
    if name not in _CTX:
        cfg = load_config(TARGETS / name / "objdebug.toml")
        runtime.setup(cfg.run.device, cfg.run.mode, cfg.run.seed)
        from objdebug.engine.target import load_target

        target = load_target(cfg)
        _CTX[name] = Context(config=cfg, target=target, engine=Engine(target, batch_size=8),
                             profile=PROFILE)
    return _CTX[name]


def finding(name: str, stage: str, code: str):
    ctx = context(name)
    module = {"decompose": decompose, "grad": grad}[stage]
    check = next(c for c in module.checks() if code in c.codes)
    res = run_check(check, ctx, PROFILE.section(stage))
    assert res.error is None, res.error
    return res, next(f for f in res.findings if f.code == code)


@pytest.mark.parametrize("name,stage,code", cases(MUST_FAIL))
def test_pitfall_fails(name, stage, code):
    _, f = finding(name, stage, code)
    assert f.verdict is Verdict.FAIL, f.message


@pytest.mark.parametrize("name,stage,code", cases(MUST_PASS))
def test_healthy_passes(name, stage, code):
    _, f = finding(name, stage, code)
    assert f.verdict is Verdict.PASS, f.message


def test_seesaw_message_gives_shares_and_rebalancing():
    res, f = finding("demo_seesaw", "decompose", "OBJ305")
    v = res.value
    shares = {r["name"]: r["share"] for r in v["components"]}
    assert shares["ce"] < 0.02 and shares["aux"] > 0.98
    assert v["primary"] == "ce" and "multiply the auxiliary weights by" in f.message
    assert v["weights_from"] == "fit"
    assert [r["weight"] for r in v["components"]] == pytest.approx([1.0, 1.0], abs=1e-3)
    # the advice is exact for norms: ce gets the target share with the rescaled weight
    rows = {r["name"]: r for r in v["components"]}
    c_ce = rows["ce"]["contribution"]
    c_aux = rows["aux"]["contribution"] * v["rebalance_factor"]
    assert c_ce / (c_ce + c_aux) == pytest.approx(v["target_share"])


@pytest.mark.slow
def test_effective_weights_count_a_negative_regulariser_at_its_weight():
    res, _ = finding("demo_entreg", "decompose", "OBJ305")
    rows = {r["name"]: r for r in res.value["components"]}
    assert res.value["weights_from"] == "fit"
    assert rows["entropy"]["weight"] == pytest.approx(-0.1, abs=1e-3)
    assert rows["entropy"]["contribution"] == pytest.approx(0.1 * rows["entropy"]["grad_norm"], rel=1e-2)


def test_primary_names_the_task_component():
    # decompose_healthy with z_loss declared the task: 2.4% of the gradient, the seesaw
    ctx = context("decompose_healthy")
    ctx.config.objective.primary = "z_loss"
    try:
        res, f = finding("decompose_healthy", "decompose", "OBJ305")
    finally:
        ctx.config.objective.primary = None
    assert res.value["primary"] == "z_loss" and f.verdict is Verdict.FAIL
    assert "'ce' takes" in f.message


def test_primary_must_be_a_declared_component(tmp_path):
    src = (TARGETS / "demo_entreg" / "objdebug.toml").read_text()
    bad = tmp_path / "objdebug.toml"
    bad.write_text(src.replace('components = ["ce", "entropy"]',
                               'components = ["ce", "entropy"]\nprimary = "kl"'))
    with pytest.raises(InputError, match="objective.primary"):
        load_config(bad)


def test_mse_is_named_and_numbers_match_numpy():
    res, f = finding("demo_mse", "grad", "OBJ208")
    v = res.value
    assert "squared error on probabilities" in v["shape"] and v["cosine_family"] < 0.9
    # numpy float64: d/dz sum_k (softmax_k - onehot_k)^2 = J^T 2(p - onehot), J = diag(p) - p p^T
    from objdebug.pipeline.run_data import logit_gradients

    lg = context("demo_mse").provided(logit_gradients)
    labels = grad.grad_batch(context("demo_mse")).labels
    scored = labels != -100
    x = lg["logits"].astype(np.float64)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    onehot = np.zeros_like(p)
    np.put_along_axis(onehot, np.where(scored, labels, 0)[..., None].astype(np.int64), 1.0, -1)
    e = 2 * (p - onehot)
    g = p * (e - (p * e).sum(-1, keepdims=True)) / scored.sum()
    g[~scored] = 0
    ref = analyse(g, lg["logits"], labels, -100)
    assert v["cosine_ce"] == pytest.approx(ref["cosine_ce"], abs=1e-4)
    assert np.allclose(lg["grad"][scored], g[scored], atol=1e-6)


def test_family_fit_recovers_smoothing_and_entropy_weights():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((2, 16, 32)) * 3
    labels = rng.integers(0, 32, (2, 16))
    labels[:, :3] = -100
    scored = labels != -100
    x = logits - logits.max(-1, keepdims=True)
    p = np.exp(x) / np.exp(x).sum(-1, keepdims=True)
    onehot = np.zeros_like(p)
    np.put_along_axis(onehot, np.where(scored, labels, 0)[..., None], 1.0, -1)
    logp = np.log(p)
    ent_dir = p * (logp + (-(p * logp).sum(-1, keepdims=True)))
    for eps, lam in ((0.0, 0.0), (0.1, 0.0), (0.0, 0.1)):
        g = (p - onehot) + eps * (onehot - 1 / 32) + lam * ent_dir
        g[~scored] = 0
        v = analyse(g / scored.sum(), logits, labels, -100)
        assert v["cosine_family"] > 0.99999 and v["reweighted_share"] == 0.0
        assert v["smoothing"] == pytest.approx(eps, abs=1e-6)
        assert v["entropy_weight"] == pytest.approx(lam, abs=1e-6)
        assert v["shape"].startswith("likelihood")
    v = analyse(np.zeros_like(logits), logits, labels, -100)
    assert v["shape"] == "no gradient"


def test_argmax_objective_is_named_no_gradient():
    res, f = finding("demo_argmax", "grad", "OBJ208")
    assert res.value["shape"] == "no gradient" and "no gradient" in f.message


def test_focal_weights_are_named():
    # focal loss gamma 2 in float64: per token (1-p)^2 - 2 p (1-p) log p times the CE gradient,
    # on logits whose argmax is the label for 70% of the tokens (a focal loss equals CE where
    # every label probability is small)
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((1, 400, 16)) * 4
    labels = np.where(rng.random((1, 400)) < 0.7, logits.argmax(-1), rng.integers(0, 16, (1, 400)))
    x = logits - logits.max(-1, keepdims=True)
    p = np.exp(x) / np.exp(x).sum(-1, keepdims=True)
    py = np.take_along_axis(p, labels[..., None], -1)
    onehot = np.zeros_like(p)
    np.put_along_axis(onehot, labels[..., None], 1.0, -1)
    a = (1 - py) ** 2 - 2 * py * (1 - py) * np.log(py)
    v = analyse(a * (p - onehot), logits, labels, -100)
    assert v["reweighted_share"] > 0.1 and v["shape"].startswith("focal-like")
    assert v["cosine_ce"] > 0.95  # the direction alone would pass it: the weights tell


def test_rule_pages():
    for code, stage in (("OBJ208", "grad"), ("OBJ305", "decompose"), ("OBJ513", "stress")):
        rule = get_rule(code)
        assert rule.stage == stage and rule.fix


@pytest.mark.slow
@pytest.mark.parametrize("name,code", [("demo_seesaw", "OBJ305"), ("demo_mse", "OBJ208")])
def test_cli_gate_fails_the_pitfalls(tmp_path, name, code):
    import json
    import subprocess
    import sys

    from .conftest import ROOT

    report = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "objdebug.cli", "run", "-c",
                           str(TARGETS / name / "objdebug.toml"), "--profile", "ci-gate",
                           "--stages", "grad,decompose", "--json", str(report)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdicts = {f["code"]: f["verdict"] for r in json.loads(report.read_text())["results"]
                for f in r["findings"]}
    assert verdicts[code] == "FAIL"
