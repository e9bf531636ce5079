"""Decompose on the task kinds (issue 47): a composite objective's terms (OBJ300-OBJ305, the
causal LM's measurements) on classification, tagging and embedding rows; each healthy composite
passes --profile ci-gate, a seesaw (the penalty takes the update: OBJ305) and a silent penalty
(2e4 times smaller than the task term: OBJ303) fail; the classifier's component means against
numpy float64 on the checkpoint's logits. Each run compiles the kind's graphs: `slow`."""

import json

import numpy as np
import pytest

from .test_tasks_classification import ROOT, LazyRuns, _codes, assert_twin_fails

DECOMPOSE = ["decompose.components", "decompose.gradient-share", "decompose.primary-share"]
_RUNS = LazyRuns(DECOMPOSE)


@pytest.fixture
def runs():
    return _RUNS


@pytest.mark.slow
@pytest.mark.parametrize("healthy", ["cls_composite_healthy", "tag_composite_healthy", "emb_composite_healthy"])
def test_healthy_composites_pass_ci_gate(runs, healthy):
    r = runs[healthy]
    assert r.exit_code == 0, [f.message for f in r.findings if f.verdict.value != "pass"]
    assert {"OBJ300", "OBJ301", "OBJ302", "OBJ303", "OBJ304", "OBJ305"} <= _codes(r, "pass")


@pytest.mark.slow
@pytest.mark.parametrize("twin, healthy, code", [
    ("cls_penalty_seesaw", "cls_composite_healthy", "OBJ305"),
    ("emb_penalty_silent", "emb_composite_healthy", "OBJ303"),
])
def test_each_composite_twin_fails_with_a_code_its_healthy_twin_lacks(runs, twin, healthy, code):
    assert_twin_fails(runs, twin, healthy, code)


@pytest.mark.slow
def test_classifier_component_means_equal_the_reference(runs):
    """Each row alone: ce = -log softmax(x)_y (the class weight cancels in a batch of one),
    penalty = 0.05 mean(x^2); their means over the align rows (numpy float64, eager model)."""
    import mindspore as ms

    from objdebug.demo.task_models import BagClassifier

    value = next(r.value for r in runs["cls_composite_healthy"].results if r.check == "components")
    model = BagClassifier(classes=4)
    ms.load_param_into_net(model, ms.load_checkpoint(str(ROOT / "objdebug/demo/tasks/classifier.ckpt")))
    labels = ["owner", "count", "reverse", "shout"]
    ce, pen = [], []
    for line in open(ROOT / "objdebug/demo/tasks/classification.jsonl"):
        row = json.loads(line)
        x = model(ms.Tensor(np.array([list(row["text"].encode())], np.int32))).asnumpy().astype(np.float64)[0]
        ce.append(np.log(np.exp(x - x.max()).sum()) + x.max() - x[labels.index(row["label"])])
        pen.append(0.05 * np.mean(x ** 2))
    means = {c["name"]: c["mean"] for c in value["components"]}
    assert means["ce"] == pytest.approx(np.mean(ce), rel=1e-4)
    assert means["logit_penalty"] == pytest.approx(np.mean(pen), rel=1e-4)


# --------------------------------------------------------------------------- the other stages
_STAGES = LazyRuns(["grad.ignored-label", "grad.contrastive", "stress.all-padding",
                    "stress.padding-invariance"])


@pytest.mark.parametrize("healthy, twin, codes", [
    ("cls_composite_healthy", "cls_penalty_unmasked", {"OBJ221", "OBJ503"}),
    ("tag_composite_healthy", "tag_penalty_unmasked", {"OBJ221", "OBJ503", "OBJ504"}),
])
def test_a_masked_penalty_passes_where_its_unmasked_twin_leaks(healthy, twin, codes):
    """The penalty over the scored positions (OLMo's z-loss masking) passes the padding and
    ignored-label checks; averaged over every position it trains padding, costs an all-padding
    batch and moves with the padding."""
    good, bad = _STAGES[healthy], _STAGES[twin]
    assert good.exit_code == 0, [f.message for f in good.findings if f.verdict.value != "PASS"]
    assert codes <= _codes(good, "pass")
    assert bad.exit_code == 1 and codes <= _codes(bad, "fail"), [f.message for f in bad.findings]


def test_a_composites_cosine_term_is_judged_not_its_norm_penalty():
    """InfoNCE (cosine) + a norm penalty: the total depends on the norm by design; OBJ228 judges
    the primary term (the cosine InfoNCE), which does not."""
    r = _STAGES["emb_composite_healthy"]
    found = {f.code: f for f in r.findings}
    assert found["OBJ228"].verdict.value == "PASS" and "primary term 'infonce'" in found["OBJ228"].message
    assert r.exit_code == 0, [f.message for f in r.findings if f.verdict.value != "PASS"]
