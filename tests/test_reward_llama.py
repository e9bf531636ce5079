"""The reward form (`[objective] call = "reward"`, OBJ850-OBJ856) on the Llama fixture: a scalar
reward head on TinyLlama (fixtures/llama/reward.py, llama_reward.ckpt): the healthy Bradley-Terry
and MSE losses pass ci-gate, each reward bug class's twin fails with a code the healthy one passes.

The model's compiles are shared as in tests/test_reward.py (whose helpers serve here): the
loss-only twins (swapped, dead margin, MSE, detached MSE) run on the healthy target's model,
engine and rewards; the reading twins (reward at padding, pad == eos) are models of their own.
Every Llama compile is costly on the shared cores, so all but the fixtures' strict load are `slow`.
"""

from __future__ import annotations

import numpy as np
import pytest

from objdebug.core.config import load_config
from objdebug.core.findings import Verdict
from objdebug.engine.target import load_target
from objdebug.stages.policy import reward as R
from objdebug.stages.policy.reward_session import session

from .test_reward import (ROOT, TARGETS, assert_evaluate_is_bradley_terry, assert_healthy_bradley_terry,
                          loss_twin, make_ctx, run, verdicts)

FIXTURES = sorted(p.name for p in TARGETS.glob("reward_llama_*"))
SLOW = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def scratch_cwd(tmp_path_factory):
    import os

    old = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("reward-llama"))  # MindSpore may drop rank_0/ here
    yield
    os.chdir(old)


def test_every_llama_reward_fixture_loads_its_checkpoint_strictly():
    """The Llama reward fixtures name the Llama reward model and its checkpoint; it loads strictly
    (every backbone weight of llama.ckpt and the fitted head, nothing missing or left over). No compile."""
    assert {"reward_llama_bt", "reward_llama_bt_padding", "reward_llama_bt_swapped",
            "reward_llama_bt_dead_margin", "reward_llama_eos_ids", "reward_llama_eos_mask",
            "reward_llama_mse", "reward_llama_mse_detached"} <= set(FIXTURES)
    cfgs = [load_config(TARGETS / name / "objdebug.toml") for name in FIXTURES]
    assert {c.model.factory for c in cfgs} == {"fixtures.llama.reward:build_llama_reward"}
    assert all(c.objective.call == "reward" for c in cfgs)
    target = load_target(cfgs[FIXTURES.index("reward_llama_bt")])
    names = {p.name for p in target.model.get_parameters()}
    assert {"head.weight", "head.bias", "embed.embedding_table", "norm.weight"} <= names
    # the backbone is llama.ckpt's, untouched
    import mindspore as ms

    llama = ms.load_checkpoint(str(ROOT / "fixtures" / "llama" / "llama.ckpt"))
    own = {p.name: p for p in target.model.get_parameters()}
    for name in ("embed.embedding_table", "layers.4.mlp.w2.weight"):
        np.testing.assert_array_equal(own[name].data.asnumpy(), llama[name].asnumpy())


# --------------------------------------------------------------------------- healthy pairwise
@pytest.fixture(scope="module")
def healthy():
    ctx = make_ctx("reward_llama_bt")
    return ctx, run(ctx, *R.checks())


@SLOW
def test_healthy_bradley_terry_on_llama_passes_the_gate(healthy):
    ctx, findings = healthy
    assert_healthy_bradley_terry(ctx, findings)


@SLOW
def test_llama_rewards_and_loss_match_the_references(healthy):
    """Rewards: each row alone at its own length (no padding), its last position; the loss and its
    derivatives: numpy float64 Bradley-Terry (references)."""
    ctx, _ = healthy
    s = session(ctx)
    rc, rr = s.real_inputs()
    for k in (0, 11, 40):
        sample = s.chosen().samples[k]
        ids = np.array([sample.prompt + sample.response] * ctx.engine.batch_size, np.int32)
        assert rc[k] == pytest.approx(float(s.output(ids)[0, -1]), abs=1e-4)
    assert_evaluate_is_bradley_terry(s, rc, rr, ctx.engine.batch_size)


# --------------------------------------------------------------------------- loss-only twins
@SLOW
@pytest.mark.parametrize("name,checks,expected", [
    ("reward_llama_bt_swapped", ("RewardSwap", "RewardStep", "RewardZeroPoint"),
     {"OBJ851": Verdict.FAIL, "OBJ852": Verdict.FAIL, "OBJ850": Verdict.PASS}),
    ("reward_llama_bt_dead_margin", ("RewardSettings", "RewardZeroPoint"),
     {"OBJ856": Verdict.FAIL, "OBJ850": Verdict.FAIL}),
])
def test_llama_pairwise_loss_twins_fail(healthy, name, checks, expected):
    ctx = loss_twin(healthy[0], name)
    f = run(ctx, *[getattr(R, c)() for c in checks])
    assert verdicts(f) == expected, {c: x.message for c, x in f.items()}
    for code, verdict in expected.items():  # a code the healthy twin passes
        if verdict is Verdict.FAIL:
            assert healthy[1][code].verdict is Verdict.PASS


@pytest.fixture(scope="module")
def mse(healthy):
    ctx = loss_twin(healthy[0], "reward_llama_mse")
    return ctx, run(ctx, R.RewardZeroPoint(), R.RewardSwap(), R.RewardStep(), R.RewardReading(),
                    R.RewardScores(), R.RewardSettings())


@SLOW
def test_llama_mse_passes_and_its_detached_twin_fails(mse):
    ctx, f = mse
    assert verdicts(f) == {"OBJ850": Verdict.PASS, "OBJ851": Verdict.SKIP, "OBJ852": Verdict.PASS,
                           "OBJ853": Verdict.PASS, "OBJ854": Verdict.PASS, "OBJ855": Verdict.PASS,
                           "OBJ856": Verdict.SKIP}, {c: x.message for c, x in f.items()}
    r, y = session(ctx).real_inputs()
    assert f["OBJ855"].value == pytest.approx(np.corrcoef(r, y)[0, 1], abs=1e-9)  # numpy reference
    twin = run(loss_twin(ctx, "reward_llama_mse_detached"), R.RewardStep(), R.RewardZeroPoint())
    assert verdicts(twin) == {"OBJ852": Verdict.FAIL, "OBJ850": Verdict.PASS}
    assert "no gradient reaches the reward model" in twin["OBJ852"].message


# --------------------------------------------------------------------------- reading twins
@pytest.fixture(scope="module")
def few_pairs(tmp_path_factory) -> dict:
    """The demo's first 12 pairs: the reading twins (a model each) need no more to show the bug."""
    path = tmp_path_factory.mktemp("reward-llama-pairs") / "pairs.jsonl"
    lines = (ROOT / "objdebug" / "demo" / "preference.jsonl").read_text().splitlines()[:12]
    path.write_text("\n".join(lines) + "\n")
    return {"data.preference": str(path)}


@SLOW
@pytest.mark.parametrize("name,expected", [
    ("reward_llama_bt_padding", {"OBJ853": Verdict.FAIL, "OBJ854": Verdict.PASS}),
    ("reward_llama_eos_ids", {"OBJ853": Verdict.PASS, "OBJ854": Verdict.FAIL}),
    ("reward_llama_eos_mask", {"OBJ853": Verdict.PASS, "OBJ854": Verdict.PASS}),
])
def test_llama_reward_reading(name, expected, few_pairs, healthy):
    f = run(make_ctx(name, few_pairs), R.RewardReading())
    assert verdicts(f) == expected, {c: x.message for c, x in f.items()}
    for code, verdict in expected.items():
        if verdict is Verdict.FAIL:
            assert healthy[1][code].verdict is Verdict.PASS
