"""Finite differences (OBJ206) on the task kinds (issue 47): autodiff through `task.logit_grad`
and `model.vjp` against central differences of the objective's total with the model's parameters
moved; healthy classification, tagging and embeddings (the loss's float32 rounding measured)
pass --profile ci-gate, a straight-through rounding of the logits (of the similarities) fails; the parameters come back bit for bit. Each run differentiates the model
a dozen times: `slow`."""

import numpy as np
import pytest

from .test_tasks_classification import _codes, _run

FD = ["grad.task-finite-differences"]


@pytest.mark.slow
@pytest.mark.parametrize("healthy", ["cls_healthy", "tag_healthy", "emb_healthy", "emb_dot_healthy"])
def test_healthy_kinds_agree_with_finite_differences(healthy):
    r = _run(healthy, FD)
    assert r.exit_code == 0 and "OBJ206" in _codes(r, "pass"), [f.message for f in r.findings]
    v = r.results[0].value
    grad = next(d for d in v["directions"] if d["direction"] == "gradient")
    assert grad["autodiff"] == pytest.approx(v["gradient_norm"]) and grad["rel_error"] < 1e-3
    assert 0.0 <= v["rounding_noise"] < 1e-5  # measured: far below every loss's first-order change


@pytest.mark.slow
def test_straight_through_similarities_fail_on_the_embedding_kind():
    r = _run("emb_straight_through", FD)
    assert r.exit_code == 1 and "OBJ206" in _codes(r, "fail"), [f.message for f in r.findings]
    v = r.results[0].value  # piecewise constant: every random direction's difference is exactly 0
    assert all(d["differences"] == [0.0] * len(d["differences"])
               for d in v["directions"] if d["direction"] != "gradient")


@pytest.mark.slow
def test_straight_through_rounding_fails_and_parameters_are_restored():
    import objdebug.pipeline.runner as runner

    held = {}
    real = runner.load_target

    def keep(cfg, *a, **k):  # the run's target, to read its parameters after the run
        held["t"] = real(cfg, *a, **k)
        held["before"] = [p.asnumpy().copy() for p in held["t"].model.trainable_params()]
        return held["t"]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "load_target", keep)
        r = _run("cls_straight_through", FD)
    assert r.exit_code == 1 and "OBJ206" in _codes(r, "fail"), [f.message for f in r.findings]
    for p, before in zip(held["t"].model.trainable_params(), held["before"]):
        assert np.array_equal(p.asnumpy(), before)
