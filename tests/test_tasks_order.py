"""Align on the task kinds beyond classification (issue 47): OBJ111 (tagging: gold tags < one
tag changed < every tag changed) and OBJ112 (embedding: true positive < hard negative < far text),
each healthy target passing --profile ci-gate and its twin failing; the measured losses against
numpy float64 closed forms on the measured emissions / embeddings."""

import numpy as np
import pytest

from .test_tasks_classification import LazyRuns, _codes, _value

ORDER = ["align.tag-ranking", "align.pair-ranking"]
_RUNS = LazyRuns(ORDER)


@pytest.fixture
def runs():
    """Align-only runs made on first use and kept for the module."""
    return _RUNS


@pytest.mark.parametrize("healthy, twin, code", [
    ("tag_healthy", "tag_shifted", "OBJ111"),
    ("emb_healthy", "emb_distance_logits", "OBJ112"),
    pytest.param("triplet_healthy", "triplet_swapped", "OBJ112", marks=pytest.mark.slow),
])
def test_healthy_passes_ci_gate_and_its_twin_fails(runs, healthy, twin, code):
    good, bad = runs[healthy], runs[twin]
    assert good.exit_code == 0, [f.message for f in good.findings]
    assert code in _codes(good, "pass")
    assert bad.exit_code == 1 and code in _codes(bad, "fail"), [f.message for f in bad.findings]


def test_tag_losses_move_by_the_emission_margins(runs):
    """Token CE (mean over the row's scored tags): changing tags raises the loss by the emission
    margins given up / the scored count (closed form, float64, on the measured emissions)."""
    value = _value(runs["tag_healthy"], "tag-ranking")
    assert value["correct"] >= 3
    for row in value["table"]:
        gold, near, far = row["loss"]
        assert near - gold == pytest.approx(row["margins"][0] / row["many"], rel=1e-4, abs=1e-5)
        assert far - gold == pytest.approx(row["margins"][1] / row["many"], rel=1e-4, abs=1e-5)


def test_shifted_tags_leave_the_first_tag_unscored(runs):
    """The shifted twin's rows whose near miss is the first word: the loss does not move at all."""
    rows = [r for r in _value(runs["tag_shifted"], "tag-ranking")["table"] if r["position"] == 0]
    assert rows and all(r["loss"][0] == r["loss"][1] and not r["ordered"] for r in rows)


@pytest.mark.slow
def test_triplet_losses_equal_the_closed_form(runs):
    """Triplet, the true positive as the negative: loss = m + d(a, candidate) - d(a, positive)
    (Euclidean, margin 1, numpy float64 distances of the measured embeddings)."""
    value = _value(runs["triplet_healthy"], "pair-ranking")
    assert value["form"] == "triplet" and value["correct"] >= 10
    for row in value["table"]:
        close = np.asarray(row["closeness"], np.float64)  # -distance
        np.testing.assert_allclose(row["loss"], 1.0 + close[0] - close, rtol=1e-5, atol=1e-5)


def test_in_batch_order_is_relative(runs):
    """InfoNCE on a trained encoder saturates (the hard negative costs 1e-5..1e-2 nats more):
    still ordered, since a step counts relative to its own losses."""
    value = _value(runs["emb_healthy"], "pair-ranking")
    assert value["ordered_share"] == 1.0
    assert min(r["loss"][1] - r["loss"][0] for r in value["table"]) < 1e-3


def test_an_undeclared_closeness_counts_a_row_only_where_every_notion_agrees():
    """Issue 55: an objective that names no `similarity` / `distance` (OpenCLIP's ClipLoss: the dot
    product; sentence-transformers' ContrastiveLoss: `distance_metric`) is judged on the rows whose
    order cosine, dot and Euclidean all give; a declared one by its own notion alone."""
    from types import SimpleNamespace

    from objdebug.stages.align.task_order import _closeness, _ranks_right

    cfg = SimpleNamespace(objective=SimpleNamespace(kwargs={}))
    how, closes = _closeness(cfg, object(), triplet=False)
    assert len(closes) == 3 and how.startswith("undeclared")
    cfg.objective.kwargs["similarity"] = "cosine"
    assert len(_closeness(cfg, object(), triplet=False)[1]) == 1
    # text 0 points the anchor's way but is short; text 1 is long and 45 degrees off: cosine ranks
    # text 0 first, the dot product text 1
    a = np.array([[1.0, 0.0]])
    texts = np.array([[0.1, 0.0], [2.0, 2.0], [-1.0, 0.2]])
    sims = [c(a, texts) for c in closes]
    assert not _ranks_right(sims, 0, 0, 1, 2, [1, 2])
    assert _ranks_right(sims[:1], 0, 0, 1, 2, [1, 2])


def test_the_column_direction_must_order_the_candidates_too():
    """A hard negative closer to another anchor of the batch than to its own row's: a symmetric
    loss (CLIP's transposed logits) and the other rows' in-batch terms cost it more than a far text
    close to none, on a correct loss, so the row is not judged."""
    from objdebug.stages.align.task_order import _columns_right

    def unit(x):
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    anchors = unit(np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))
    own, hard, far = unit(np.array([[1.0, 0.1, 0.0], [0.6, 0.8, 0.0], [-0.3, -0.3, 0.9]]))
    sims = [anchors @ np.stack([own, hard, far]).T]
    assert sims[0][0, 0] > sims[0][0, 1] > sims[0][0, 2]  # the row direction is ordered
    assert not _columns_right(sims, 0, [1], (0, 1, 2))
    hard = unit(np.array([0.6, -0.1, 0.8]))  # no closer to anchor 1 than the positive is
    sims = [anchors @ np.stack([own, hard, far]).T]
    assert _columns_right(sims, 0, [1], (0, 1, 2))
