"""The reference preference losses in objdebug.losses against float64 numpy versions of the papers'
formulas (DPO eq. 7, IPO eq. 17, SimPO eq. 6, SLiC hinge), in graph mode."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest

from objdebug.engine import runtime
from objdebug.losses import HingeDPOLoss, IPOLoss, SigmoidDPOLoss, SimPOLoss


def _logsig(x):
    return -np.logaddexp(0.0, -x)


def ref_dpo(pc, pr, rc, rr, beta=0.1, label_smoothing=0.0):
    h = (pc - rc) - (pr - rr)
    return -(1 - label_smoothing) * _logsig(beta * h) - label_smoothing * _logsig(-beta * h), \
        beta * (pc - rc), beta * (pr - rr)


def ref_ipo(pc, pr, rc, rr, beta=0.1):
    h = (pc - rc) - (pr - rr)
    return (h - 1 / (2 * beta)) ** 2, beta * (pc - rc), beta * (pr - rr)


def ref_simpo(pc, pr, rc, rr, beta=2.0, gamma=1.0):
    return -_logsig(beta * pc - beta * pr - gamma), beta * pc, beta * pr


def ref_hinge(pc, pr, rc, rr, beta=0.1):
    h = (pc - rc) - (pr - rr)
    return np.maximum(0.0, 1 - beta * h), beta * (pc - rc), beta * (pr - rr)


CASES = [
    (SigmoidDPOLoss, ref_dpo, {"beta": 0.1}),
    (SigmoidDPOLoss, ref_dpo, {"beta": 0.5, "label_smoothing": 0.1}),
    (IPOLoss, ref_ipo, {"beta": 0.3}),
    (SimPOLoss, ref_simpo, {"beta": 2.5, "gamma": 0.7}),
    (HingeDPOLoss, ref_hinge, {"beta": 0.2}),
]


@pytest.fixture(scope="module")
def inputs():
    runtime.setup("CPU", "graph", 0)
    rng = np.random.default_rng(0)
    # summed log-probs of a few dozen tokens: large negative numbers with margins of a few nats
    base = -rng.uniform(5, 60, size=(4, 6))
    base[2] = base[0] + rng.normal(0, 3, 6)   # reference near the policy
    base[3] = base[1] + rng.normal(0, 3, 6)
    return base.astype(np.float32)


@pytest.mark.parametrize("cls, ref, kwargs", CASES, ids=lambda x: getattr(x, "__name__", str(x)))
def test_loss_matches_float64_reference(inputs, cls, ref, kwargs):
    pc, pr, rc, rr = (ms.Tensor(x) for x in inputs)
    want, want_c, want_r = ref(*inputs.astype(np.float64), **kwargs)
    loss, cr, rj = cls(**kwargs, reduction="none")(pc, pr, rc, rr)
    np.testing.assert_allclose(loss.asnumpy(), want, rtol=2e-5, atol=1e-5)
    np.testing.assert_allclose(cr.asnumpy(), want_c, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rj.asnumpy(), want_r, rtol=1e-5, atol=1e-5)
    mean, _, _ = cls(**kwargs)(pc, pr, rc, rr)
    assert float(mean.asnumpy()) == pytest.approx(float(want.mean()), rel=2e-5, abs=1e-5)


def test_sum_reduction_and_zero_point(inputs):
    pc, pr = (ms.Tensor(x) for x in inputs[:2])
    total, _, _ = SigmoidDPOLoss(beta=0.1, reduction="sum")(pc, pr, pc, pr)
    assert float(total.asnumpy()) == pytest.approx(6 * np.log(2), rel=1e-6)


@pytest.mark.parametrize("build, error, message", [
    (lambda: SigmoidDPOLoss(beta=0), ValueError, "For 'SigmoidDPOLoss', the 'beta' must be > 0, but got 0."),
    (lambda: SigmoidDPOLoss(beta="0.1"), TypeError, "the type of 'beta' must be float, but got str."),
    (lambda: SigmoidDPOLoss(label_smoothing=0.5), ValueError, "'label_smoothing' must be in range [0.0, 0.5)"),
    (lambda: IPOLoss(reduction="avg"), ValueError, "For 'IPOLoss', the 'reduction' must be in"),
    (lambda: SimPOLoss(gamma=-1.0), ValueError, "For 'SimPOLoss', the 'gamma' must be >= 0"),
    (lambda: HingeDPOLoss(beta=True), TypeError, "the type of 'beta' must be float, but got bool."),
])
def test_argument_errors(build, error, message):
    with pytest.raises(error) as err:
        build()
    assert message in str(err.value)


def test_docstrings_follow_the_mindspore_layout():
    for cls in (SigmoidDPOLoss, IPOLoss, SimPOLoss, HingeDPOLoss):
        doc = cls.__doc__
        for section in ("Args:", "Inputs:", "Outputs:", "Raises:", "Supported Platforms:", "Examples:"):
            assert section in doc, (cls.__name__, section)


def test_large_margins_stay_finite():
    """MindSpore's ops.logsigmoid gives -inf below about -88; the losses must not (summed log-probs
    of long answers reach such margins)."""
    runtime.setup("CPU", "graph", 0)
    pc = ms.Tensor(np.array([-1500.0, -10.0], np.float32))
    pr = ms.Tensor(np.array([-10.0, -1500.0], np.float32))
    zero = ms.Tensor(np.zeros(2, np.float32))
    loss, _, _ = SigmoidDPOLoss(beta=0.1, reduction="none")(pc, pr, zero, zero)
    np.testing.assert_allclose(loss.asnumpy(), [149.0, 0.0], atol=1e-4)
    loss, _, _ = SimPOLoss(beta=2.0, gamma=1.0, reduction="none")(pc, pr, zero, zero)
    np.testing.assert_allclose(loss.asnumpy(), [2981.0, 0.0], rtol=1e-6, atol=1e-4)
