"""Tests of the demo target: model, checkpoint, corpus/rater, data files and config."""
import json
import os
import tempfile

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

from objdebug.demo import corpus, rater
from objdebug.demo.model import build_model

DEMO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "objdebug", "demo")


@pytest.fixture(scope="module", autouse=True)
def graph_mode():
    old = os.getcwd()
    os.chdir(tempfile.mkdtemp(prefix="objdebug-test-"))
    from objdebug.engine import runtime

    runtime.setup("CPU", "graph", 0)  # not ms.set_device: MindSpore 2.7 refuses it once a kernel ran
    yield
    os.chdir(old)


@pytest.fixture(scope="module")
def model():
    net = build_model(vocab_size=256, d_model=64, n_layers=2, n_heads=4)
    not_loaded, unexpected = ms.load_param_into_net(
        net, ms.load_checkpoint(os.path.join(DEMO, "demo.ckpt")), strict_load=True)
    assert not_loaded == [] and unexpected == [], (not_loaded, unexpected)
    net.set_train(False)
    return net


def test_parameter_names_group_by_layer(model):
    names = [p.name for p in model.get_parameters()]
    for expected in ("embed.weight", "blocks.0.attn.qkv.weight", "blocks.1.mlp.fc1.weight",
                     "lm_head.weight", "norm_f.gamma"):
        assert expected in names
    assert os.path.getsize(os.path.join(DEMO, "demo.ckpt")) < 2 * 1024 * 1024


@pytest.mark.parametrize("t", [16, 300])
def test_output_shape_and_finite(model, t):
    ids = np.random.default_rng(t).integers(1, 256, size=(2, t)).astype(np.int32)
    out = model(Tensor(ids))
    assert out.shape == (2, t, 256)
    assert out.dtype == ms.float32
    assert np.all(np.isfinite(out.asnumpy()))


def test_causal(model):
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 256, size=(1, 16)).astype(np.int32)
    changed = ids.copy()
    changed[0, 10:] = (changed[0, 10:] + 17) % 255 + 1
    a = model(Tensor(ids)).asnumpy()
    b = model(Tensor(changed)).asnumpy()
    np.testing.assert_allclose(a[0, :10], b[0, :10], rtol=1e-5, atol=1e-5)
    assert not np.allclose(a[0, 10:], b[0, 10:])


def test_model_learned_the_rules(model):
    """The trained model prefers the good response of a held-out prompt to a random splice."""
    from objdebug.losses import MaskedCrossEntropy
    row = json.loads(open(os.path.join(DEMO, "align.jsonl"), encoding="utf-8").readline())
    loss_fn = MaskedCrossEntropy(reduction="none")

    def resp_loss(resp):
        p, r = corpus.encode(row["prompt"]), corpus.encode(resp)
        seq = p + r
        ids = np.zeros((1, 16 * ((len(seq) + 15) // 16)), np.int32)
        ids[0, :len(seq)] = seq
        labels = np.full(ids.shape, -100, np.int32)
        labels[0, len(p) - 1:len(seq) - 1] = seq[len(p):]
        per = loss_fn(model(Tensor(ids)).reshape((-1, 256)), Tensor(labels.reshape(-1)))
        return float(per.asnumpy().sum()) / len(r)

    assert resp_loss(row["bad"]) - resp_loss(row["good"]) > 2.0


def test_data_files_are_held_out_and_well_formed():
    train, _ = corpus.split_prompts(seed=0)
    train_prompts = {e.prompt for e in train}
    align = [json.loads(x) for x in open(os.path.join(DEMO, "align.jsonl"), encoding="utf-8")]
    scores = [json.loads(x) for x in open(os.path.join(DEMO, "scores.jsonl"), encoding="utf-8")]
    assert len(align) >= 20 and len(scores) >= 50
    for row in align:
        assert row["prompt"] not in train_prompts
        assert row["good"] == corpus.good_response(rater.parse_prompt(row["prompt"]))
        assert len({row["good"], row["medium"], row["bad"]}) == 3
        for k in ("prompt", "good", "medium", "bad"):
            assert 10 <= len(row[k].encode()) <= 60
        assert len(row["prompt"].encode()) + max(len(row[k].encode())
                                                 for k in ("good", "medium", "bad")) <= 128
    for row in scores:
        assert row["prompt"] not in train_prompts
        assert 1 <= row["score"] <= 5
        assert rater.rate(row["prompt"], row["response"])["score"] == row["score"]


def test_rater_rules():
    ex = corpus.Example("count", ("one", "fox", "run"))
    assert ex.good == "I see one fox that runs."
    assert corpus.Example("count", ("two", "fox", "run")).good == "I see two foxes that run."
    assert rater.rate(ex.prompt, ex.good) == {"score": 5, "correctness": 5, "fluency": 5}
    assert rater.rate(ex.prompt, "I see one fox that run.")["score"] == 4
    assert rater.rate(ex.prompt, "kiwi owls RED eat RED six.")["score"] == 1


def test_config_contract():
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        pytest.skip("tomllib unavailable")
    with open(os.path.join(DEMO, "objdebug.toml"), "rb") as f:
        cfg = tomllib.load(f)
    assert cfg["model"]["factory"] == "objdebug.demo.model:build_model"
    assert cfg["objective"]["factory"] == "objdebug.losses:MaskedCrossEntropy"
    assert cfg["data"]["pad_id"] == 0 and cfg["data"]["label_pad_id"] == -100
    for key in ("checkpoint",):
        assert os.path.exists(os.path.join(DEMO, cfg["model"][key]))
    for key in ("align", "scores"):
        assert os.path.exists(os.path.join(DEMO, cfg["data"][key]))
    net = build_model(**cfg["model"]["kwargs"])
    assert sum(p.size for p in net.get_parameters()) > 0
