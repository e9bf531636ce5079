"""Random ids (OBJ505), determinism (OBJ510, OBJ511) and the embedding kind's empty texts (OBJ503)
on the task kinds (issue 47): the causal LM's measurements on the kind's rows and graphs
(stages/stress/task_cases.py), against numpy float64 references, with a twin per code:

- `cls_entropy_bonus` (a confidence penalty at weight 1): on random ids the loss falls below the
  labels' chance level, OBJ505 WARN; the healthy classifier stays above it;
- `cls_batch_centered` (features centred on the batch mean at evaluation): a row's loss depends on
  its batch, OBJ511 FAIL; the healthy classifier's row gives the same loss alone and in a batch;
- `emb_empty_text_nan` (a mean pooling unguarded against an empty text): NaN, OBJ503 FAIL; the
  healthy encoder's empty texts embed alike, InfoNCE log B;
- `cls_onehot_label` (the CE read through a one-hot product): a label outside the class list costs
  -log 0 = inf, OBJ506 FAIL; the healthy weighted CE rejects it (GatherD's range error).

- `tag_sum_reduction` (the token CE summed): a long input costs ~16x the short one, OBJ502 FAIL;
  the healthy kinds' long rows pass, a trained encoder's near-zero losses within the absolute
  tolerance whatever their ratio.

The out-of-range probes come last: a probe that raises retires its graph (stress/garbage_ids.py).

One Context per target (module scope); only these checks run.
"""

from __future__ import annotations

import numpy as np
import pytest

from objdebug.core.findings import Verdict

from .conftest import target_context
from .test_tasks_classification import _ref_weighted_ce

WEIGHT = [1.0, 2.0, 4.0, 8.0]  # the classification targets' class_weight, label order
CHECKS = ("random-ids", "determinism", "all-padding", "long-inputs")


@pytest.fixture(scope="module")
def contexts():
    from objdebug.pipeline.profile import load_profile

    profile = load_profile("ci-gate")
    built = {}

    def get(name):
        if name not in built:
            built[name] = target_context(name, profile, "stress")
        return built[name]
    return get


_RESULTS: dict = {}


def result(contexts, name, check, stage="stress"):
    from objdebug.pipeline.runner import run_check
    from objdebug.stages import stage_checks

    if (name, check) not in _RESULTS:
        ctx = contexts(name)
        found = next(c for c in stage_checks(stage) if c.name == check)
        res = run_check(found, ctx, ctx.profile.section(stage))
        assert res.error is None, res.error
        _RESULTS[(name, check)] = res
    return _RESULTS[(name, check)]


def verdicts(contexts, name) -> dict:
    out = {}
    for check in CHECKS:
        out.update({f.code: f.verdict for f in result(contexts, name, check).findings})
    return out


def _outputs(ctx, seqs, length):
    from objdebug.engine import tasks

    return tasks.forward(ctx.engine, tasks.pad(seqs, ctx.engine.padding.pad_id, length)).asnumpy()


# --------------------------------------------------------------------------- OBJ505
def test_random_ids_on_a_classifier_match_numpy_and_sit_above_chance(contexts):
    from objdebug.pipeline import task_kind
    from objdebug.stages.stress.task_cases import random_rows

    ctx = contexts("cls_healthy")
    v = result(contexts, "cls_healthy", "random-ids").value
    rows = random_rows(ctx, ctx.profile.section("stress"))
    assert len(rows) == v["shape"][0] and all(0 not in r.ids for r in rows)  # the pad id never drawn
    real = task_kind.grad_rows(ctx)
    assert [len(r.ids) for r in rows] == [len(r.ids) for r in real]  # each row keeps its length
    assert [r.target for r in rows] == [r.target for r in real]      # ... and its label
    logits = _outputs(ctx, [r.ids for r in rows], v["shape"][1])
    labels = np.array([r.target for r in rows])
    want = [_ref_weighted_ce(logits[i:i + 1], labels[i:i + 1], WEIGHT) for i in range(len(rows))]
    np.testing.assert_allclose(v["losses"], want, rtol=1e-5)
    # chance: the entropy of the class-weighted label distribution (float64, here)
    mass = np.bincount(labels, minlength=4) * np.asarray(WEIGHT)
    p = mass[mass > 0] / mass.sum()
    assert v["entropy"] == pytest.approx(float(-(p * np.log(p)).sum()), rel=1e-12)
    # the chance level measured through the objective (its best input-blind prediction) is a
    # cross-entropy's: the entropy, to float32
    assert v["chance"] == pytest.approx(v["entropy"], rel=1e-5)
    assert v["informed"] < 0.01 * v["chance"]
    assert v["mean_loss"] >= 0.8 * v["chance"]
    assert verdicts(contexts, "cls_healthy")["OBJ505"] is Verdict.PASS


def test_an_entropy_bonus_warns_obj505_below_chance(contexts):
    v = result(contexts, "cls_entropy_bonus", "random-ids").value
    finding = result(contexts, "cls_entropy_bonus", "random-ids").findings[0]
    assert finding.verdict is Verdict.WARN, finding.message
    # measured through the objective, CE - entropy's best input-blind prediction costs below 0
    # (a cross-entropy's floor): ignorance is rewarded
    assert v["chance"] < 0 and "pays for not knowing the label" in finding.message


def test_random_ids_on_an_encoder_judge_finiteness_only(contexts):
    res = result(contexts, "emb_healthy", "random-ids")
    v, finding = res.value, res.findings[0]
    assert v["chance"] is None and np.isfinite(v["losses"]).all() and v["nonfinite_params"] == 0
    assert finding.verdict is Verdict.PASS and "finiteness judged" in finding.message


# --------------------------------------------------------------------------- OBJ510, OBJ511
def test_determinism_on_a_classifier_matches_numpy(contexts):
    from objdebug.pipeline import task_kind

    ctx = contexts("cls_healthy")
    v = result(contexts, "cls_healthy", "determinism").value
    rows, length = task_kind.grad_rows(ctx), v["shape"][1]
    labels = np.array([r.target for r in rows])
    mixed = _outputs(ctx, [r.ids for r in rows], length)
    in_batch = [_ref_weighted_ce(mixed[i:i + 1], labels[i:i + 1], WEIGHT) for i in range(3)]
    alone = [_ref_weighted_ce(_outputs(ctx, [rows[i].ids] * len(rows), length)[:1], labels[i:i + 1], WEIGHT)
             for i in range(3)]
    np.testing.assert_allclose(v["in_batch"], in_batch, rtol=1e-5)
    np.testing.assert_allclose(v["alone"], alone, rtol=1e-5)
    np.testing.assert_array_equal(v["repeat_first"], v["repeat_second"])
    assert verdicts(contexts, "cls_healthy")["OBJ510"] is Verdict.PASS
    assert verdicts(contexts, "cls_healthy")["OBJ511"] is Verdict.PASS


def test_a_batch_centred_classifier_fails_obj511(contexts):
    res = result(contexts, "cls_batch_centered", "determinism")
    found = {f.code: f for f in res.findings}
    assert found["OBJ511"].verdict is Verdict.FAIL, found["OBJ511"].message
    assert "depends on the other rows" in found["OBJ511"].message
    assert found["OBJ510"].verdict is Verdict.PASS  # the same batch twice is still the same
    # a batch of copies centres every row to zero features: each row's loss is the head's bias alone
    v = res.value
    assert np.ptp(v["alone"]) < np.ptp(v["in_batch"])


def test_determinism_on_an_encoder_compares_the_in_batch_loss(contexts):
    res = result(contexts, "emb_healthy", "determinism")
    v = res.value
    assert v["sample_ids"] == ["the batch's in-batch loss"] and len(v["alone"]) == 1
    assert v["alone"][0] == pytest.approx(v["in_batch"][0], rel=1e-6)
    assert {f.code: f.verdict for f in res.findings} == {"OBJ510": Verdict.PASS, "OBJ511": Verdict.PASS}


# --------------------------------------------------------------------------- OBJ503 on embeddings
def test_empty_texts_on_a_healthy_encoder_cost_log_b(contexts):
    """Every text all padding embeds alike: every in-batch similarity is the same, so InfoNCE is
    -log(1/B) = log B exactly (float64 closed form)."""
    res = result(contexts, "emb_healthy", "all-padding")
    v = res.value
    assert v["kind"] == "embedding" and v["rows"] == 8
    assert v["loss"] == pytest.approx(np.log(v["rows"]), rel=1e-5)
    assert v["nonfinite_params"] == 0 and res.findings[0].verdict is Verdict.PASS


def test_an_unguarded_mean_pooling_fails_obj503_on_empty_texts(contexts):
    res = result(contexts, "emb_empty_text_nan", "all-padding")
    finding = res.findings[0]
    assert finding.code == "OBJ503" and finding.verdict is Verdict.FAIL, finding.message
    assert not np.isfinite(res.value["loss"]) and res.value["nonfinite_params"] == res.value["n_params"]


# --------------------------------------------------------------------------- OBJ501, OBJ502
def test_long_inputs_on_a_classifier_match_numpy(contexts):
    from objdebug.pipeline import task_kind
    from objdebug.stages.stress.task_cases import long_rows

    ctx = contexts("cls_healthy")
    first = task_kind.grad_rows(ctx)[0]
    res = result(contexts, "cls_healthy", "long-inputs")
    v, found = res.value, {f.code: f.verdict for f in res.findings}
    for length, got in ((128, v["reference"]), (2048, v["lengths"]["2048"])):
        (row,) = long_rows(ctx, length)
        n = len(first.ids)  # row 0's own text, repeated: its label stays right
        assert len(row.ids) == length and row.ids[:n] == first.ids and row.ids[n:2 * n] == first.ids[:length - n]
        assert row.target == first.target
        logits = _outputs(ctx, [row.ids], length)
        assert got["loss"] == pytest.approx(_ref_weighted_ce(logits, np.array([row.target]), WEIGHT), rel=1e-5)
    assert found == {"OBJ501": Verdict.PASS, "OBJ502": Verdict.PASS}


def test_a_summed_tag_loss_fails_obj502(contexts):
    res = result(contexts, "tag_sum_reduction", "long-inputs")
    v, found = res.value, {f.code: f for f in res.findings}
    assert found["OBJ502"].verdict is Verdict.FAIL, found["OBJ502"].message
    assert found["OBJ501"].verdict is Verdict.PASS  # finite: only its scale grows
    # a sum over tagged tokens: 16x the tokens, ~16x the loss (the tagger's context differs at the joins)
    assert v["lengths"]["2048"]["ratio"] == pytest.approx(2048 / 128, rel=0.05)


def test_a_trained_encoders_near_zero_losses_pass_obj502_whatever_their_ratio(contexts):
    res = result(contexts, "emb_healthy", "long-inputs")
    v, found = res.value, {f.code: f for f in res.findings}
    r = v["lengths"]["2048"]
    assert r["ran"] and abs(r["loss"] - v["reference"]["loss"]) <= 0.01 < v["reference"]["loss"] + 1
    assert found["OBJ501"].verdict is Verdict.PASS and found["OBJ502"].verdict is Verdict.PASS


# --------------------------------------------------------------------------- the real library's loss
def test_mindspores_own_weighted_cross_entropy_on_the_classification_kind(contexts):
    """`mindspore.nn.CrossEntropyLoss(weight=..., ignore_index=-100)` (MindSpore 2.10), unchanged:
    its class weights are the declared ones, read off its gradient (OBJ220), and a batch whose
    every label is ignored is 0 / 0 = NaN (OBJ503), as its causal-LM use is (OBJ503's page)."""
    weights = result(contexts, "cls_mindspore_ce", "class-weights", stage="grad")
    assert {f.code: f.verdict for f in weights.findings} == {"OBJ220": Verdict.PASS}, weights.findings
    res = result(contexts, "cls_mindspore_ce", "all-padding")
    assert res.findings[0].verdict is Verdict.FAIL and np.isnan(res.value["loss"]), res.findings[0].message
    # the same batch through the healthy weighted CE costs exactly 0
    assert result(contexts, "cls_healthy", "all-padding").value["loss"] == 0.0


# --------------------------------------------------------------------------- OBJ206 on embeddings
def test_a_trained_encoders_finite_differences_pass_within_its_measured_rounding(contexts):
    """The trained encoder's InfoNCE (3e-4 nats, a difference of logits near 20) disagreed with
    its finite differences by 1.1% along a random direction, all of it float32 rounding: a WARN
    until the rounding was measured (task_fd.rounding_noise)."""
    res = result(contexts, "emb_healthy", "task-finite-differences", stage="grad")
    v, finding = res.value, res.findings[0]
    assert finding.code == "OBJ206" and finding.verdict is Verdict.PASS, finding.message
    assert v["rounding_noise"] > 0 and "measured float32 rounding" in finding.message
    grad = next(d for d in v["directions"] if d["direction"] == "gradient")
    assert grad["autodiff"] == pytest.approx(v["gradient_norm"])
    # every disagreement that remains is within what rounding does to that quotient
    for d in v["directions"]:
        assert abs(d["finite_difference"] - d["autodiff"]) <= d["rounding_slack"] + 1e-3 * abs(d["autodiff"])


# --------------------------------------------------------------------------- OBJ506, OBJ507 (last)
def test_out_of_range_labels_and_ids_are_rejected_by_the_healthy_classifier(contexts):
    res = result(contexts, "cls_healthy", "out-of-range-ids")
    v, found = res.value, {f.code: f for f in res.findings}
    assert v["label_bound"] == 4 and v["input_bound"] == 256 and v["label_shape"] == [8]
    assert all(v["probes"][k]["rejected"] for k in ("label 4", "label -1", "input 256", "input -1"))
    assert found["OBJ506"].verdict is Verdict.PASS and "out of [0, 4)" in found["OBJ506"].message
    assert found["OBJ507"].verdict is Verdict.PASS and "out of [0, 256)" in found["OBJ507"].message


def test_a_one_hot_cross_entropy_fails_obj506_with_inf(contexts):
    res = result(contexts, "cls_onehot_label", "out-of-range-ids")
    v, found = res.value, {f.code: f for f in res.findings}
    assert found["OBJ506"].verdict is Verdict.FAIL, found["OBJ506"].message
    for key in ("label 4", "label -1"):  # -log(0): the one-hot of a label outside [0, 4) is zeros
        assert not v["probes"][key]["rejected"] and v["probes"][key]["value"] == np.inf
    # labels in range: the same loss as the healthy weighted CE on the same row
    assert v["label_valid_loss"] == pytest.approx(
        result(contexts, "cls_healthy", "out-of-range-ids").value["label_valid_loss"], rel=1e-5)


@pytest.mark.slow
def test_an_encoder_has_no_label_to_probe(contexts):
    res = result(contexts, "emb_healthy", "out-of-range-ids")
    found = {f.code: f for f in res.findings}
    assert found["OBJ506"].verdict is Verdict.SKIP and "no label" in found["OBJ506"].message
    assert found["OBJ507"].verdict is Verdict.PASS
    assert res.value["probes"]["input 256"]["rejected"]
