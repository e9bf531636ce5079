"""Tests of objdebug.losses.MaskedCrossEntropy in GRAPH_MODE on CPU."""
import os
import tempfile

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

from objdebug.losses import MaskedCrossEntropy

IGNORE = -100


@pytest.fixture(scope="module", autouse=True)
def graph_mode():
    old = os.getcwd()
    tmp = tempfile.mkdtemp(prefix="objdebug-test-")   # MindSpore may drop rank_0/ here
    os.chdir(tmp)
    from objdebug.engine import runtime

    runtime.setup("CPU", "graph", 0)  # not ms.set_device: MindSpore 2.7 refuses it once a kernel ran
    yield
    os.chdir(old)


def ref_loss(logits, labels, reduction="mean", eps=0.0, ignore_index=IGNORE):
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    logp = x - np.log(np.exp(x).sum(axis=-1, keepdims=True))
    mask = labels != ignore_index
    safe = np.where(mask, labels, 0)
    nll = -logp[np.arange(len(labels)), safe]
    per = (1 - eps) * nll + eps * (-logp.mean(axis=-1))
    per = np.where(mask, per, 0.0)
    if reduction == "none":
        return per
    if reduction == "sum":
        return per.sum()
    return per.sum() / max(mask.sum(), 1)


def make(n=12, v=7, seed=0, scale=3.0):
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((n, v)) * scale).astype(np.float32)
    labels = rng.integers(0, v, size=n).astype(np.int32)
    labels[[1, 4, 5, 10]] = IGNORE
    return logits, labels


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_matches_float64_reference(reduction, eps):
    logits, labels = make()
    out = MaskedCrossEntropy(ignore_index=IGNORE, reduction=reduction,
                             label_smoothing=eps)(Tensor(logits), Tensor(labels)).asnumpy()
    ref = ref_loss(logits, labels, reduction, eps)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    if reduction == "none":
        assert out.shape == labels.shape
        assert np.all(out[labels == IGNORE] == 0.0)


def test_masked_positions_have_exactly_zero_gradient():
    logits, labels = make()
    logits[1] = 1e4   # a huge masked row must not leak into loss or gradient
    fn = MaskedCrossEntropy()
    g = ms.grad(fn)(Tensor(logits), Tensor(labels)).asnumpy()
    assert np.all(g[labels == IGNORE] == 0.0)
    assert np.all(np.isfinite(g))
    # gradient of the mean loss at an unmasked row: (softmax - onehot) / count
    x = logits.astype(np.float64)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    onehot = np.eye(logits.shape[1])[np.where(labels == IGNORE, 0, labels)]
    ref = (p - onehot) / (labels != IGNORE).sum()
    keep = labels != IGNORE
    np.testing.assert_allclose(g[keep], ref[keep], rtol=1e-4, atol=1e-6)


def test_all_masked_gives_zero_and_finite_gradient():
    logits, _ = make()
    labels = np.full(len(logits), IGNORE, np.int32)
    fn = MaskedCrossEntropy()
    assert float(fn(Tensor(logits), Tensor(labels)).asnumpy()) == 0.0
    g = ms.grad(fn)(Tensor(logits), Tensor(labels)).asnumpy()
    assert np.all(np.isfinite(g)) and np.all(g == 0.0)


def test_fp16_large_vocab_finite_and_close_to_fp32():
    rng = np.random.default_rng(1)
    n, v = 16, 8000
    logits32 = (rng.standard_normal((n, v)) * 4).astype(np.float32)
    logits16 = logits32.astype(np.float16)
    labels = rng.integers(0, v, size=n).astype(np.int32)
    labels[3] = IGNORE
    fn = MaskedCrossEntropy()
    out16 = float(fn(Tensor(logits16), Tensor(labels)).asnumpy())
    out32 = float(fn(Tensor(logits32), Tensor(labels)).asnumpy())
    assert np.isfinite(out16)
    ref = ref_loss(logits16.astype(np.float32), labels)   # same (rounded) inputs, in float64
    np.testing.assert_allclose(out16, ref, rtol=1e-5)
    np.testing.assert_allclose(out16, out32, rtol=1e-2)


@pytest.mark.parametrize("bad_label", [7, -1])   # 7 == V; each raise costs ~3 s
def test_out_of_range_labels_raise(bad_label):
    # label == V, and negative labels other than ignore_index, must raise, not be scored.
    # A fresh instance per case: after a kernel error MindSpore refuses to run that compiled
    # graph again ("An error occurred in the previous step of this model execution").
    logits, labels = make(v=7)
    labels[0] = bad_label
    with pytest.raises(RuntimeError):
        MaskedCrossEntropy(ignore_index=IGNORE)(Tensor(logits), Tensor(labels)).asnumpy()


def test_valid_edge_labels_work():
    logits, labels = make(v=7)
    labels[0], labels[2] = 0, 6
    out = MaskedCrossEntropy()(Tensor(logits), Tensor(labels)).asnumpy()
    np.testing.assert_allclose(out, ref_loss(logits, labels), rtol=1e-5)


def test_custom_ignore_index():
    logits, labels = make(v=7)
    labels[labels == IGNORE] = -1
    out = MaskedCrossEntropy(ignore_index=-1, reduction="sum")(Tensor(logits), Tensor(labels))
    np.testing.assert_allclose(out.asnumpy(), ref_loss(logits, labels, "sum", ignore_index=-1),
                               rtol=1e-5)


def test_bad_reduction_message():
    with pytest.raises(ValueError) as exc:
        MaskedCrossEntropy(reduction="x")
    assert str(exc.value) == ("For 'MaskedCrossEntropy', the 'reduction' must be in "
                              "['mean', 'sum', 'none'], but got 'x'.")


@pytest.mark.parametrize("kwargs, err", [
    ({"label_smoothing": 1.5}, ValueError),
    ({"label_smoothing": "0.1"}, TypeError),
    ({"ignore_index": 1.0}, TypeError),
])
def test_bad_args(kwargs, err):
    with pytest.raises(err, match="For 'MaskedCrossEntropy'"):
        MaskedCrossEntropy(**kwargs)
