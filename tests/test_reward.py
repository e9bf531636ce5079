"""The reward form (`[objective] call = "reward"`, OBJ850-OBJ856) on the demo LM with a scalar
reward head (fixtures/reward_models.py): a healthy twin and a broken one per bug class.

Compiles are shared where the measurement allows it: the loss-only twins (swapped, dead margin,
detached MSE) reuse the healthy target's rewards (same model, checkpoint and rows: only the loss
differs), so the checks that read no new rewards compile the loss's small graph alone. Numbers are
checked against numpy float64 references of each healthy loss (labelled as references)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # fixtures.reward_* are referenced by the fixture configs
    sys.path.insert(0, str(ROOT))

from objdebug.core.config import load_config  # noqa: E402
from objdebug.core.errors import InputError  # noqa: E402
from objdebug.core.findings import Verdict  # noqa: E402
from objdebug.engine import runtime  # noqa: E402
from objdebug.engine.core import Engine  # noqa: E402
from objdebug.engine.target import load_target  # noqa: E402
from objdebug.pipeline.context import Context  # noqa: E402
from objdebug.pipeline.contract import check_target  # noqa: E402
from objdebug.pipeline.profile import load_profile  # noqa: E402
from objdebug.pipeline.runner import run_check  # noqa: E402
from objdebug.stages.policy import reward as R  # noqa: E402
from objdebug.stages.policy.reward_session import PAIRWISE, REGRESSION, loss_form, session  # noqa: E402

TARGETS = ROOT / "fixtures" / "targets"
PROFILE = load_profile("ci-gate")
TH = PROFILE.section("reward")
ALL = [f"OBJ85{i}" for i in range(7)]


@pytest.fixture(scope="module", autouse=True)
def scratch_cwd():
    old = os.getcwd()
    os.chdir(tempfile.mkdtemp(prefix="objdebug-test-reward-"))  # MindSpore may drop rank_0/ here
    yield
    os.chdir(old)


def make_ctx(name: str, overrides: dict | None = None) -> Context:
    cfg = load_config(TARGETS / name / "objdebug.toml", overrides=overrides)
    runtime.setup(cfg.run.device, cfg.run.mode, cfg.run.seed)
    target = load_target(cfg)
    engine = Engine(target, batch_size=PROFILE.section("engine")["batch_size"])
    check_target(target, engine)  # the contract probe: the model's output kind, as a run records it
    engine.stage = "policy"
    return Context(config=cfg, target=target, engine=engine, profile=PROFILE)


def loss_twin(healthy: Context, name: str, overrides: dict | None = None) -> Context:
    """A loss-only twin on the healthy target's model and engine (same model, checkpoint and
    rows: only the loss differs), so the shared forward and VJP graphs serve it; its loss graph
    has a name of its own, and the rows' rewards it reads come from the healthy session."""
    from dataclasses import replace

    from objdebug.engine.target import _call_factory

    cfg = load_config(TARGETS / name / "objdebug.toml", overrides=overrides)
    loss = _call_factory(cfg.objective.factory, cfg.objective.kwargs, "objective", cfg.base_dir)
    loss.set_train(False)
    target = replace(healthy.target, config=cfg, objective=loss)
    ctx = Context(config=cfg, target=target, engine=healthy.engine, profile=PROFILE)
    h = session(healthy)
    s = session(ctx)
    s.graph = f"reward.objective.{name}.{cfg.objective.factory}"
    if s.form == h.form:
        s.cache["real"], s.cache["scored"] = h.real_inputs(), h.score_rewards()
    return ctx


def run(ctx: Context, *checks) -> dict:
    out = {}
    for check in checks:
        res = run_check(check, ctx, TH)
        assert res.error is None, res.error
        out.update({f.code: f for f in res.findings})
    return out


def verdicts(findings: dict) -> dict:
    return {c: f.verdict for c, f in findings.items()}


def _softplus(x):
    return np.logaddexp(0.0, x)


def ref_bt(c, r, margin):
    """numpy float64 reference: mean -log sigmoid(c - r - margin) and its derivatives."""
    d = np.asarray(c, np.float64) - np.asarray(r, np.float64) - margin
    sig = 1.0 / (1.0 + np.exp(d))   # sigmoid(-d)
    return float(np.mean(_softplus(-d))), -sig / len(d), sig / len(d)


# --------------------------------------------------------------------------- healthy pairwise
@pytest.fixture(scope="module")
def healthy():
    ctx = make_ctx("reward_bt")
    return ctx, run(ctx, *R.checks())


def assert_healthy_bradley_terry(ctx, findings):
    """Every reward check PASSes; OBJ850 is log(1 + e^0.5) (the margin 0.5's zero point); the
    reward read per token; no graph of the reward checks holds the model (the shared forward and
    VJP serve)."""
    assert set(findings) == set(ALL)
    bad = {c: (f.verdict, f.message) for c, f in findings.items() if f.verdict is not Verdict.PASS}
    assert not bad
    assert findings["OBJ850"].value == pytest.approx(math.log1p(math.exp(0.5)), rel=1e-6)
    assert ctx.target.info["contract"]["reward_output"] == "token"
    holding = {r.graph for r in ctx.engine.compiles.records if r.holds_model}
    assert holding == {"model.forward", "model.vjp"}


def test_healthy_bradley_terry_passes_every_check(healthy):
    ctx, findings = healthy
    assert_healthy_bradley_terry(ctx, findings)
    assert "reward.objective" in {r.graph for r in ctx.engine.compiles.records}


def test_rewards_are_read_at_the_last_real_token(healthy):
    """Reference: each row alone, at exactly its own length (no padding), its last position."""
    ctx, _ = healthy
    s = session(ctx)
    rc, _ = s.real_inputs()
    for k in (0, 5, 17, 40):
        sample = s.chosen().samples[k]
        ids = np.array([sample.prompt + sample.response] * ctx.engine.batch_size, np.int32)
        alone = s.output(ids)[0, -1]
        assert rc[k] == pytest.approx(float(alone), abs=1e-4)


def assert_evaluate_is_bradley_terry(s, rc, rr, b: int):
    """The session's objective on the rewards (rc, rr), batch by batch (a short batch filled with
    its first row), against numpy float64 Bradley-Terry at margin 0.5: each loss and the
    derivatives by each reward."""
    out = s.evaluate(rc, rr)
    for k, (start, end) in enumerate(s.chunks(len(rc))):
        rows = list(range(start, end)) + [start] * (b - (end - start))
        loss, dc, dr = ref_bt(rc[rows], rr[rows], 0.5)
        assert out["losses"][k] == pytest.approx(loss, rel=1e-5)
        np.testing.assert_allclose(out["da"][start:end], dc[:end - start], rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(out["db"][start:end], dr[:end - start], rtol=1e-4, atol=1e-7)


def test_loss_and_gradient_match_numpy(healthy):
    ctx, _ = healthy
    s = session(ctx)
    rc, rr = s.real_inputs()
    assert_evaluate_is_bradley_terry(s, rc, rr, ctx.engine.batch_size)
    # the swap point: Bradley-Terry's mirror, swapped - preferred = log(1+e^(1+m)) - log(1+e^(m-1))
    swap = run(ctx, R.RewardSwap())["OBJ851"]
    assert "swapped - preferred = +1.227" in swap.message
    assert math.log1p(math.exp(1.5)) - math.log1p(math.exp(-0.5)) == pytest.approx(1.2274, abs=1e-4)


# --------------------------------------------------------------------------- loss-only twins
def test_swapped_chosen_rejected_fails(healthy):
    ctx = loss_twin(healthy[0], "reward_bt_swapped")
    f = run(ctx, R.RewardSwap(), R.RewardStep(), R.RewardZeroPoint())
    assert verdicts(f) == {"OBJ851": Verdict.FAIL, "OBJ852": Verdict.FAIL, "OBJ850": Verdict.PASS}
    assert "exchanged inside the loss" in f["OBJ851"].message


def test_dead_margin_fails(healthy):
    ctx = loss_twin(healthy[0], "reward_bt_dead_margin")
    f = run(ctx, R.RewardSettings(), R.RewardZeroPoint())
    assert verdicts(f) == {"OBJ856": Verdict.FAIL, "OBJ850": Verdict.FAIL}
    assert f["OBJ850"].value == pytest.approx(math.log(2.0), rel=1e-6)
    assert "margin" in f["OBJ856"].message


def test_a_loss_returning_a_tuple_is_read_by_its_first_element(healthy):
    ctx = loss_twin(healthy[0], "reward_bt",
                    {"objective.factory": "fixtures.reward_losses:TupleBradleyTerryLoss"})
    f = run(ctx, R.RewardZeroPoint(), R.RewardSwap(), R.RewardSettings())
    assert all(x.verdict is Verdict.PASS for x in f.values()), {c: x.message for c, x in f.items()}
    assert f["OBJ850"].value == pytest.approx(math.log1p(math.exp(0.5)), rel=1e-6)


# --------------------------------------------------------------------------- reading twins
@pytest.fixture(scope="module")
def few_pairs(tmp_path_factory) -> dict:
    """The demo's first 12 pairs: the reading twins (a model each) need no more to show the bug."""
    path = tmp_path_factory.mktemp("reward") / "pairs.jsonl"
    lines = (ROOT / "objdebug" / "demo" / "preference.jsonl").read_text().splitlines()[:12]
    path.write_text("\n".join(lines) + "\n")
    return {"data.preference": str(path)}


def test_reward_read_at_padding_fails(few_pairs):
    f = run(make_ctx("reward_bt_padding", few_pairs), R.RewardReading())
    assert verdicts(f) == {"OBJ853": Verdict.FAIL, "OBJ854": Verdict.PASS}
    assert "padding position" in f["OBJ853"].message


@pytest.mark.slow  # a model of its own: one more forward compile
def test_pooled_model_reads_the_healthy_rewards(healthy):
    """A [B] model that pools at the last non-pad id (pad != eos) gives the [B, T] model's rewards."""
    ctx = make_ctx("reward_bt_pooled")
    f = run(ctx, R.RewardReading())
    assert verdicts(f) == {"OBJ853": Verdict.PASS, "OBJ854": Verdict.PASS}
    assert ctx.target.info["contract"]["reward_output"] == "sequence"
    np.testing.assert_allclose(session(ctx).real_inputs()[0], session(healthy[0]).real_inputs()[0],
                               atol=1e-4)


@pytest.mark.parametrize("name,expected", [
    pytest.param("reward_eos_mask", Verdict.PASS, marks=pytest.mark.slow),  # a model of its own
    ("reward_eos_ids", Verdict.FAIL)])
def test_pad_equal_eos_last_token(name, expected, few_pairs):
    f = run(make_ctx(name, few_pairs), R.RewardReading())
    assert verdicts(f) == {"OBJ853": Verdict.PASS, "OBJ854": expected}


# --------------------------------------------------------------------------- regression (MSE)
@pytest.fixture(scope="module")
def mse(healthy):
    ctx = loss_twin(healthy[0], "reward_mse")
    return ctx, run(ctx, R.RewardZeroPoint(), R.RewardSwap(), R.RewardStep(), R.RewardScores())


def test_healthy_mse_passes(mse):
    ctx, f = mse
    assert verdicts(f) == {"OBJ850": Verdict.PASS, "OBJ851": Verdict.SKIP, "OBJ852": Verdict.PASS,
                           "OBJ855": Verdict.PASS}
    s = session(ctx)
    r, y = s.real_inputs()
    out = s.evaluate(r, y)
    b = ctx.engine.batch_size
    for k, (start, end) in enumerate(s.chunks(len(r))):  # numpy float64 reference
        rows = list(range(start, end)) + [start] * (b - (end - start))
        assert out["losses"][k] == pytest.approx(np.mean((r[rows] - y[rows]) ** 2), rel=1e-5)
        np.testing.assert_allclose(out["da"][start:end], (2 * (r[rows] - y[rows]) / b)[:end - start],
                                   rtol=1e-4)
    # OBJ855 measures the correlate stage's statistics: Pearson r of the rewards and the scores
    assert f["OBJ855"].value == pytest.approx(np.corrcoef(r, y)[0, 1], abs=1e-9)


def test_detached_mse_fails_the_step(mse):
    ctx = loss_twin(mse[0], "reward_mse_detached")
    f = run(ctx, R.RewardStep(), R.RewardZeroPoint())
    assert verdicts(f) == {"OBJ852": Verdict.FAIL, "OBJ850": Verdict.PASS}
    assert "no gradient reaches the reward model" in f["OBJ852"].message


# --------------------------------------------------------------------------- forms and bad input
class _Loss:
    def __init__(self, *names):
        self.names = names


def _cell(*names):
    ns: dict = {}
    exec(f"def construct(self, {', '.join(names)}):\n    pass", ns)
    return type("L", (), {"construct": ns["construct"]})()


@pytest.mark.parametrize("names,form,swap", [
    (("chosen_rewards", "rejected_rewards"), PAIRWISE, False),
    (("rejected_rewards", "chosen_rewards"), PAIRWISE, True),
    (("rewards_chosen", "rewards_rejected"), PAIRWISE, False),
    (("reject_reward", "chosen_reward"), PAIRWISE, True),       # OpenRLHF's names, reversed
    (("rewards", "scores"), REGRESSION, False),
    (("labels", "values"), REGRESSION, True),
])
def test_loss_form_from_parameter_names(names, form, swap):
    assert loss_form(_cell(*names), "m:f") == (form, swap)


@pytest.mark.parametrize("names", [("logits", "labels"), ("a", "b"), ("chosen_rewards",),
                                   ("chosen_rewards", "scores"), ("closed_rewards", "rewards"),
                                   ("chosen", "rejected", "margin")])
def test_unbound_loss_signature_is_input_error(names):
    with pytest.raises(InputError, match="construct"):
        loss_form(_cell(*names), "m:f", "cfg.toml")


def _config(tmp_path, text):
    p = tmp_path / "objdebug.toml"
    p.write_text(text)
    return p


BASE = ('[model]\nfactory = "m:f"\n[objective]\nfactory = "l:f"\ncall = "reward"\n'
        '[data]\npreference = "p.jsonl"\n')


@pytest.mark.parametrize("extra,match", [
    ('[reward]\nposition = "middle"\n', "reward.position"),
])
def test_bad_reward_config(tmp_path, extra, match):
    with pytest.raises(InputError, match=match):
        load_config(_config(tmp_path, BASE + extra))


def test_reward_config_needs_a_model_and_rows(tmp_path):
    with pytest.raises(InputError, match="a \\[model\\] is required"):
        load_config(_config(tmp_path, '[objective]\nfactory = "l:f"\ncall = "reward"\n[data]\nscores = "s.jsonl"\n'))
    with pytest.raises(InputError, match="preference.*or \\[data\\] scores"):
        load_config(_config(tmp_path, '[model]\nfactory = "m:f"\n[objective]\nfactory = "l:f"\ncall = "reward"\n'))
    with pytest.raises(InputError, match="only for \\[objective\\] call"):
        load_config(_config(tmp_path, '[objective]\nfactory = "l:f"\n[reward]\nposition = "last"\n'))
    cfg = load_config(_config(tmp_path, BASE))
    assert cfg.reward.position == "last"


@pytest.mark.slow
def test_cli_bad_loss_signature_is_exit_2_one_line():
    """A loss whose parameters name neither form: exit 2, one line naming the config file."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cfg = TARGETS / "reward_mse" / "objdebug.toml"
    p = subprocess.run([sys.executable, "-c", "from objdebug.cli import main; main()", "run", "--config",
                        str(cfg), "--stages", "policy", "--set",
                        "objective.factory=objdebug.losses:MaskedCrossEntropy"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 2, p.stderr
    errors = [line for line in (p.stdout + p.stderr).splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and str(cfg) in errors[0] and "(logits, labels)" in errors[0]
    assert "Traceback" not in p.stderr


def test_reward_output_shapes_at_the_contract():
    """[B] and [B, T] are a reward model's outputs; logits [B, T, V] or an int tensor are exit 2."""
    import mindspore as ms

    from objdebug.pipeline.contract import _check_rewards

    assert _check_rewards(ms.Tensor(np.zeros(4, np.float32)), 4, 16) == "sequence"
    assert _check_rewards(ms.Tensor(np.zeros((4, 16), np.float32)), 4, 16) == "token"
    for bad in (np.zeros((4, 16, 256), np.float32), np.zeros((4, 16), np.int32), np.zeros(3, np.float32)):
        with pytest.raises(InputError, match="a reward model must return float rewards"):
            _check_rewards(ms.Tensor(bad), 4, 16)


def test_the_reward_stage_runs_only_for_the_reward_call():
    from objdebug.api import resolve_stages
    from objdebug.pipeline.registry import stage_skip_reason

    demo = load_config(demo=True)
    prof = load_profile("default")
    assert "reward" not in demo.to_dict()
    cfg = load_config(TARGETS / "reward_bt" / "objdebug.toml")
    assert "policy" in resolve_stages(cfg, prof, None)
    assert stage_skip_reason(cfg, "policy") is None
    assert stage_skip_reason(cfg, "align").startswith('[objective] call = "reward"')


def test_each_call_plans_only_its_own_checks():
    """One stage serves three calls: a reward run plans the reward checks alone, a policy-gradient
    run the policy checks alone (`Check.applies`), so neither lists the other's as SKIP; run
    directly, a check of the other call leaves an empty result."""
    from types import SimpleNamespace

    from objdebug.pipeline.runner import _plan
    from objdebug.stages import policy as P
    from objdebug.stages import stage_checks

    reward_names = {c.name for c in R.checks()}
    policy_names = {c.name for c in P.checks()} - reward_names
    assert len(reward_names) == 6 and len(policy_names) == 11
    reward = load_config(TARGETS / "reward_bt" / "objdebug.toml")
    grpo = load_config(TARGETS / "policy_grpo" / "objdebug.toml")
    for cfg, names in ((reward, reward_names), (grpo, policy_names)):
        [(stage, skip, planned)] = _plan(cfg, PROFILE, ["policy"], stage_checks)
        assert (stage, skip) == ("policy", None)
        assert {c.name for c in planned} == names
    for check, cfg in ((P.ZeroPoint(), reward), (R.RewardZeroPoint(), grpo)):
        res = run_check(check, SimpleNamespace(config=cfg), TH)
        assert res.findings == [] and res.value == {}
    # the default rule is unchanged: a check of another [task] kind leaves no result either
    cls_check = type("C", (R.RewardZeroPoint,), {"kinds": ("classification",)})()
    assert not cls_check.applies(reward) and R.RewardZeroPoint().applies(reward)
