"""The preference stage (OBJ801-OBJ813) on the demo model: healthy and broken preference objectives.

Compiles are shared where the measurement allows it:
- the loss-only fixtures (form "preference") reuse the healthy target's policy and reference
  log-probs (same model, checkpoints and pairs: only the loss differs), so each compiles its loss
  alone (a graph of four [B] vectors), plus one gradient graph where the check needs one;
- the data variants (swapped, length-biased, empty answers) run the healthy target's engine: the
  model and the loss are the same, only the pairs differ, and they share its length bucket;
- the "preference-pairs" fixtures (the objective owns policy and reference) each compile the
  gradient graph and the policy's log-prob graph; the two broken ones pass each other's check
  (reference gradient / masking), so the healthy one and the full stage on it are marked slow.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # fixtures.preference_losses is referenced by the fixture configs
    sys.path.insert(0, str(ROOT))

from objdebug import api  # noqa: E402
from objdebug.engine import runtime  # noqa: E402
from objdebug.core.config import load_config  # noqa: E402
from objdebug.pipeline.context import Context  # noqa: E402
from objdebug.engine.core import Engine  # noqa: E402
from objdebug.core.errors import InputError  # noqa: E402
from objdebug.core.findings import Verdict  # noqa: E402
from objdebug.stages.preference.session import _truncate, session  # noqa: E402
from objdebug.pipeline.profile import load_profile  # noqa: E402
from objdebug.stages import preference as P  # noqa: E402
from objdebug.engine.target import load_target  # noqa: E402
from objdebug.pipeline.runner import run_check  # the runner reviews verdicts (untrained-model notes)

TARGETS = ROOT / "fixtures" / "targets"
DATA = TARGETS / "pref_data"
PROFILE = load_profile("default")
TH = PROFILE.section("preference")


@pytest.fixture(scope="module", autouse=True)
def scratch_cwd():
    old = os.getcwd()
    tmp = tempfile.mkdtemp(prefix="objdebug-test-pref-")  # MindSpore may drop rank_0/ here
    os.chdir(tmp)
    yield
    os.chdir(old)


def make_ctx(name: str, overrides: dict | None = None, like: Context | None = None) -> Context:
    """A Context for fixture target `name`; `like`: share that context's target and engine."""
    cfg = load_config(TARGETS / name / "objdebug.toml", overrides=overrides)
    runtime.setup(cfg.run.device, cfg.run.mode, cfg.run.seed)
    if like is not None:
        return Context(config=cfg, target=like.target, engine=like.engine, profile=PROFILE)
    target = load_target(cfg)
    engine = Engine(target, batch_size=PROFILE.section("engine")["batch_size"])
    engine.stage = "preference"
    return Context(config=cfg, target=target, engine=engine, profile=PROFILE)


def run(ctx: Context, *checks) -> dict:
    """code -> Finding for the given checks (no check may crash)."""
    out = {}
    for check in checks:
        res = run_check(check, ctx, TH)
        assert res.error is None, res.error
        out.update({f.code: f for f in res.findings})
    return out


@pytest.fixture(scope="module")
def healthy():
    ctx = make_ctx("pref_healthy")
    findings = run(ctx, *P.checks())
    return ctx, findings


def loss_variant(healthy_ctx: Context, name: str, overrides: dict | None = None) -> Context:
    """A loss-only fixture with the healthy target's log-probs (same model, checkpoints, pairs)."""
    ctx = make_ctx(name, overrides)
    s, h = session(ctx), session(healthy_ctx)
    s.cache["policy"], s.cache["reference"] = h.logps("policy"), h.logps("reference")
    return ctx


# --------------------------------------------------------------------------- healthy
def test_healthy_dpo_passes_every_check(healthy):
    _, findings = healthy
    assert set(findings) == {f"OBJ8{i:02d}" for i in range(1, 14)}
    bad = {c: (f.verdict, f.message) for c, f in findings.items() if f.verdict is not Verdict.PASS}
    assert not bad
    assert findings["OBJ801"].value == pytest.approx(math.log(2), rel=1e-6)
    assert findings["OBJ812"].value > 0.9


def test_sequence_logps_match_numpy(healthy):
    """objdebug's sequence log-probs == a float64 numpy log-softmax over the same logits."""
    ctx, _ = healthy
    s = session(ctx)
    b = s.batches[0]
    logits = ctx.engine.logits(b.c_ids).astype(np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    mask = b.c_labels != ctx.config.data.label_pad_id
    picked = np.take_along_axis(logp, np.where(mask, b.c_labels, 0)[..., None].astype(np.int64), -1)[..., 0]
    ref = np.where(mask, picked, 0.0).sum(-1)[:b.n]
    lp = s.logps("policy")
    np.testing.assert_allclose(lp.c_sum[:b.n], ref, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(lp.c_count[:b.n], mask.sum(-1)[:b.n])
    # the gradient graph sums the same quantity in the graph, in float32
    import mindspore as ms
    from mindspore import nn

    from objdebug.stages.preference.cells import sequence_logps

    class InGraph(nn.Cell):
        def __init__(self, pad):
            super().__init__()
            self.pad = pad

        def construct(self, x, y):
            return sequence_logps(x, y, self.pad)

    total, count = InGraph(ctx.config.data.label_pad_id)(ms.Tensor(logits.astype(np.float32)),
                                                        ms.Tensor(b.c_labels))
    np.testing.assert_allclose(total.asnumpy()[:b.n], ref, rtol=1e-5, atol=1e-3)
    np.testing.assert_array_equal(count.asnumpy()[:b.n], mask.sum(-1)[:b.n])
    # policy and reference are both scored through the shared model.forward graph (the reference's
    # weights loaded into the target's model for the call): no model graph of the stage's own
    graphs = {r.graph for r in ctx.engine.compiles.records}
    assert not any(g.startswith(("preference.policy", "preference.reference")) for g in graphs)
    assert sum(r.holds_model for r in ctx.engine.compiles.records) <= 2  # model.forward, model.vjp


def test_zero_point_closed_forms(healthy):
    """IPO 1/(4 beta^2), SimPO log(1 + e^gamma), hinge 1: the reference losses on real pairs."""
    ctx, _ = healthy
    cases = [("objdebug.losses:IPOLoss", "ipo", "mean", {"beta": 0.5}, 1.0),
             ("objdebug.losses:SimPOLoss", "simpo", "mean", {"beta": 2.0, "gamma": 1.0}, math.log1p(math.e)),
             ("objdebug.losses:HingeDPOLoss", "hinge", "sum", {"beta": 0.1}, 1.0)]
    for factory, kind, logps, kwargs, expected in cases:
        v = loss_variant(ctx, "pref_healthy", {"objective.factory": factory, "objective.loss_type": kind,
                                               "objective.logps": logps, "objective.kwargs": kwargs})
        f = run(v, P.ZeroPoint(), P.Length())
        assert f["OBJ801"].verdict is Verdict.PASS, f["OBJ801"].message
        assert f["OBJ801"].value == pytest.approx(expected, rel=1e-5)
        assert f["OBJ810"].verdict is Verdict.PASS
        assert f["OBJ802"].verdict is (Verdict.SKIP if kind == "simpo" else Verdict.PASS)


def test_loss_without_rewards_skips_reward_checks(healthy):
    v = loss_variant(healthy[0], "pref_healthy", {"objective.factory": "fixtures.preference_losses:LossOnlyDPO"})
    f = run(v, P.ZeroPoint(), P.Symmetry())
    assert f["OBJ801"].verdict is Verdict.PASS
    assert f["OBJ802"].verdict is Verdict.SKIP and f["OBJ803"].verdict is Verdict.SKIP
    assert f["OBJ804"].verdict is Verdict.PASS


# --------------------------------------------------------------------------- broken losses
def test_swapped_loss_fails_symmetry_and_direction(healthy):
    v = loss_variant(healthy[0], "pref_swapped")
    f = run(v, P.Symmetry(), P.Direction())
    assert f["OBJ803"].verdict is Verdict.PASS        # its rewards are right ...
    assert f["OBJ804"].verdict is Verdict.FAIL        # ... its loss is not
    assert "wrong way in 18 of 18 batches" in f["OBJ804"].message
    assert f["OBJ805"].verdict is Verdict.FAIL and f["OBJ805"].value < 0
    assert f["OBJ806"].verdict is Verdict.PASS


def test_no_reference_fails_zero_point(healthy):
    f = run(loss_variant(healthy[0], "pref_no_reference"), P.ZeroPoint())
    assert f["OBJ801"].verdict is Verdict.FAIL and "expected ln 2 = 0.693147" in f["OBJ801"].message
    assert f["OBJ802"].verdict is Verdict.FAIL


def test_offset_rewards_fail_flip(healthy):
    f = run(loss_variant(healthy[0], "pref_offset_rewards"), P.Symmetry())
    assert f["OBJ803"].verdict is Verdict.FAIL and f["OBJ804"].verdict is Verdict.PASS


def test_ipo_on_summed_logps_fails(healthy):
    f = run(loss_variant(healthy[0], "pref_ipo_sum"), P.ZeroPoint(), P.Length())
    assert f["OBJ810"].verdict is Verdict.FAIL and "'ipo' expects 'mean'" in f["OBJ810"].message
    assert f["OBJ801"].value == pytest.approx(25.0, rel=1e-5)  # 1/(4 * 0.1^2): the formula is right


def test_dpo_on_mean_logps_warns(healthy):
    v = loss_variant(healthy[0], "pref_healthy", {"objective.logps": "mean"})
    assert run(v, P.Length())["OBJ810"].verdict is Verdict.WARN


def test_unused_beta_fails_settings(healthy):
    f = run(loss_variant(healthy[0], "pref_beta_unused"), P.SettingsMatter())
    assert f["OBJ811"].verdict is Verdict.FAIL and "beta" in f["OBJ811"].message


# --------------------------------------------------------------------------- data variants
def data_variant(healthy_ctx: Context, data: str) -> Context:
    return make_ctx("pref_healthy", {"data.preference": str(DATA / f"{data}.jsonl")}, like=healthy_ctx)


def test_swapped_data_warns_agreement(healthy):
    f = run(data_variant(healthy[0], "swapped"), P.Agreement())
    assert f["OBJ812"].verdict is Verdict.WARN and f["OBJ812"].value < 0.1
    assert f["OBJ813"].verdict is Verdict.WARN


def test_length_biased_pairs_warn(healthy):
    f = run(data_variant(healthy[0], "length"), P.Length())
    assert f["OBJ809"].verdict is Verdict.WARN and f["OBJ809"].value > 0.5


def test_empty_answers_are_named(healthy):
    f = run(data_variant(healthy[0], "empty"), P.EmptyPairs())
    assert f["OBJ808"].verdict is Verdict.WARN
    assert "2 of 16 pairs" in f["OBJ808"].message and "a002-good-bad (17/0), a004-good-bad (20/0)" in f["OBJ808"].message


def test_truncation_cuts_answers_not_prompts():
    row = {"id": "x", "prompt": [1] * 10, "chosen": [2] * 8, "rejected": [3] * 3}
    out = _truncate(row, 12)
    assert out["prompt"] == [1] * 10 and out["chosen"] == [2, 2] and out["rejected"] == [3, 3]
    assert out["truncated"]
    assert _truncate(row, 8)["chosen"] == [] and not _truncate(row, 0)["truncated"]


# --------------------------------------------------------------------------- "preference-pairs"
@pytest.fixture(scope="module")
def pairs():
    cache: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in cache:
            cache[name] = run(make_ctx(name), P.Direction(), P.Masking())
        return cache[name]
    return get


@pytest.mark.slow  # the two broken pairs fixtures below pass each other's check (OBJ806 / OBJ807)
def test_pairs_healthy_direction_and_masking(pairs):
    f = pairs("pref_pairs_healthy")
    for code in ("OBJ805", "OBJ806", "OBJ807"):
        assert f[code].verdict is Verdict.PASS, (code, f[code].message)
    assert "reference receives no gradient" in f["OBJ806"].message


@pytest.mark.slow
def test_pairs_reference_gradient_fails(pairs):
    f = pairs("pref_pairs_reference_grad")
    assert f["OBJ806"].verdict is Verdict.FAIL and "reference.embed.weight" in f["OBJ806"].message
    assert f["OBJ807"].verdict is Verdict.PASS


def test_pairs_rejected_prompt_unmasked_fails(pairs):
    f = pairs("pref_pairs_prompt_unmasked")
    assert f["OBJ807"].verdict is Verdict.FAIL
    assert "0 of" not in f["OBJ807"].message.split("prompt positions")[0]
    assert f["OBJ806"].verdict is Verdict.PASS


@pytest.mark.slow
def test_pairs_healthy_full_stage():
    ctx = make_ctx("pref_pairs_healthy")
    findings = run(ctx, *P.checks())
    assert all(f.verdict is Verdict.PASS for f in findings.values()), \
        {c: f.message for c, f in findings.items() if f.verdict is not Verdict.PASS}


# --------------------------------------------------------------------------- contract
def test_stage_skips_without_preference_objective():
    cfg = load_config(TARGETS / "grad_healthy" / "objdebug.toml")
    res = api.run(cfg, stages=["preference"])
    # every check skipped: nothing was checked, which is never a pass (OBJ005, issue 23)
    assert res.exit_code == 1 and [f.code for f in res.findings if f.verdict is not Verdict.SKIP] == ["OBJ005"]
    assert "no preference objective" in res.findings[0].message


def test_other_stages_skip_for_a_preference_objective():
    cfg = load_config(TARGETS / "pref_healthy" / "objdebug.toml")
    res = api.run(cfg, stages=["align", "grad"])
    assert res.findings and {f.verdict for f in res.findings if f.code != "OBJ005"} == {Verdict.SKIP}
    assert res.exit_code == 1  # nothing was checked (OBJ005)
    assert 'call = "preference"' in res.findings[0].message


@pytest.mark.parametrize("text, message", [
    ('loss_type = "dpo"', "For 'objective.loss_type', the value must be in"),
    ('logps = "max"', "For 'objective.logps', the value must be in"),
    ('call = "pairs"', "For 'objective.call', the value must be in"),
])
def test_invalid_preference_keys(tmp_path, text, message):
    src = (TARGETS / "pref_healthy" / "objdebug.toml").read_text()
    key = text.split(" = ")[0]
    lines = [ln for ln in src.splitlines() if not ln.startswith(f"{key} = ")]
    lines.insert(lines.index("[objective]") + 1, text)
    path = tmp_path / "objdebug.toml"
    path.write_text("\n".join(lines).replace("../../../objdebug", str(ROOT / "objdebug")))
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(path)


def test_preference_section_rules(tmp_path):
    path = tmp_path / "objdebug.toml"
    path.write_text('[objective]\nfactory = "a:b"\nlogps = "sum"\n')
    with pytest.raises(InputError, match="only for a preference call"):
        load_config(path)
    path.write_text('[objective]\nfactory = "a:b"\ncall = "preference"\n')
    with pytest.raises(InputError, match="a \\[model\\] is required"):
        load_config(path)
    cfg = load_config(demo=True)
    assert cfg.preference_objective is cfg.preference and cfg.preference.call == "preference"
    assert Path(cfg.reference.checkpoint).is_file() and Path(cfg.data.preference).is_file()
    assert "preference" not in load_config(TARGETS / "grad_healthy" / "objdebug.toml").to_dict()


@pytest.mark.parametrize("line, message", [
    ('{"id": "a", "prompt": "p", "chosen": "x"}', "missing field 'rejected'"),
    ('{"id": "a", "prompt": "p", "chosen": "x", "rejected": "y", "strength": "big"}',
     "field 'strength' must be a number"),
    ('{"id": "p1", "prompt": "p", "chosen": "x", "rejected": "y"}', "duplicate id 'p1'"),
    ('{"id": "a", "chosen_ids": [1, 999], "rejected": "y"}', "token id 999 outside the vocabulary"),
])
def test_bad_pairs_file_names_file_and_line(tmp_path, line, message):
    data = tmp_path / "pairs.jsonl"
    data.write_text('{"id": "p1", "prompt": "p", "chosen": "x", "rejected": "y"}\n' + line + "\n")
    cfg = load_config(TARGETS / "pref_healthy" / "objdebug.toml", overrides={"data.preference": str(data)})
    ctx = Context(config=cfg, target=load_target(cfg), engine=None, profile=PROFILE)
    ctx.engine = Engine(ctx.target)
    with pytest.raises(InputError) as err:
        session(ctx)
    assert message in str(err.value) and f"{data}:2" in str(err.value)


def test_bad_pairs_file_exits_2_in_one_line(tmp_path):
    data = tmp_path / "pairs.jsonl"
    data.write_text('{"id": "p1", "prompt": "p", "chosen": "x"}\n')
    # in-process: the exit code and the one line are under test, not the process
    from .conftest import cli_exit_2

    cli_exit_2(["preference", "--config", TARGETS / "pref_healthy" / "objdebug.toml", "--set",
                f"data.preference='{data}'"], "missing field 'rejected'")


def test_logp_cotangent_is_the_derivative_of_the_host_log_probs():
    """The preference gradient's cotangent (session.logp_cotangent) against central finite
    differences of sequence_logps_host, and its probe column sum_v g * x."""
    from objdebug.stages.preference.session import logp_cotangent, sequence_logps_host

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, 7))
    y = rng.integers(0, 7, (2, 5)).astype(np.int32)
    y[0, :2] = -100
    weight = np.array([1.5, -0.5])
    g, probe = logp_cotangent(x.astype(np.float32), y, -100, weight)
    eps = 1e-5
    for b, t, v in [(0, 3, 2), (1, 0, 6), (0, 1, 4), (1, 4, 0)]:
        hi, lo = x.copy(), x.copy()
        hi[b, t, v] += eps
        lo[b, t, v] -= eps
        num = weight[b] * (sequence_logps_host(hi, y, -100)[0][b] - sequence_logps_host(lo, y, -100)[0][b]) / (2 * eps)
        assert g[b, t, v] == pytest.approx(num, rel=1e-4, abs=1e-6)
    assert g[0, 1].tolist() == [0.0] * 7  # a masked position gets nothing
    np.testing.assert_allclose(probe, (g.astype(np.float64) * x.astype(np.float32)).sum(-1), rtol=1e-5, atol=1e-6)
