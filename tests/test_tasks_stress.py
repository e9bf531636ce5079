"""Stress on the task kinds (issue 47): the causal LM's all-padding (OBJ503), padding invariance
(OBJ504), long inputs (OBJ501, OBJ502), random ids (OBJ505), out-of-range ids (OBJ506, OBJ507), extreme outputs (OBJ508), low precision (OBJ509) and determinism
(OBJ510, OBJ511) cases, kind-aware, on each kind's
healthy target (passes --profile ci-gate) and a twin per code. Each run compiles the kind's
gradient graphs at three lengths: `slow`."""

import pytest

from .test_tasks_classification import LazyRuns, _codes, _value, assert_twin_fails

STRESS = ["stress.all-padding", "stress.padding-invariance", "stress.extreme-logits",
          "stress.low-precision", "stress.random-ids", "stress.determinism", "stress.out-of-range-ids",
          "stress.long-inputs"]
COMMON = {"OBJ501", "OBJ502", "OBJ503", "OBJ504", "OBJ505", "OBJ507", "OBJ508", "OBJ509", "OBJ510", "OBJ511"}  # every kind's
_RUNS = LazyRuns(STRESS)


@pytest.fixture
def runs():
    return _RUNS


@pytest.mark.slow
@pytest.mark.parametrize("healthy, codes", [
    ("cls_healthy", COMMON | {"OBJ506"}),
    ("tag_healthy", COMMON | {"OBJ506"}),
    ("emb_healthy", COMMON),
    ("emb_dot_healthy", COMMON),
])
def test_healthy_kinds_pass_stress_on_ci_gate(runs, healthy, codes):
    r = runs[healthy]
    assert r.exit_code == 0, [f.message for f in r.findings if f.verdict.value != "pass"]
    assert codes <= _codes(r, "pass")


@pytest.mark.slow
@pytest.mark.parametrize("twin, healthy, code", [
    ("cls_unguarded_mean", "cls_healthy", "OBJ503"),
    ("tag_position_mean", "tag_healthy", "OBJ504"),
    ("emb_naive_softmax", "emb_dot_healthy", "OBJ508"),
    ("cls_batch_centered", "cls_healthy", "OBJ511"),
    ("tag_sum_reduction", "tag_healthy", "OBJ502"),
])
def test_each_stress_twin_fails_with_a_code_its_healthy_twin_lacks(runs, twin, healthy, code):
    assert_twin_fails(runs, twin, healthy, code)


@pytest.mark.slow
def test_position_mean_shrinks_as_the_reference_says(runs):
    """A token loss averaged over every position: loss(+e) = loss(+0) * T / (T + e) for T real
    positions (float64 closed form); the healthy twin's loss does not move at all."""
    v = _value(runs["tag_position_mean"], "padding-invariance")
    t, base = v["tokens"], v["rows"][0]["loss"]
    for row in v["rows"][1:]:
        assert row["loss"] == pytest.approx(base * t / (t + row["extra_pad"]), rel=1e-5)
    assert _value(runs["tag_healthy"], "padding-invariance")["max_loss_rel_diff"] == 0.0
