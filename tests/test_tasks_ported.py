"""Task kinds on objectives written by others (issue 55): ported healthy objectives of each kind
(fixtures/ported_task_losses.py) pass --profile ci-gate, each one-line twin fails with a code its
healthy port lacks; the kinds' table (engine/kinds.py) gives each kind only its own cases; an
(anchor, positive) embedding objective on triplet rows runs and says the negatives are unused; a
CRF's decode(emissions, mask) is called as its signature asks."""

import numpy as np
import pytest

from .conftest import TARGETS, cli_exit_2
from .test_tasks_classification import LazyRuns, _codes, _run, _value

# (healthy, twin, the code the twin fails, the checks its run needs)
TWINS = [
    ("ported_timm_smoothing", "ported_timm_log_of_softmax", "OBJ508", ["stress.extreme-logits"]),
    ("ported_tv_focal", "ported_tv_focal_naive_bce", "OBJ508", ["stress.extreme-logits"]),
    ("ported_hf_seqcls", "ported_hf_seqcls_batch_axis", "OBJ110", ["align.class-ranking"]),
    ("ported_hf_tokcls", "ported_hf_tokcls_all_positions", "OBJ504", ["stress.padding-invariance"]),
    ("ported_fairseq_smoothed", "ported_fairseq_padding_smoothed", "OBJ221", ["grad.ignored-label"]),
    pytest.param("ported_torchcrf", "ported_torchcrf_no_end", "OBJ223", ["grad.crf"],
                 marks=pytest.mark.slow),  # ~60 s: an unrolled CRF compiles per shape
    ("ported_st_mnrl", "ported_st_mnrl_anchor_candidates", "OBJ226", ["grad.contrastive"]),
    ("ported_clip", "ported_clip_self_similarity", "OBJ226", ["grad.contrastive"]),
    ("ported_st_contrastive", "ported_st_contrastive_flipped", "OBJ226", ["grad.contrastive"]),
]
# the default suite's whole ci-gate runs: one healthy port per kind (the others: -m slow)
GATE_DEFAULT = ["ported_clip"]
GATE_SLOW = ["ported_tv_focal", "ported_fairseq_smoothed", "ported_hf_seqcls", "ported_timm_smoothing",
             "ported_st_mnrl", "ported_st_contrastive", "ported_hf_tokcls"]


class _Gate(dict):
    """target -> its whole run on every stage of the kind, --profile ci-gate (made once)."""

    def __missing__(self, name):
        from objdebug import api

        cfg = api.load_config(TARGETS / name / "objdebug.toml")
        self[name] = api.run(cfg, profile="ci-gate")
        return self[name]


_GATE = _Gate()
_CHECKED = {}


def _checked(name, checks):
    key = (name, tuple(checks))
    if key not in _CHECKED:
        _CHECKED[key] = _run(name, checks)
    return _CHECKED[key]


def _healthy_passes(r):
    assert r.exit_code == 0, [(f.code, f.verdict.value, f.message) for f in r.findings
                              if f.verdict.value.lower() not in ("pass", "skip", "info")]


@pytest.mark.parametrize("name", GATE_DEFAULT)
def test_ported_healthy_objectives_pass_ci_gate(name):
    _healthy_passes(_GATE[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", GATE_SLOW)
def test_other_ported_healthy_objectives_pass_ci_gate(name):
    _healthy_passes(_GATE[name])


@pytest.mark.parametrize("healthy, twin, code, checks", TWINS,
                         ids=[(t.values if hasattr(t, "values") else t)[1] for t in TWINS])
def test_each_ported_twin_fails_with_a_code_its_healthy_port_lacks(healthy, twin, code, checks):
    bad, good = _checked(twin, checks), _checked(healthy, checks)
    assert bad.exit_code == 1 and code in _codes(bad, "fail"), [(f.code, f.message) for f in bad.findings]
    assert code not in _codes(good, "fail") and good.exit_code == 0, [f.message for f in good.findings]


# --------------------------------------------------------------------------- the kinds' own cases
def test_a_classifier_without_ignore_index_gets_no_ignored_label_cases():
    """timm's LabelSmoothingCrossEntropy has no ignore_index (a sequence classifier ignores no
    row): OBJ221 is a SKIP that says so, OBJ503 an all-padding input with the rows' real labels;
    label smoothing's (1 - eps) scale is not a class weight: OBJ220 passes on the ratios."""
    r = _checked("ported_timm_smoothing", [
        "grad.ignored-label", "grad.class-weights", "stress.all-padding"])
    assert r.exit_code == 0
    skip = next(f for f in r.findings if f.code == "OBJ221")
    assert skip.verdict.value.lower() == "skip" and "declares no ignore_index" in skip.message
    pad = _value(r, "all-padding")
    assert pad["case"] == "padding-input" and np.isfinite(pad["loss"]) and pad["loss"] > 0
    w = _value(r, "class-weights")
    # at logits 0 label smoothing's gradient is (1 - eps) x a cross-entropy's: shares 1/C each
    np.testing.assert_allclose(np.asarray(w["measured"]) / np.sum(w["measured"]), 0.25, rtol=1e-6)
    assert w["measured_sum"] == pytest.approx(0.9, rel=1e-5)


def test_the_kinds_table():
    from types import SimpleNamespace

    from objdebug.engine import kinds

    def cfg(kind, **kwargs):
        return SimpleNamespace(task=SimpleNamespace(kind=kind), objective=SimpleNamespace(kwargs=kwargs))

    plain = SimpleNamespace()
    assert kinds.ignores_labels(cfg("classification"), plain)[0] is False
    assert kinds.ignores_labels(cfg("classification", ignore_index=-100), plain)[0] is True
    assert kinds.ignores_labels(cfg("tagging"), plain)[0] is True
    assert kinds.ignores_labels(cfg("embedding"), plain)[0] is False
    assert kinds.all_padding_case(cfg("classification"), plain) == kinds.PADDING_INPUT
    assert kinds.all_padding_case(cfg("classification", ignore_index=-100), plain) == kinds.IGNORED_LABELS
    assert kinds.all_padding_case(cfg("tagging"), plain) == kinds.IGNORED_LABELS
    assert kinds.all_padding_case(cfg("embedding"), plain) == kinds.EMPTY_TEXTS
    assert set(kinds.with_ignored_label()) == {"classification", "tagging"}


def test_the_focal_loss_chance_level_is_its_own():
    """OBJ505 on torchvision's focal loss: the chance level is the least loss an input-blind
    prediction scores through the focal loss (far below the labels' entropy, the cross-entropy's
    chance level, which made a healthy focal loss warn)."""
    v = _value(_checked("ported_tv_focal", ["stress.random-ids"]), "random-ids")
    assert v["chance"] < 0.5 * v["entropy"]
    assert v["informed"] < v["chance"] <= v["mean_loss"]


# --------------------------------------------------------------------------- embedding signatures
def test_a_two_argument_loss_on_triplet_rows_runs_and_says_the_negatives_are_unused():
    r = _checked("ported_clip", ["grad.contrastive"])
    v = _value(r, "contrastive")
    assert v["form"] == "pairs" and v["negatives_unused"]
    msg = next(f.message for f in r.findings if f.code == "OBJ226")
    assert "negatives are unused" in msg and "symmetric-infonce" in msg


def test_takes_negative_reads_the_construct():
    from fixtures import ported_task_losses as p
    from objdebug.engine import tasks

    assert not tasks.takes_negative(p.ClipLoss())
    assert tasks.takes_negative(p.MultipleNegativesRankingLoss())
    assert tasks.takes_negative(p.ContrastiveLoss())


def test_an_undeclared_closed_form_mismatch_is_a_note():
    """The temperature applied twice differs from InfoNCE: a FAIL where task.formula declares
    InfoNCE (fixtures' configs), a note naming the forms compared where nothing declares one."""
    from objdebug import api
    from objdebug.stages import stage_checks

    cfg = api.load_config(TARGETS / "emb_double_temperature" / "objdebug.toml")
    cfg.task.formula = None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(api, "stage_checks", lambda s: [c for c in stage_checks(s) if c.name == "contrastive"])
        r = api.run(cfg, stages=["grad"], profile="ci-gate")
    f = next(f for f in r.findings if f.code == "OBJ226")
    assert f.verdict.value.lower() == "info" and "none of the closed forms" in f.message
    assert "infonce/cosine" in f.message and "task.formula" in f.message


def test_bad_formula_exits_2(tmp_path):
    cfg = tmp_path / "objdebug.toml"
    cfg.write_text((TARGETS / "emb_healthy" / "objdebug.toml").read_text()
                   .replace('formula = "infonce"', 'formula = "nt-xent"')
                   .replace("../../../", str(TARGETS.parent.parent) + "/")
                   .replace("../emb_data", str(TARGETS / "emb_data")))
    cli_exit_2(["run", "--config", cfg], "For 'task.formula'")


# --------------------------------------------------------------------------- CRF decode signatures
def test_decode_is_called_as_its_signature_asks():
    import mindspore as ms

    from fixtures.task_losses import RequiredMaskDecodeCRF
    from objdebug.engine import tasks
    from objdebug.losses import CRFLoss

    assert tasks.decode_inputs(CRFLoss(3)) == ([], "")
    crf = RequiredMaskDecodeCRF(3)
    assert tasks.decode_inputs(crf) == (["mask"], "")
    e = ms.Tensor(np.random.default_rng(0).normal(size=(1, 4, 3)).astype(np.float32))
    np.testing.assert_array_equal(tasks.call_decode(crf, e), np.asarray(CRFLoss.decode(crf, e).asnumpy()))
    wrapped = tasks.with_mask(crf, -100)
    assert tasks.decode_inputs(wrapped) == (["mask"], "")

    class Odd(CRFLoss):
        def decode(self, emissions, lengths):
            return None

    needs, why = tasks.decode_inputs(Odd(3))
    assert needs is None and "lengths" in why


def test_crf_with_decode_emissions_mask_checks_viterbi(tmp_path):
    """OBJ222-OBJ225 on a CRF whose decode takes (emissions, mask): measured, not a crash."""
    cfg = tmp_path / "objdebug.toml"
    cfg.write_text((TARGETS / "crf_mask_healthy" / "objdebug.toml").read_text()
                   .replace("fixtures.task_losses:MaskedCRF", "fixtures.task_losses:RequiredMaskDecodeCRF")
                   .replace("../../../", str(TARGETS.parent.parent) + "/")
                   .replace("../tag_data", str(TARGETS / "tag_data")))
    from objdebug import api
    from objdebug.stages import stage_checks

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(api, "stage_checks", lambda s: [c for c in stage_checks(s) if c.name == "crf"])
        r = api.run(api.load_config(cfg), stages=["grad"], profile="ci-gate")
    assert r.exit_code == 0 and "OBJ225" in _codes(r, "pass"), [f.message for f in r.findings]


# --------------------------------------------------------------------------- a label outside the list
def test_an_index_label_beyond_the_models_classes_is_one_line(tmp_path):
    """Without [task] labels the class count is the model's (known after the contract probe): a
    label 7 of a 4-class model is still one line naming file and line, exit 2."""
    import json

    rows = [{"id": "a", "text": "owner of it", "label": 0}, {"id": "b", "text": "count it", "label": 7}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = tmp_path / "objdebug.toml"
    cfg.write_text(f'''[task]
kind = "classification"
[model]
factory = "objdebug.demo.task_models:BagClassifier"
kwargs = {{ vocab_size = 256, dim = 32, hidden = 32, classes = 4 }}
[objective]
factory = "objdebug.losses:WeightedCrossEntropy"
[data]
tokenizer = "bytes"
align = "rows.jsonl"
''')
    cli_exit_2(["run", "--config", cfg, "--profile", "ci-gate"], "label 7 is outside the class list [0, 4)",
               "rows.jsonl:2")


# --------------------------------------------------------------------------- init on the kinds
TASKS = TARGETS.parent.parent / "objdebug" / "demo" / "tasks"
INIT = {
    "classification": (["--model", "objdebug.demo.task_models:BagClassifier", "--objective",
                        "fixtures.ported_task_losses:TimmLabelSmoothingCrossEntropy",
                        "--checkpoint", TASKS / "classifier.ckpt",
                        "--data", TARGETS / "cls_data" / "scores.jsonl"]),
    "tagging": (["--model", "objdebug.demo.task_models:ContextTagger", "--objective",
                 "objdebug.losses:WeightedCrossEntropy", "--checkpoint", TASKS / "tagger.ckpt",
                 "--model-kwargs", "{ vocab_size = 256, dim = 16, hidden = 48, tags = 5 }",
                 "--data", TARGETS / "tag_data" / "short.jsonl", "--data", TARGETS / "tag_data" / "scores.jsonl"]),
    "embedding": (["--model", "objdebug.demo.task_models:BagEncoder", "--objective",
                   "objdebug.losses:InfoNCELoss", "--checkpoint", TASKS / "encoder.ckpt",
                   "--model-kwargs", "{ vocab_size = 256, dim = 32, hidden = 32, out = 16 }",
                   "--data", TASKS / "embedding.jsonl", "--data", TARGETS / "emb_data" / "scores.jsonl"]),
}


@pytest.mark.parametrize("kind", ["classification", pytest.param("tagging", marks=pytest.mark.slow),
                                  pytest.param("embedding", marks=pytest.mark.slow)])
def test_init_on_a_kind_writes_a_config_whose_stages_run(tmp_path, monkeypatch, kind):
    """`objdebug init` on a classifier (given only rows with scores: they serve as align rows),
    a tagger and an embedder: align and correlate, the stages that skipped on a file init left
    out, measure something and pass the gate; no label_pad_id is asked of a kind without one."""
    from typer.testing import CliRunner

    from objdebug import api
    from objdebug.cli import app

    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(app, ["init"] + [str(a) for a in INIT[kind]])
    assert out.exit_code == 0, out.output
    assert "not decided: data.label_pad_id" not in out.output
    assert "pad_id: 0 (assumed: no data given)" not in out.output
    text = (tmp_path / "objdebug.toml").read_text()
    assert f'kind = "{kind}"' in text and "align = " in text and "scores = " in text
    r = api.run(api.load_config(tmp_path / "objdebug.toml"), stages=["align", "correlate"], profile="ci-gate")
    assert r.exit_code == 0, [f.message for f in r.findings]
    for stage in ("align", "correlate"):
        assert any(f.stage == stage and f.verdict.value.lower() == "pass" for f in r.findings), stage
