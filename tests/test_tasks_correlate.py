"""Correlate on the task kinds (issue 47): per-row loss vs the rows' human `score` (OBJ401-OBJ404,
the causal LM's statistics) for classification, tagging and embedding; each healthy target passes
--profile ci-gate, its twin (an objective blind to the label / the causal LM's shift in tagging /
a distance as the logits) fails OBJ401; the classifier's per-row losses against a numpy float64
-log softmax of the checkpoint's logits. Each run compiles the kind's graphs: `slow`."""

import json

import numpy as np
import pytest

from .test_tasks_classification import LazyRuns, ROOT, TARGETS, _codes

_RUNS = LazyRuns(["correlate.score-correlation"])


@pytest.fixture
def runs():
    return _RUNS


@pytest.mark.slow
@pytest.mark.parametrize("healthy, twin", [
    ("cls_healthy", "cls_fixed_target"),
    ("tag_healthy", "tag_shifted"),
    ("emb_healthy", "emb_distance_logits"),
])
def test_loss_tracks_the_score_and_the_twin_does_not(runs, healthy, twin):
    good, bad = runs[healthy], runs[twin]
    assert good.exit_code == 0, [f.message for f in good.findings]
    assert {"OBJ401", "OBJ402", "OBJ403"} <= _codes(good, "pass")
    assert bad.exit_code == 1 and "OBJ401" in _codes(bad, "fail"), [f.message for f in bad.findings]


@pytest.mark.slow
def test_classifier_row_losses_equal_the_reference(runs):
    """A row alone under a weighted CE (mean): the weight cancels, the loss is -log softmax(logits)_y
    (numpy float64 on the checkpoint's logits, the model run eagerly here)."""
    import mindspore as ms

    from objdebug.demo.task_models import BagClassifier

    value = next(r.value for r in runs["cls_healthy"].results if r.check == "score-correlation")
    model = BagClassifier(classes=4)
    ms.load_param_into_net(model, ms.load_checkpoint(str(ROOT / "objdebug/demo/tasks/classifier.ckpt")))
    labels = ["owner", "count", "reverse", "shout"]
    rows = [json.loads(line) for line in open(TARGETS / "cls_data" / "scores.jsonl")]
    for point, row in zip(value["points"], rows):
        ids = np.array([list(row["text"].encode())], np.int32)
        x = model(ms.Tensor(ids)).asnumpy().astype(np.float64)[0]
        ref = np.log(np.exp(x - x.max()).sum()) + x.max() - x[labels.index(row["label"])]
        assert point["id"] == row["id"] and point["loss"] == pytest.approx(ref, rel=1e-4, abs=1e-5)
