"""Task kinds on the Llama fixture (issue 55): the ported healthy objectives of each kind
(fixtures/ported_task_losses.py) and our own (cls_healthy, tag_healthy, crf_healthy, emb_healthy)
pass --profile ci-gate on a real architecture's backbone (fixtures/llama/tasks.py: TinyLlama's
RoPE / GQA / RMSNorm / SwiGLU stack under a classifier, a tagger and an encoder), not only on the
demo's bag models; each one-line twin fails there with the code its healthy port lacks.

A whole Llama ci-gate run costs ~2-4 min on 2 shared cores (its long-input stress cases and the
backbone's compiles): the default suite holds one classifier's and one encoder's healthy port and
twin on the one check that tells them apart (~30 s); every whole run and the other twins
(~4 min) are -m slow."""

import pytest

from .conftest import TARGETS
from .test_tasks_classification import _codes
from .test_tasks_ported import _checked  # one cache of the checks' runs

# (healthy, twin, the code the twin fails, the checks its run needs): the demo's TWINS
# (tests/test_tasks_ported.py) on the Llama fixture
TWINS = [
    ("llama_ported_hf_seqcls", "llama_ported_hf_seqcls_batch_axis", "OBJ110", ["align.class-ranking"]),
    pytest.param("llama_ported_timm_smoothing", "llama_ported_timm_log_of_softmax", "OBJ508",
                 ["stress.extreme-logits"], marks=pytest.mark.slow),
    pytest.param("llama_ported_tv_focal", "llama_ported_tv_focal_naive_bce", "OBJ508",
                 ["stress.extreme-logits"], marks=pytest.mark.slow),
    pytest.param("llama_ported_hf_tokcls", "llama_ported_hf_tokcls_all_positions", "OBJ504",
                 ["stress.padding-invariance"], marks=pytest.mark.slow),
    pytest.param("llama_ported_fairseq_smoothed", "llama_ported_fairseq_padding_smoothed", "OBJ221",
                 ["grad.ignored-label"], marks=pytest.mark.slow),
    pytest.param("llama_ported_torchcrf", "llama_ported_torchcrf_no_end", "OBJ223", ["grad.crf"],
                 marks=pytest.mark.slow),
    pytest.param("llama_ported_st_mnrl", "llama_ported_st_mnrl_anchor_candidates", "OBJ226",
                 ["grad.contrastive"], marks=pytest.mark.slow),
    ("llama_ported_clip", "llama_ported_clip_self_similarity", "OBJ226", ["grad.contrastive"]),
    pytest.param("llama_ported_st_contrastive", "llama_ported_st_contrastive_flipped", "OBJ226",
                 ["grad.contrastive"], marks=pytest.mark.slow),
]
# every healthy objective, whole ci-gate runs on every stage of its kind (all -m slow)
HEALTHY = [
    "llama_cls_healthy", "llama_ported_hf_seqcls", "llama_ported_timm_smoothing", "llama_ported_tv_focal",
    "llama_tag_healthy", "llama_crf_healthy", "llama_ported_hf_tokcls", "llama_ported_fairseq_smoothed",
    "llama_ported_torchcrf", "llama_emb_healthy", "llama_ported_st_mnrl", "llama_ported_clip",
    "llama_ported_st_contrastive",
]


def _not_passing(r):
    return [(f.code, f.verdict.value, f.message) for f in r.findings
            if f.verdict.value.lower() not in ("pass", "skip", "info")]


@pytest.mark.parametrize("healthy, twin, code, checks", TWINS,
                         ids=[(t.values if hasattr(t, "values") else t)[1] for t in TWINS])
def test_each_ported_twin_fails_on_llama_with_a_code_its_healthy_port_lacks(healthy, twin, code, checks):
    bad, good = _checked(twin, checks), _checked(healthy, checks)
    assert bad.exit_code == 1 and code in _codes(bad, "fail"), [(f.code, f.message) for f in bad.findings]
    assert code not in _codes(good, "fail") and good.exit_code == 0, _not_passing(good)


def test_the_backbones_gradient_scale_is_a_note_a_summed_loss_is_not():
    """OBJ201 on a kind: the Llama tagger's token CE has a mean per-parameter gradient norm of ~2.1
    (over the band's 1.0) and so has a plain mean cross-entropy on the same model and batch (a numpy
    float64 cotangent through the same model.vjp): the backbone's scale, a note. A summed token
    loss on the demo tagger is x16 the plain one's: still judged by the band."""
    from objdebug.core.findings import Verdict

    good = {f.code: f for f in _checked("llama_tag_healthy", ["grad.task-gradient-health"]).findings}["OBJ201"]
    assert good.verdict is Verdict.INFO and "the model's gradient scale" in good.message, good.message
    assert good.value > 1.0  # out of the absolute band: the reference is what tells
    summed = {f.code: f for f in _checked("tag_sum_reduction", ["grad.task-gradient-health"]).findings}["OBJ201"]
    import re

    times = float(re.search(r"\(x([0-9.]+);", summed.message).group(1))
    assert summed.verdict in (Verdict.WARN, Verdict.FAIL) and times > 10, summed.message


@pytest.mark.slow
@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_objectives_pass_ci_gate_on_llama(name):
    """The whole run, every stage of the kind: exit 0, and every stage the kind has measured
    something (no stage of the kind all skips)."""
    from objdebug import api

    r = api.run(api.load_config(TARGETS / name / "objdebug.toml"), profile="ci-gate")
    assert r.exit_code == 0, _not_passing(r)
    for stage in ("align", "grad", "decompose", "correlate", "stress"):
        if stage == "correlate" and "scores" not in (TARGETS / name / "objdebug.toml").read_text():
            continue
        assert any(f.stage == stage and f.verdict.value.lower() == "pass" for f in r.findings), stage


def test_the_llama_targets_are_the_demos_on_another_backbone():
    """Each Llama target is its demo target with only [model] changed: the same objective, kwargs,
    task and rows (a difference in verdict is the backbone's, not the config's)."""
    import tomllib

    for d in sorted(TARGETS.glob("llama_*")):
        text = (d / "objdebug.toml").read_text()
        if "(the demo's: ../" not in text:
            continue
        demo = text.split("(the demo's: ../", 1)[1].split(")", 1)[0]
        a = tomllib.loads(text)
        b = tomllib.loads((TARGETS / demo / "objdebug.toml").read_text())
        assert a["model"]["factory"].startswith("fixtures.llama.tasks:"), d.name
        for key in ("task", "objective", "data"):
            assert a.get(key) == b.get(key), (d.name, key)


# (target, the check, its code): issue 55's false WARNs on healthy embedding objectives, fixed in
# the checks. OBJ112 judged ClipLoss (dot product, symmetric) and ContrastiveLoss (cosine) by a
# closeness they do not use and ClipLoss's row direction only (69% / 83% ordered); OBJ401 gave
# every row of the first batch the same per-row loss (r = -0.47). The twins above still fail.
FIXED = [
    ("llama_ported_clip", "align.pair-ranking", "OBJ112"),
    pytest.param("llama_ported_st_contrastive", "align.pair-ranking", "OBJ112", marks=pytest.mark.slow),
    pytest.param("llama_emb_healthy", "correlate.score-correlation", "OBJ401", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name, check, code", FIXED, ids=["clip", "st_contrastive", "emb_healthy"])
def test_healthy_embedding_objectives_pass_their_order_and_correlation_on_llama(name, check, code):
    r = _checked(name, [check])
    assert code in _codes(r, "pass") and r.exit_code == 0, _not_passing(r)
