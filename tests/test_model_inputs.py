"""`[model] inputs / mask_dtype / output` and `[data] padding_side` (objdebug/engine/model_inputs.py).

Fast by construction: the contract and output tests use the fixture models
(fixtures/masked_models.py) at d_model 16, one layer, seeded random weights and no checkpoint
(`TINY`); the loss comparisons use demo.ckpt (a random model's loss hardly depends on what a token
attends to) without the contract probe, batch 4, and padding invariance one extra length. The
full-size runs through the CLI (align, grad, stress) are marked slow.
"""

import subprocess
import sys

import numpy as np
import pytest

from objdebug.core.config import INPUTS, load_config
from objdebug.engine import model_inputs as mi
from objdebug.engine import runtime
from objdebug.engine.data import Sample, pack, pack_for
from objdebug.core.errors import InputError
from objdebug.pipeline.runner import run_check  # the runner reviews verdicts (untrained-model notes)

from .conftest import ROOT, TARGETS, cli_exit_2

TINY = {"model.kwargs": {"vocab_size": 256, "d_model": 16, "n_layers": 1, "n_heads": 2},
        "model.checkpoint": ""}
STRESS_PROFILE = TARGETS / "stress_common" / "profile.toml"


def _cfg(name: str, tiny: bool = True, **overrides):
    return load_config(TARGETS / name / "objdebug.toml", overrides={**(TINY if tiny else {}), **overrides})


def _engine(cfg, probe: bool = True):
    from objdebug.pipeline.contract import check_target
    from objdebug.engine.core import Engine
    from objdebug.engine.target import load_target

    runtime.setup(cfg.run.device, cfg.run.mode, cfg.run.seed)
    engine = Engine(load_target(cfg), batch_size=4)
    if probe:
        with runtime.scratch_dir():
            check_target(engine.target, engine)
    return engine


def _samples():
    rng = np.random.default_rng(0)
    return [Sample(id=str(i), prompt=[int(t) for t in rng.integers(1, 256, p)],
                   response=[int(t) for t in rng.integers(1, 256, r)])
            for i, (p, r) in enumerate([(3, 9), (5, 20), (1, 4), (8, 14)])]


# --------------------------------------------------------------------------- host side, numpy
def test_left_padding_keeps_labels_on_their_tokens():
    cfg = _cfg("left_padded")
    samples = _samples()
    right_ids, right_labels = pack(samples, 32, 0, -100, True)
    ids, labels = pack_for(cfg, samples, 32)
    for i, s in enumerate(samples):
        n = s.length
        assert np.all(mi.is_padding(ids[i, :32 - n])) and not np.any(mi.is_padding(ids[i, 32 - n:]))
        assert np.array_equal(mi.reference_inputs(ids)["input_ids"][i, 32 - n:], right_ids[i, :n])
        assert np.array_equal(labels[i, 32 - n:], right_labels[i, :n])
        assert np.all(labels[i, :32 - n] == -100)


def test_default_packing_is_unchanged():
    cfg = load_config(TARGETS / "tiny" / "objdebug.toml")
    samples = _samples()
    for got, want in zip(pack_for(cfg, samples, 32), pack(samples, 32, cfg.data.pad_id,
                                                             cfg.data.label_pad_id, cfg.data.shift)):
        assert np.array_equal(got, want)
    assert not mi.configured(cfg)
    d = cfg.to_dict()  # reports keep their shape: new keys appear only when set
    assert "padding_side" not in d["data"] and "inputs" not in (d.get("model") or {})


def test_reference_positions_count_from_the_first_real_token():
    real = np.array([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0]], bool)
    ids = mi.mark_padding(np.full((3, 5), 7, np.int32), real)
    ref = mi.reference_inputs(ids)
    assert ref["position_ids"].tolist() == [[0, 1, 2, 0, 0], [0, 0, 0, 1, 2], [0, 0, 0, 0, 0]]
    assert ref["attention_mask"].tolist() == real.astype(int).tolist()
    assert np.all(ref["input_ids"] == 7)
    # the out-of-range ids the stress stage probes (-1, V) are tokens, never padding
    assert not np.any(mi.is_padding(np.array([-1, 256, -100])))


@pytest.mark.parametrize("key,value,needle", [
    ("model.inputs", ["attention_mask"], "with 'input_ids'"),
    ("model.inputs", ["input_ids", "token_type_ids"], "For 'model.inputs'"),
    ("model.mask_dtype", "int8", "For 'model.mask_dtype'"),
    ("model.output", -1, "For 'model.output'"),
    ("data.padding_side", "middle", "For 'data.padding_side'"),
])
def test_bad_keys_are_one_line_errors(key, value, needle):
    with pytest.raises(InputError, match=needle.replace("(", r"\(")):
        load_config(TARGETS / "masked_model" / "objdebug.toml", overrides={key: value})


# --------------------------------------------------------------------------- in graph
@pytest.mark.parametrize("side,dtype", [("right", "int32"), ("left", "bool")])
def test_model_call_builds_mask_and_positions_like_numpy(side, dtype):
    import mindspore as ms

    from fixtures.masked_models import EchoInputs
    from objdebug.engine.cells import ModelCall

    cfg = _cfg("left_padded", **{"data.padding_side": side, "model.mask_dtype": dtype})
    runtime.setup("CPU", "graph", 0)
    ids, _ = pack_for(cfg, _samples(), 32)
    with runtime.scratch_dir():
        cell = ModelCall(EchoInputs(), mi.model_inputs(cfg), dtype, mi.RAW)
        got = cell(ms.Tensor(ids)).asnumpy()
    ref = mi.reference_inputs(ids)
    for k, name in enumerate(INPUTS):
        assert np.array_equal(got[k], ref[name].astype(np.float32)), name


@pytest.mark.slow
def test_left_and_right_padding_give_the_same_per_sample_losses():
    samples = _samples()
    right = _engine(_cfg("masked_model", tiny=False, **{"model.output": 0}), probe=False).evaluate(samples)
    left = _engine(_cfg("left_padded", tiny=False), probe=False).evaluate(samples)
    assert np.all(np.isfinite(right)) and right.shape == (4, 1)
    np.testing.assert_allclose(left, right, rtol=1e-5, atol=0)  # float32: longer softmax rows
    # the mask-ignoring model on the left: its real tokens attend to the padding
    ignoring = _engine(_cfg("masked_model_ignores_mask", tiny=False, **{"model.output": 0,
                                                                       "data.padding_side": "left"}),
                       probe=False).evaluate(samples)
    assert np.max(np.abs(ignoring - right) / right) > 1e-2


# --------------------------------------------------------------------------- output
def test_output_default_index_and_key_select_the_logits():
    import mindspore as ms

    from fixtures.masked_models import dict_output_model
    from objdebug.engine.cells import ModelCall

    engine = _engine(_cfg("masked_model"))  # no `output`: the tuple's first element, with a note
    notes = engine.target.describe()["notes"]
    assert len(notes) == 1 and "tuple of 2" in notes[0] and "first element" in notes[0]
    ids, _ = pack_for(engine.target.config, _samples(), 32)
    first = engine.logits(ids)
    inner = mi.unwrap(engine.target.model)
    by_index = ModelCall(inner, mi.model_inputs(engine.target.config), "int32", 0)
    as_dict = dict_output_model(256, 16, 1, 2)
    for a, b in zip(as_dict.get_parameters(), inner.get_parameters()):
        a.set_data(b.value())
    by_key = ModelCall(as_dict, mi.model_inputs(engine.target.config), "float32", "logits")
    with runtime.scratch_dir():
        np.testing.assert_array_equal(by_index(ms.Tensor(ids)).asnumpy(), first)
        np.testing.assert_array_equal(by_key(ms.Tensor(ids)).asnumpy(), first)


@pytest.mark.parametrize("overrides,needle", [
    ({"model.output": 2}, "For 'model.output', the index must be in [0, 2)"),
    ({"model.output": "logits"}, "For 'model.output', the model's result must have a key or "
                                 "attribute 'logits'"),
    ({"model.factory": "fixtures.masked_models:dict_output_model", "model.output": "logit"},
     "For 'model.output', the key must be one of ['hidden', 'logits'], but got 'logit'"),
    ({"model.factory": "fixtures.masked_models:dict_output_model"},
     "set [model] output to the key of the logits"),
])
def test_invalid_output_exits_2_in_one_line(overrides, needle):
    args = ["run", "--config", TARGETS / "masked_model" / "objdebug.toml", "--stages", "align", "-q"]
    for k, v in {**TINY, **overrides}.items():
        if isinstance(v, dict):
            v = "{" + ", ".join(f"{kk} = {vv}" for kk, vv in v.items()) + "}"
        elif isinstance(v, str):
            v = f"'{v}'"
        args += ["--set", f"{k}={v}"]
    cli_exit_2(args, needle)


# --------------------------------------------------------------------------- padding invariance
def _padding_invariance(name: str):
    from objdebug.pipeline.context import Context
    from objdebug.pipeline.profile import load_profile
    from objdebug.stages import stress

    engine = _engine(_cfg(name, tiny=False, **{"model.output": 0}), probe=False)
    engine.stage = "stress"
    profile = load_profile(str(STRESS_PROFILE))
    profile.data["stress"]["pad_extra"] = [10]  # one extra length: two gradient graphs
    th = profile.section("stress")
    ctx = Context(config=engine.target.config, target=engine.target, engine=engine, profile=profile)
    check = next(c for c in stress.checks() if c.name == "padding-invariance")
    with runtime.scratch_dir():
        return run_check(check, ctx, th)


def test_padding_invariance_passes_a_model_that_honours_its_mask():
    res = _padding_invariance("masked_model")
    assert res.findings[0].verdict.value == "PASS", res.findings[0].message
    assert res.value["max_mask_loss_rel_diff"] <= 1e-6 and res.value["max_mask_grad_rel_diff"] <= 1e-6


def test_padding_invariance_fails_a_model_that_ignores_its_mask():
    res = _padding_invariance("masked_model_ignores_mask")
    f = res.findings[0]
    assert f.code == "OBJ504" and f.verdict.value == "FAIL"
    assert "ignores its attention mask" in f.message
    # right padding alone cannot show it on a causal model: only the masked-content rows move
    assert res.value["max_loss_rel_diff"] <= 1e-6
    assert res.value["max_mask_loss_rel_diff"] > 1e-3


# --------------------------------------------------------------------------- full size (slow)
def _cli(*args):
    return subprocess.run([sys.executable, "-m", "objdebug.cli", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["masked_model", "left_padded"])
def test_full_size_targets_pass_align_and_grad(name):
    r = _cli("run", "--config", TARGETS / name / "objdebug.toml", "--stages", "align,grad")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_full_size_mask_ignoring_model_fails_padding_invariance():
    r = _cli("run", "--config", TARGETS / "masked_model_ignores_mask" / "objdebug.toml", "--stages",
             "stress", "--profile", STRESS_PROFILE, "--select", "OBJ504")
    assert r.returncode == 1 and "OBJ504" in r.stdout and "ignores its attention mask" in r.stdout, r.stdout
