"""Mixed precision as trained (issue 14): `[run] amp_level`, `amp_objective`, `loss_scale`.

The demo model and checkpoint at O2 (fixtures/targets/demo_o2*): the reference masked CE passes
OBJ514/OBJ515; a hand-written softmax (exp / sum, no max subtraction) with the objective converted
too fails OBJ514 and names `exp_logits`. The float32 loss is checked against a numpy float64
cross-entropy of the float32 twin's logits.
"""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from objdebug.core.config import load_config
from objdebug.core.errors import InputError
from objdebug.core.findings import Verdict
from objdebug.stages.stress.low_precision import LossScaleGradient, TrainedPrecision

from .conftest import TARGETS, cli_exit_2
from .test_stress import Target


# --------------------------------------------------------------------------- config (no MindSpore)
@pytest.mark.parametrize("key, value, needle", [
    ("run.amp_level", "O4", "run.amp_level"),
    ("run.amp_dtype", "float8", "run.amp_dtype"),
    ("run.amp_objective", "yes", "run.amp_objective"),
    ("run.loss_scale", 0, "run.loss_scale"),
    ("run.loss_scale", float("inf"), "run.loss_scale"),
])
def test_bad_precision_keys_are_input_errors(key, value, needle):
    with pytest.raises(InputError, match=needle):
        load_config(TARGETS / "demo_o2" / "objdebug.toml", overrides={key: value})


def test_precision_keys_appear_in_the_report_config_only_when_set():
    plain = load_config(demo=True).to_dict()["run"]
    assert not {"amp_level", "amp_dtype", "amp_objective", "loss_scale"} & set(plain)
    o2 = load_config(TARGETS / "demo_o2" / "objdebug.toml").to_dict()["run"]
    assert o2["amp_level"] == "O2" and "amp_objective" not in o2 and o2["loss_scale"] == 1024.0


def test_checks_skip_at_o0():
    ctx = SimpleNamespace(config=load_config(demo=True))
    assert "O0" in TrainedPrecision().skip_reason(ctx)
    assert "loss_scale" in LossScaleGradient().skip_reason(ctx)


# --------------------------------------------------------------------------- localization (PyNative)
def test_first_nonfinite_names_the_overflowing_intermediate():
    import mindspore as ms

    from fixtures.amp_objectives import HandSoftmaxCrossEntropy
    from objdebug.engine import precision, runtime

    runtime.setup("CPU", "graph", 0)
    logits = ms.Tensor(np.array([[20.0, 0.0, 1.0], [1.0, 2.0, 3.0]], np.float32))
    labels = ms.Tensor(np.array([0, 2], np.int32))
    hit = precision.first_nonfinite(HandSoftmaxCrossEntropy(cast_to="float16"), logits, labels)
    assert hit["name"] == "exp_logits" and hit["dtype"] == "float16" and hit["inf"] == 1
    assert hit["source"] == "exp_logits = ops.exp(x)" and hit["file"].endswith("amp_objectives.py")
    assert "HandSoftmaxCrossEntropy.construct" in precision.where_text(hit)
    assert precision.first_nonfinite(HandSoftmaxCrossEntropy(), logits, labels) is None  # float32: finite
    assert ms.get_context("mode") == ms.GRAPH_MODE  # the replay restores the mode


# --------------------------------------------------------------------------- the demo at O2
@pytest.fixture(scope="module")
def demo_o2():
    return Target("demo_o2")


def test_demo_o2_safe_objective_matches_float32(demo_o2):
    res = demo_o2.run("trained-precision")
    assert res.error is None, res.error
    (f,) = res.findings
    assert f.code == "OBJ514" and f.verdict == Verdict.PASS, f.message
    v = res.value
    assert v["precision"] == "O2 (float16)" and v["objective_converted"] is False
    assert math.isfinite(v["loss"]) and v["rel_diff"] < 1e-2 and v["logits"]["nonfinite"] == 0
    # reference (not a verdict): the float32 twin's loss is the float64 masked CE of its logits
    import mindspore as ms

    from objdebug.stages.stress.low_precision import _float32_target, _precision_batch

    ids, labels = _precision_batch(demo_o2.ctx)
    logits = _float32_target(demo_o2.ctx).model(ms.Tensor(ids)).asnumpy().astype(np.float64)
    x = logits.reshape(-1, logits.shape[-1])
    y = labels.reshape(-1)
    keep = y != -100
    logp = x - x.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    ref = -logp[np.arange(len(y)), np.where(keep, y, 0)][keep].mean()
    assert v["fp32_loss"] == pytest.approx(ref, rel=1e-4, abs=1e-6)


@pytest.mark.slow
def test_o2_loss_scale_unscales_to_the_float32_gradient():
    """OBJ515 on a tiny random demo-architecture model (fast; the demo's own run is the slow test
    below). No checkpoint: the float32 twin must copy the parameters, not draw a second init."""
    t = Target("stress_healthy", overrides={"run.amp_level": "O2", "run.loss_scale": 1024.0,
                                            "model.factory": "objdebug.demo.model:build_model"})
    res = t.run("loss-scale-gradient")
    assert res.error is None, res.error
    (f,) = res.findings
    assert f.code == "OBJ515" and f.verdict == Verdict.PASS, f.message
    v = res.value
    assert v["loss_scale"] == 1024.0 and v["nonfinite_params"] == 0 and v["n_params"] > 0
    assert v["scaled_loss"] == pytest.approx(1024.0 * v["fp32_loss"], rel=2e-2)  # the loss the gradient sees
    assert v["rel_diff"] < 5e-2 and v["cosine"] > 0.99


@pytest.mark.slow
def test_demo_o2_loss_scale_unscales_to_the_float32_gradient(demo_o2):
    res = demo_o2.run("loss-scale-gradient")
    assert res.error is None, res.error
    (f,) = res.findings
    assert f.code == "OBJ515" and f.verdict == Verdict.PASS, f.message
    v = res.value
    assert v["loss_scale"] == 1024.0 and v["nonfinite_params"] == 0
    assert v["scaled_loss"] == pytest.approx(1024.0 * v["fp32_loss"], rel=2e-2)  # the loss the gradient sees
    assert v["rel_diff"] < 5e-2 and v["cosine"] > 0.99


def test_demo_o2_hand_written_fp16_softmax_fails_naming_the_intermediate():
    t = Target("demo_o2_fp16_softmax")
    res = t.run("trained-precision")
    assert res.error is None, res.error
    (f,) = res.findings
    assert f.code == "OBJ514" and f.verdict == Verdict.FAIL
    v = res.value
    assert not math.isfinite(v["loss"]) and math.isfinite(v["fp32_loss"])
    assert v["where"] == "objective" and v["logits"]["nonfinite"] == 0
    assert v["first_nonfinite"]["name"] == "exp_logits"
    for needle in ("where float32 is finite", "objective's path", "`exp_logits` (float16",
                   "amp_objectives.py:", "HandSoftmaxCrossEntropy.construct"):
        assert needle in f.message, f.message


@pytest.mark.slow
def test_demo_o2_hand_written_fp16_softmax_gradient_is_nan():
    res = Target("demo_o2_fp16_softmax").run("loss-scale-gradient")
    (f,) = res.findings
    assert f.verdict == Verdict.FAIL and res.value["nonfinite_params"] == res.value["n_params"]


# --------------------------------------------------------------------------- a level that cannot run
def test_amp_level_the_model_cannot_run_is_exit_2():
    """The Llama fixture keeps float32 RoPE tables: under O2 MindSpore 2.10 refuses its MatMul."""
    cli_exit_2(["run", "--config", TARGETS / "llama_ce" / "objdebug.toml", "--stages", "align",
                "--set", 'run.amp_level="O2"', "-q"],
               "For 'run.amp_level'", "O2 (float16)", "model.py:", "input type must be same")
