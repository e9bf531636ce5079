"""[task] kind = "classification" (issue 47): the weighted CE against a numpy float64 reference,
the measured class weights, the healthy demo on --profile ci-gate and each twin's code, and the
kinds' bad rows as exit 2 naming file:line."""

import json
from pathlib import Path

import numpy as np
import pytest

from .conftest import TARGETS, cli_exit_2

ROOT = Path(__file__).resolve().parent.parent
TASKS = ROOT / "objdebug" / "demo" / "tasks"


def _ref_weighted_ce(logits, labels, weight, ignore=-100, reduction="mean"):
    """numpy float64 reference: sum_n m_n w_yn (-log p_n,yn) / sum_n m_n w_yn."""
    x = logits.astype(np.float64)
    logp = x - x.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    mask = labels != ignore
    y = np.where(mask, labels, 0)
    w = np.asarray(weight, np.float64)[y] * mask
    nll = -logp[np.arange(len(y)), y]
    total = (w * nll).sum()
    return total if reduction == "sum" else total / max(w.sum(), 1e-12)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_weighted_ce_equals_numpy_reference(reduction):
    import mindspore as ms

    from objdebug.losses import WeightedCrossEntropy

    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (12, 5)).astype(np.float32)
    labels = rng.integers(0, 5, 12).astype(np.int32)
    labels[[2, 7]] = -100
    weight = [0.5, 1.0, 2.0, 4.0, 3.0]
    got = float(WeightedCrossEntropy(weight=weight, reduction=reduction)(
        ms.Tensor(logits), ms.Tensor(labels)).asnumpy())
    want = _ref_weighted_ce(logits, labels, weight, reduction=reduction)
    assert got == pytest.approx(want, rel=1e-5)
    all_ignored = np.full(12, -100, np.int32)
    assert float(WeightedCrossEntropy(weight=weight)(ms.Tensor(logits), ms.Tensor(all_ignored))) == 0.0


def _run(name, checks=None):
    """api.run of a fixture on --profile ci-gate; `checks`: only these (stage.check) run."""
    from objdebug import api
    from objdebug.stages import stage_checks

    cfg = api.load_config(TARGETS / name / "objdebug.toml")
    with pytest.MonkeyPatch.context() as mp:
        if checks:
            keep = {c.split(".")[1] for c in checks}
            mp.setattr(api, "stage_checks", lambda s: [c for c in stage_checks(s) if c.name in keep])
        stages = sorted({c.split(".")[0] for c in checks}) if checks else ["align", "grad"]
        return api.run(cfg, stages=stages, profile="ci-gate")


def _codes(result, verdict):
    return {f.code for f in result.findings if f.verdict.value.lower() == verdict}


def _value(result, check):
    """The measured value of `check` in a run's results."""
    return next(r.value for r in result.results if r.check == check)


def assert_twin_fails(runs, twin: str, healthy: str, code: str) -> None:
    """The twin's run exits 1 failing `code`, which its healthy twin's run does not fail."""
    r = runs[twin]
    assert r.exit_code == 1 and code in _codes(r, "fail"), [f.message for f in r.findings]
    assert code not in _codes(runs[healthy], "fail")


class LazyRuns(dict):
    """target name -> `_run(name, checks)`, made on first use and kept by the module that holds
    it (the default suite pays only for the targets its tests ask for)."""

    def __init__(self, checks):
        super().__init__()
        self.checks = checks

    def __missing__(self, name):
        self[name] = _run(name, self.checks)
        return self[name]


@pytest.fixture(scope="module")
def runs():
    weights = ["grad.class-weights"]
    return {"cls_healthy": _run("cls_healthy"),
            "cls_weight_sorted": _run("cls_weight_sorted", weights),
            "cls_weight_inverted": _run("cls_weight_inverted", weights),
            "cls_weight_ignored": _run("cls_weight_ignored", weights),
            "cls_ignore_trains": _run("cls_ignore_trains", ["grad.ignored-label"]),
            "cls_fixed_target": _run("cls_fixed_target", ["align.class-ranking"])}


def test_healthy_classifier_passes_ci_gate(runs):
    r = runs["cls_healthy"]
    assert r.exit_code == 0, [f.message for f in r.findings if f.verdict.value != "pass"]
    assert {"OBJ110", "OBJ201", "OBJ202", "OBJ203", "OBJ204", "OBJ206", "OBJ220", "OBJ221"} <= _codes(r, "pass")


@pytest.mark.parametrize("twin, code, needle", [
    ("cls_weight_sorted", "OBJ220", "owner: measured 0.133, declared 0.0667"),
    ("cls_weight_inverted", "OBJ220", "inverted"),
    ("cls_weight_ignored", "OBJ220", "ignores the declared weight"),
    ("cls_ignore_trains", "OBJ221", "receive gradient"),
    ("cls_fixed_target", "OBJ110", "on 0% of the 24 rows"),
])
def test_each_twin_fails_with_a_code_its_healthy_twin_lacks(runs, twin, code, needle):
    r = runs[twin]
    assert r.exit_code == 1
    assert code in _codes(r, "fail") and code not in _codes(runs["cls_healthy"], "fail")
    assert any(needle in f.message for f in r.findings if f.code == code), \
        [f.message for f in r.findings if f.code == code]


def test_measured_class_weights_equal_the_reference(runs):
    """The weights read off the gradient are the loss's own: w[label] / sum(w) (numpy float64)."""
    for name, w in (("cls_healthy", [1, 2, 4, 8]), ("cls_weight_sorted", [2, 1, 4, 8]),
                    ("cls_weight_inverted", [8, 4, 2, 1]), ("cls_weight_ignored", [1, 1, 1, 1])):
        value = next(r.value for r in runs[name].results if r.check == "class-weights")
        want = np.asarray(w, np.float64) / np.sum(w)
        np.testing.assert_allclose(value["measured"], want, rtol=1e-5)


def test_class_ranking_losses_equal_the_reference(runs):
    """OBJ110's three losses per row are the weighted CE on a batch of one: -log softmax."""
    value = next(r.value for r in runs["cls_healthy"].results if r.check == "class-ranking")
    for row in value["table"]:
        t, n, f = row["loss"]
        assert 0 < t < n < f
        # the three are -log p of three classes of one softmax: their exp sums below 1
        assert np.exp(-np.array(row["loss"], np.float64)).sum() == pytest.approx(
            np.exp(-np.array(row["loss"])).sum()) and np.exp(-np.array(row["loss"])).sum() <= 1 + 1e-6


# --------------------------------------------------------------------------- bad rows: exit 2
def _config(tmp_path, kind, rows, labels=("a", "b", "c")):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = tmp_path / "objdebug.toml"
    cfg.write_text(f'''[task]
kind = "{kind}"
labels = {json.dumps(list(labels))}
[model]
factory = "objdebug.demo.task_models:BagClassifier"
[objective]
factory = "objdebug.losses:WeightedCrossEntropy"
[data]
align = "rows.jsonl"
''')
    return cfg, data


@pytest.mark.parametrize("kind, rows, needle", [
    ("classification", [{"id": "1", "text": "x", "label": "a"}, {"id": "2", "text": "y", "label": "zebra"}],
     "label 'zebra' is not in the class list"),
    ("classification", [{"id": "1", "text": "x", "label": 7}], "label 7 is outside the class list [0, 3)"),
    ("tagging", [{"id": "1", "tokens": ["x", "y"], "tags": ["a", "b"]},
                 {"id": "2", "tokens": ["x", "y"], "tags": ["a"]}], "the tag sequence has 1 tags for 2 tokens"),
    ("embedding", [{"id": "1", "anchor": "x", "positive": "y"}, {"id": "2", "anchor": "x", "negative": "z"}],
     "the row has no 'positive'"),
])
def test_bad_rows_exit_2_naming_file_and_line(tmp_path, kind, rows, needle):
    cfg, data = _config(tmp_path, kind, rows)
    line = len(rows)
    cli_exit_2(["run", "--config", cfg], needle, f"rows.jsonl:{line}")


def test_bad_task_keys_exit_2(tmp_path):
    cfg, _ = _config(tmp_path, "classification", [{"id": "1", "text": "x", "label": "a"}])
    cli_exit_2(["run", "--config", cfg, "--set", "task.kind=regression"], "task.kind")
    cli_exit_2(["run", "--config", cfg, "--set", "task.class_weight={ z = 1.0 }"], "task.class_weight")


def test_init_on_the_text_classifier_writes_a_config_that_runs(tmp_path, monkeypatch):
    """`objdebug init` detects the kind from the rows' fields (and the model's [B, C] output) and
    writes a config that runs: exit 0 or 1, never 2."""
    from typer.testing import CliRunner

    from objdebug import api
    from objdebug.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["init", "--model", "objdebug.demo.task_models:BagClassifier",
                                      "--objective", "objdebug.losses:WeightedCrossEntropy",
                                      "--checkpoint", str(TASKS / "classifier.ckpt"),
                                      "--data", str(TASKS / "classification.jsonl")])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "objdebug.toml").read_text()
    assert 'kind = "classification"' in text and "labels = [" in text
    cfg = api.load_config(tmp_path / "objdebug.toml")
    assert api.run(cfg, stages=["align"]).exit_code in (0, 1)


def test_demo_task_names_a_kind():
    cli_exit_2(["demo", "--task", "regression"], "For '--task'")
