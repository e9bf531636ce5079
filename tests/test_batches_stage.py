"""The batches stage (OBJ01x): the pipeline's real batches against the real objective (in graph
mode) and the declared conventions.

The fixtures (fixtures/batch_pipelines.py) run whole: the healthy HF-style collator and the
MindFormers-style MindRecord pass every check under ci-gate; the source procedure's bug (labels
padded with 0, the user's believed `label_pad_id = -100`) fails. The other bugs run through one
real Context on the tiny model, the batches swapped per case (the objective's graphs are reused).
"""

from __future__ import annotations

import re
import sys
import types
from dataclasses import replace
from html import unescape

import numpy as np
import pytest

from objdebug import api
from objdebug.core.config import load_config
from objdebug.core.findings import Verdict
from objdebug.pipeline.runner import resolve_stages, run_check

from .conftest import TARGETS, without_plain_row_skips


def _findings(result):
    return {f.code: (f.verdict, f.message) for f in result.findings if f.code[:5] in ("OBJ01", "OBJ02")}


def _without_eos_checks(found):
    """The findings less the skips of single-prompt rows (conftest), the EOS ones required: no
    eos_id in the healthy fixtures."""
    assert {"OBJ020", "OBJ022"} <= set(found), sorted(found)
    return without_plain_row_skips(found)


@pytest.mark.mindspore_range  # one stage per family on the oldest MindSpore too (.ci/run)
def test_the_healthy_collator_passes_every_check_under_ci_gate():
    cfg = load_config(TARGETS / "batches_healthy" / "objdebug.toml")
    res = api.run(cfg, stages=["batches"], profile="ci-gate", compile_cache=False)
    found = _findings(res)
    assert res.exit_code == 0
    assert set(found) == {f"OBJ0{i}" for i in range(10, 29)}
    assert all(v is Verdict.PASS for v, _ in _without_eos_checks(found).values()), found
    assert "labels are the inputs 1 position ahead: shifted once (pre-shifted)" in found["OBJ013"][1]


def test_the_mindrecord_pipeline_passes(hf):
    """Its objective shifts inside (MindFormers' layout); the shared `hf` one does too."""
    found = _judge(hf, None, target="batches_mindrecord")
    assert found["OBJ016"][0] is Verdict.SKIP  # no mask column: padding from the pad run
    assert all(v is Verdict.PASS for c, (v, _) in _without_eos_checks(found).items() if c != "OBJ016"), found
    assert "labels are the inputs at the same positions: unshifted" in found["OBJ013"][1] and "7 rows" in found["OBJ012"][1]
    assert "in all 7 rows whose prompt is known" in found["OBJ017"][1]
    assert found["OBJ019"][1].startswith("one shift in all: labels are the inputs at the same positions: unshifted")


def test_the_seed_bug_fails_with_the_believed_config(ctx):
    """Labels padded with 0 by the collator, ignore_index -100, label_pad_id = -100 believed."""
    found = _judge(ctx, None, target="batches_pad_zero")
    verdict, message = found["OBJ010"]
    assert verdict is Verdict.FAIL
    assert message.startswith("labels on padding are 0; the objective ignores -100")
    assert "112 padding positions" in message and "instead of 0" in message
    assert found["OBJ012"] == (Verdict.FAIL, found["OBJ012"][1])
    assert "label_pad_id = -100 declared, the batches put 0 on padding" in found["OBJ012"][1]
    assert found["OBJ011"][0] is Verdict.PASS  # the prompt is masked right


def test_the_stage_runs_first_when_batches_are_set_and_only_then():
    from objdebug.pipeline.profile import load_profile

    with_batches = load_config(TARGETS / "batches_healthy" / "objdebug.toml")
    assert resolve_stages(with_batches, load_profile("default"), None)[:2] == ["batches", "align"]
    cfg = load_config(TARGETS / "tiny" / "objdebug.toml")
    assert "batches" not in resolve_stages(cfg, load_profile("default"), None)
    assert "batches" not in cfg.to_dict()["data"]
    assert resolve_stages(with_batches, load_profile("default"), ["align"]) == ["align"]


# --------------------------------------------------------------------------- one bug per case
CASE: dict[str, list] = {"batches": []}


def _case_module():
    mod = types.ModuleType("batchcase_test")
    mod.make = lambda: iter(CASE["batches"])
    sys.modules["batchcase_test"] = mod


@pytest.fixture(scope="module")
def ctx():
    from objdebug.engine import runtime
    from objdebug.engine.core import Engine
    from objdebug.engine.target import load_target
    from objdebug.pipeline.context import Context
    from objdebug.pipeline.profile import load_profile

    _case_module()
    cfg = load_config(TARGETS / "batches_healthy" / "objdebug.toml")
    runtime.setup("CPU", "graph", 0)
    target = load_target(cfg)
    yield Context(config=cfg, target=target, engine=Engine(target), profile=load_profile())
    sys.modules.pop("batchcase_test", None)


@pytest.fixture(scope="module")
def hf():
    """A target whose objective shifts inside, HF style (fixtures/shift_losses.py:HFShiftingCE)."""
    from objdebug.engine.core import Engine
    from objdebug.engine.target import load_target
    from objdebug.pipeline.context import Context
    from objdebug.pipeline.profile import load_profile

    _case_module()
    cfg = load_config(TARGETS / "batches_hf_shift" / "objdebug.toml")
    target = load_target(cfg)
    yield Context(config=cfg, target=target, engine=Engine(target), profile=load_profile())


def _collated(label_pad=-100, side="right", pad=0, shift=True, mask=True, prompt_label=-100):
    """Four rows of 'prompt' + 'answer' bytes of different lengths, padded, labelled."""
    rows = [(list(b"ask: "), list(b"yes.")), (list(b"q? "), list(b"no, never.")),
            (list(b"prompt "), list(b"ok")), (list(b"x "), list(b"fine, thanks"))]
    length = max(len(p) + len(r) for p, r in rows)
    ids = np.full((4, length), pad, np.int64)
    labels = np.full((4, length), label_pad, np.int64)
    att = np.zeros((4, length), np.int64)
    for i, (p, r) in enumerate(rows):
        row, n = p + r, len(p) + len(r)
        sl = slice(0, n) if side == "right" else slice(length - n, length)
        ids[i, sl], att[i, sl] = row, 1
        lab = np.full(n, prompt_label, np.int64)
        if shift:
            lab[len(p) - 1:n - 1] = r
            lab[n - 1] = -100
        else:
            lab[len(p):] = r
        labels[i, sl] = lab
    out = {"input_ids": ids, "labels": labels}
    if mask:
        out["attention_mask"] = att
    return out


def _judge(ctx, batches, target="batches_healthy", source=None, **data):
    """{code: (verdict, message)} of the stage's checks on `batches` (None: the target's own, or
    `source` as `[data] batches`)."""
    if source is not None:
        data["batches"] = source
    from objdebug.stages import stage_checks
    from objdebug.stages.batches.audit import audit, real_batches

    base = load_config(TARGETS / target / "objdebug.toml")
    if batches is not None:
        CASE["batches"] = batches
        base = replace(base, data=replace(base.data, batches="batchcase_test:make", batches_kwargs={}))
    ctx.config = replace(base, data=replace(base.data, **data))
    ctx.forget(audit), ctx.forget(real_batches)
    th = ctx.profile.section("batches")
    out = {}
    for check in stage_checks("batches"):
        for f in run_check(check, ctx, th).findings:
            out[f.code] = (f.verdict, f.message)
    return out


def test_a_healthy_case_passes_on_the_shared_context(ctx):
    found = _judge(ctx, [_collated()])
    assert found.pop("OBJ017")[0] is Verdict.SKIP and found.pop("OBJ018")[0] is Verdict.SKIP
    assert all(v is Verdict.PASS for v, _ in _without_eos_checks(found).values()), found


def _fixture_batches():
    from fixtures.batch_pipelines import healthy_collator

    return list(healthy_collator())


def test_a_prompt_left_unmasked_fails(ctx):
    batches = _fixture_batches()
    b = batches[0]
    n = int(b["attention_mask"][0].sum())
    b["labels"][0, :n - 1] = b["input_ids"][0, 1:n]  # row 0 trains on its prompt (pre-shifted)
    found = _judge(ctx, batches)
    verdict, message = found["OBJ017"]
    assert verdict is Verdict.FAIL
    assert "the prompt is trained in 1 of 16 rows whose prompt is known (batch 1 row 0): 29 positions" in message
    assert found["OBJ018"][0] is Verdict.PASS


def test_a_prompt_mask_one_token_too_long_fails(ctx):
    batches = _fixture_batches()
    b = batches[0]
    first = int(np.argmax(b["labels"][1] != -100))  # the position predicting the first answer token
    b["labels"][1, first] = -100
    found = _judge(ctx, batches)
    verdict, message = found["OBJ018"]
    assert verdict is Verdict.FAIL and "not trained in 1 of 16 rows" in message and "batch 1 row 1" in message
    assert found["OBJ017"][0] is Verdict.PASS


def test_labels_of_zero_on_the_prompt_fail(ctx):
    found = _judge(ctx, [_collated(prompt_label=0)])
    verdict, message = found["OBJ011"]
    assert verdict is Verdict.FAIL and message.startswith("labels on prompt are 0 and -100; the objective ignores -100: 13 prompt positions")
    assert found["OBJ010"][0] is Verdict.PASS


def test_a_pre_shifted_collator_passes_and_its_prompt_labelled_zero_fails(ctx):
    """`input_ids = full[:-1]`, `labels = full[1:]` (torchtitan's layout): each row's last label is
    its final token, with no next input; it is that position's target, not a prompt position
    trained toward it (before: OBJ011 FAILed the healthy collator, "8 prompt positions ... are
    trained toward" the final tokens). The same rows with the prompt labelled 0 still FAIL."""
    found = _judge(ctx, _pipeline("pre_shifted_collator"))
    for code in ("OBJ010", "OBJ011", "OBJ013", "OBJ014", "OBJ019", "OBJ021"):
        assert found[code][0] is Verdict.PASS, (code, found[code])
    found = _judge(ctx, _pipeline("pre_shifted_collator", prompt_label=0))
    verdict, message = found["OBJ011"]
    assert verdict is Verdict.FAIL and message.startswith("labels on prompt are 0"), message


def test_unshifted_labels_with_shift_true_fail_naming_both(ctx):
    found = _judge(ctx, [_collated(shift=False)])
    verdict, message = found["OBJ013"]
    assert verdict is Verdict.FAIL
    assert message.startswith("labels are the inputs at the same positions: unshifted") and "data.shift = true" in message
    assert "the batches win for this run; OBJ019 counts the shifts" in message
    found = _judge(ctx, [_collated(shift=False)], shift=False)
    assert found["OBJ013"][0] is Verdict.PASS


def test_pad_id_side_bos_and_eos_contradictions_fail_naming_both(ctx):
    found = _judge(ctx, [_collated(pad=2, side="left", mask=False)], bos_id=1, eos_id=3)
    verdict, message = found["OBJ012"]
    assert verdict is Verdict.FAIL
    for part in ("pad_id = 0 declared, the batches pad input_ids with 2",
                 "padding_side = 'right' declared, the batches pad on the left",
                 "bos_id = 1 declared, the batches start 4 of 4 rows with another id",
                 "eos_id = 3 declared, the batches hold 3 in none of 4 rows"):
        assert part in message, message
    assert len(message) <= 300, len(message)  # one sentence a person reads (issue 43)
    found = _judge(ctx, [_collated(pad=2, side="left", mask=False)], pad_id=2, padding_side="left")
    assert found["OBJ012"][0] is Verdict.PASS, found["OBJ012"]


def test_a_row_with_nothing_to_learn_fails_naming_it(ctx):
    batch = _collated()
    batch["labels"][1, :] = -100  # a truncation that cut the whole answer
    verdict, message = _judge(ctx, [_collated(), batch])["OBJ014"]
    assert verdict is Verdict.FAIL and "1 of 8 rows" in message and "batch 2 row 1" in message


def test_ids_outside_the_vocabulary_fail(ctx):
    batch = _collated()
    batch["input_ids"][0, 1] = 300
    batch["labels"][2, 5] = -1  # neither a token nor what the objective ignores
    verdict, message = _judge(ctx, [batch])["OBJ015"]
    assert verdict is Verdict.FAIL
    assert "1 input_ids (300 at batch 1 row 0 position 1)" in message and "1 labels (-1 at" in message


def test_a_mask_of_ones_on_padded_rows_fails(ctx):
    batch = _collated()
    batch["attention_mask"][:] = 1
    verdict, message = _judge(ctx, [batch])["OBJ016"]
    assert verdict is Verdict.FAIL and "1 on padding (the pad run of 0 on the right)" in message


def test_a_mask_that_numbers_packed_sequences_passes_and_one_that_does_not_count_fails(ctx):
    """A packed row's mask may number its sequences 1, 2, ... (MindFormers' DPO packing, LLaMA-
    Factory's neat packing): no false alarm. A mask of 2 on real tokens (not counting from 1) is
    still values other than 0 and 1."""
    batch = _collated()
    real = batch["attention_mask"] != 0
    half = batch["attention_mask"].shape[1] // 4
    numbered = np.where(real, 1, 0)
    numbered[:, half:] *= 2  # the row's second sequence
    batch["attention_mask"] = numbered
    verdict, message = _judge(ctx, [batch])["OBJ016"]
    assert verdict is Verdict.PASS, message
    batch["attention_mask"] = np.where(real, 2, 0)
    verdict, message = _judge(ctx, [batch])["OBJ016"]
    assert verdict is Verdict.FAIL and "values other than 0 and 1" in message


def test_no_labels_column_is_valid(ctx):
    batch = _collated()
    del batch["labels"]
    found = _judge(ctx, [batch])
    for code in ("OBJ010", "OBJ011", "OBJ013"):
        assert found[code][0] is Verdict.SKIP and "no labels column" in found[code][1]
    assert found["OBJ014"][0] is Verdict.PASS and found["OBJ016"][0] is Verdict.PASS


def test_pad_equal_to_eos_keeps_the_last_eos_real():
    from objdebug.pipeline.batches_source import RealBatch
    from objdebug.stages.batches.layout import find_padding

    ids = np.array([[5, 6, 7, 3, 3, 3], [5, 6, 7, 8, 9, 3]])
    padding, pad, side = find_padding(RealBatch(1, {"input_ids": ids}), 3, 3)
    assert (pad, side) == (3, "right")
    assert padding.tolist() == [[False] * 4 + [True] * 2, [False] * 6]


# --------------------------------------------------------------------------- objdebug batches --show
def test_show_marks_each_token_and_wraps_to_the_width(ctx):
    from objdebug.stages.batches.audit import audit
    from objdebug.stages.batches.show import decoder, render

    _judge(ctx, None, target="batches_pad_zero")
    measured = audit(ctx, ctx.profile.section("batches"))
    narrow = render(measured, 2, decoder(ctx.config), width=40)
    assert all(len(line) <= 40 for line in narrow.splitlines()), narrow
    assert any(line.strip() == "⟨0⟩→0×10" for line in narrow.splitlines())  # a piece is never split
    text = render(measured, 2, decoder(ctx.config), width=200)
    lines = text.splitlines()
    assert lines[0].endswith("(the objective ignores -100)") and lines[4].startswith("[wrong-label]")
    assert lines[5].startswith("labels are pre-shifted: each token is marked by its label")
    assert lines[7:] == [
        "batch 1 row 0: 37 positions — 7 trained, 30 ignored, 0 padding, 0 wrong-label",
        "  [ignored]what is the capital of france[trained]? paris[ignored].",
        "batch 1 row 1: 37 positions — 5 trained, 22 ignored, 0 padding, 10 wrong-label",
        "  [ignored]name a primary colour[trained]: red[ignored].[wrong-label]⟨0⟩→0×10 ",  # the seed bug
        "2 of 16 rows read shown"]
    ids_only = render(measured, 1, None, width=200)
    assert "[ignored]⟨119⟩⟨104⟩⟨97⟩⟨116⟩" in ids_only  # no tokenizer: ids ("what")


def test_show_on_the_command_line(tmp_path):
    from typer.testing import CliRunner

    from objdebug.cli import app

    cfg = TARGETS / "batches_healthy" / "objdebug.toml"
    out = CliRunner().invoke(app, ["batches", "-c", str(cfg), "--show", "1"], env={"COLUMNS": "80"})
    assert out.exit_code == 0, out.output
    assert "[padding]" in out.output and "1 of 16 rows read shown" in out.output
    assert "[wrong-label]⟨" not in out.output


def test_the_html_report_shows_the_rows_as_show_marks_them(tmp_path):
    """The seed bug's rows in the HTML report: the view `--show` prints (OBJ014's measured value,
    not a second computation), coloured per class, with the legend; `objdebug render` keeps it."""
    import json
    import re
    from html import unescape

    from typer.testing import CliRunner

    from objdebug.cli import app
    from objdebug.report.batch_rows import LEGEND

    cfg = TARGETS / "batches_pad_zero" / "objdebug.toml"
    out = CliRunner().invoke(app, ["batches", "-c", str(cfg), "--no-cache", "--json", str(tmp_path / "r.json"),
                                   "--html", str(tmp_path / "html")])
    assert out.exit_code == 1, out.output  # OBJ010 fails
    report = json.loads((tmp_path / "r.json").read_text())
    (view,) = [r["value"]["rows_view"] for r in report["results"] if r["check"] == "batch-supervision"]
    assert len(view["rows"]) == 4 and view["total"] == 16  # [batches] report_rows
    page = (tmp_path / "html" / "index.html").read_text()
    assert "Rows of the pipeline's batches" in page and all(unescape(t) in unescape(page) for t in LEGEND.values())
    assert ('<span class="tok-wrong-label"><span class="tag">[wrong-label]</span>⟨0⟩→0×10 </span>'
            in unescape(page))  # the seed bug: labels 0 on the padding, trained
    shown = CliRunner().invoke(app, ["batches", "-c", str(cfg), "--show", "4"], env={"COLUMNS": "1000"}).output
    for row in view["rows"]:  # the same rows, text for text, as the terminal prints them
        i = page.index(f"<h4>{row['title']}</h4>")
        html_text = unescape(re.sub(r"<[^>]+>", "", page[i:page.index("</div>", i)].split("</h4>", 1)[1]))
        assert f"{row['title']}\n  {html_text}\n" in shown, (html_text, shown)
    CliRunner().invoke(app, ["render", str(tmp_path / "r.json"), "--html", str(tmp_path / "again")])
    assert (tmp_path / "again" / "index.html").read_text() == page


def test_a_512_token_row_fits_one_screen_in_the_html_report(ctx):
    """Wrapped, not scrolled: the row's text (tags included) stays within some 25 lines of the
    report's width (1100 px at .85em monospace: ~125 characters a line)."""
    from objdebug.report import batch_rows, html
    from objdebug.stages.batches.audit import audit
    from objdebug.stages.batches.show import decoder, view

    text = list(b"question: what is the tallest mountain on earth? answer: ") * 9
    ids = np.array([text[:512]], np.int64)
    labels = np.concatenate([ids[:, 1:], np.full((1, 1), -100)], axis=1)
    labels[0, :57] = -100  # the prompt (and the last position: no next token)
    _judge(ctx, [{"input_ids": ids, "labels": labels, "attention_mask": np.ones_like(ids)}])
    shown = view(audit(ctx, ctx.profile.section("batches")), 1, decoder(ctx.config))
    (row,) = shown["rows"]
    assert row["title"].startswith("batch 1 row 0: 512 positions — 454 trained, 58 ignored")
    page = batch_rows.html(shown)
    visible = re.sub(r"<[^>]+>", "", page[page.index('<div class="tokens">'):page.index("</div>")])
    assert len(unescape(visible)) <= 25 * 125, len(visible)
    assert "white-space:pre-wrap;overflow-wrap:anywhere" in html.render(
        {"results": [], "versions": {}, "summary": {}}, figures=[])


def test_show_needs_batches_and_a_positive_count():
    from typer.testing import CliRunner

    from objdebug.cli import app
    from .conftest import cli_exit_2

    helps = {c: CliRunner().invoke(app, [c, "--help"], env={"COLUMNS": "200"}).output
             for c in ("batches", "run", "align")}
    assert "--show" in helps["batches"] and "Stage 0:" in helps["batches"]
    assert "--show" not in helps["run"] and "--show" not in helps["align"]

    cli_exit_2(["batches", "-c", TARGETS / "tiny" / "objdebug.toml", "--show", "2"],
               "For '--show', [data] batches must name the pipeline's batches")
    cli_exit_2(["batches", "-c", TARGETS / "batches_healthy" / "objdebug.toml", "--show", "0"],
               "For '--show', the value must be a number of rows >= 1, but got 0.")


def test_a_repeated_token_ending_full_rows_is_not_padding():
    """No false alarm: '!!' ending rows (an id that occurs elsewhere too) is text, not padding."""
    from objdebug.pipeline.batches_source import RealBatch
    from objdebug.stages.batches.layout import find_padding

    ids = np.array([[33, 5, 6, 7, 33, 33], [5, 6, 7, 8, 33, 33]])
    padding, pad, side = find_padding(RealBatch(1, {"input_ids": ids}), 0, None)
    assert pad is None and not padding.any()
    ids = np.array([[5, 6, 7, 9, 9, 9], [5, 6, 7, 8, 4, 9]])  # 9 only at the edge: padding
    padding, pad, side = find_padding(RealBatch(1, {"input_ids": ids}), 0, None)
    assert (pad, side) == (9, "right") and padding.sum() == 4


def test_a_full_row_ending_in_eos_equal_to_pad_keeps_its_mask(ctx):
    """HF style with pad == eos and eos_id undeclared: the full-length row's final EOS has mask 1."""
    batch = _collated(pad=3)
    longest = int(batch["attention_mask"].sum(axis=1).argmax())
    batch["input_ids"][longest, -1] = 3  # the longest row ends with EOS (= the pad id)
    found = _judge(ctx, [batch], pad_id=3)
    assert found["OBJ016"][0] is Verdict.PASS, found["OBJ016"]
    batch["attention_mask"][0, :] = 1  # a padded row whose mask is all ones still fails
    verdict, message = _judge(ctx, [batch], pad_id=3)["OBJ016"]
    assert verdict is Verdict.FAIL and "batch 1 row 0" in message


@pytest.mark.parametrize("column", ["response_start", "prompt_length", "loss_mask"])
def test_the_prompt_boundary_from_a_column_of_the_pipeline(ctx, column):
    """No align rows needed when the batch says where the answer starts (prompts of 'ask: ' ...
    that no configured row holds); one token too long is caught from each kind of column."""
    batch = _collated()
    answer = np.array([5, 3, 7, 2])  # len("ask: "), len("q? "), ... : every row right-padded
    if column == "response_start":
        batch[column] = answer
    elif column == "prompt_length":
        batch[column] = answer[:, None]  # [B, 1] is one number per row too
    else:
        batch[column] = (batch["labels"] != -100).astype(np.int64)
    found = _judge(ctx, [batch], align=None)
    assert found["OBJ017"][0] is Verdict.PASS and found["OBJ018"][0] is Verdict.PASS, found
    assert "all 4 rows whose prompt is known" in found["OBJ017"][1]
    batch["labels"][2, answer[2] - 1] = -100  # row 2's first answer token masked
    verdict, message = _judge(ctx, [batch], align=None)["OBJ018"]  # the column still says where
    assert verdict is Verdict.FAIL and "batch 1 row 2" in message


def test_without_a_boundary_the_prompt_checks_skip_saying_why(ctx):
    found = _judge(ctx, [_collated()], align=None)
    assert found["OBJ017"][0] is Verdict.SKIP and "no prompt boundary" in found["OBJ017"][1]


# --------------------------------------------------------------------------- one shift in all (OBJ019)
def test_the_hf_collator_with_a_loss_that_shifts_inside_passes(hf):
    found = _judge(hf, None, target="batches_hf_shift")
    assert all(v is Verdict.PASS for v, _ in _without_eos_checks(found).values()), found
    verdict, message = found["OBJ019"]
    assert message.startswith("one shift in all: labels are the inputs at the same positions: unshifted")
    assert "(0 at 100%" in message
    assert "the objective scores logits[t] against labels[t+1] (measured" in message


def test_the_hf_collator_with_a_loss_that_does_not_shift_fails_no_shift(ctx):
    from fixtures.batch_pipelines import hf_collator

    found = _judge(ctx, list(hf_collator()), shift=False)
    assert found["OBJ013"][0] is Verdict.PASS  # the declaration matches the labels
    verdict, message = found["OBJ019"]
    assert verdict is Verdict.FAIL
    assert message.startswith("no shift: each position trains toward its own input token")
    assert "labels are the inputs at the same positions: unshifted" in message and "(0 at 100%" in message
    assert "the objective scores logits[t] against labels[t] (measured" in message


def test_a_pre_shifting_collator_with_a_loss_that_shifts_inside_fails_two_shifts(hf):
    found = _judge(hf, _fixture_batches(), target="batches_hf_shift", shift=True)
    assert found["OBJ013"][0] is Verdict.PASS
    verdict, message = found["OBJ019"]
    assert verdict is Verdict.FAIL
    assert message.startswith("2 shifts: each position trains toward the token 2 ahead:")
    assert "labels are the inputs 1 position ahead: shifted once (pre-shifted) (+1 at 100%" in message
    assert "the objective scores logits[t] against labels[t+1] (measured" in message


# --------------------------------------------------------------------------- how rows end (OBJ020-OBJ022)
def _pipeline(name, **kwargs):
    import fixtures.batch_pipelines as pipelines

    return list(getattr(pipelines, name)(**kwargs))


def test_an_eos_masked_with_the_pad_id_fails_and_a_trained_one_passes(ctx):
    found = _judge(ctx, _pipeline("eos_framed"), eos_id=0)
    assert found["OBJ020"] == (Verdict.PASS, "every EOS (0) in 4 of 4 rows is a trained label "
                                             "(the others fill their batch)")
    found = _judge(ctx, _pipeline("eos_framed", mask_pad_labels=True), eos_id=0)
    verdict, message = found["OBJ020"]
    assert verdict is Verdict.FAIL
    assert message.startswith("the EOS (0) is not a trained label in 4 of 4 rows holding it "
                              "(batch 1 row 0, batch 1 row 1")
    assert "pad == eos" in message and "data.eos_id = 0" in message


def test_a_row_shorter_than_its_batch_without_eos_fails(ctx):
    found = _judge(ctx, _pipeline("shifted_into_padding", bug=False), eos_id=3)
    verdict, message = found["OBJ020"]
    assert verdict is Verdict.FAIL and "rows shorter than their batch hold no EOS" in message


def test_the_last_token_trained_toward_padding_fails_and_a_masked_one_passes(ctx):
    found = _judge(ctx, _pipeline("shifted_into_padding", bug=False))
    assert found["OBJ021"][0] is Verdict.PASS
    assert "0 of 4 rows train it toward another label" in found["OBJ021"][1]
    found = _judge(ctx, _pipeline("shifted_into_padding"))
    verdict, message = found["OBJ021"]
    assert verdict is Verdict.FAIL
    assert message.startswith("the last real token is trained toward the pad id 0 in 4 of 4 rows")
    assert "its own label (pre-shifted)" in message


def test_positions_running_on_across_an_eos_fail_and_reset_ones_pass(ctx):
    found = _judge(ctx, _pipeline("packed"), eos_id=3)
    assert found["OBJ022"] == (Verdict.PASS, found["OBJ022"][1])
    assert "reset after every EOS inside a row (2 in" in found["OBJ022"][1]
    found = _judge(ctx, _pipeline("packed", reset=False), eos_id=3)
    verdict, message = found["OBJ022"]
    assert verdict is Verdict.FAIL
    assert message.startswith("position_ids run on across an EOS (3) inside the row in 2 rows "
                              "(batch 1 row 0 after position 37")
    assert found["OBJ020"][0] is Verdict.PASS  # every EOS (both documents') is trained


# --------------------------------------------------------------------------- docs/config.md's examples
def _doc_pipelines(tmp_path) -> tuple[dict[str, str], str]:
    """({module: its code} of the docs' python examples (first line `# mypipe/NAME.py`), the rows'
    path): each example installed as `docs_NAME`, and the rows it reads written from the
    fixtures' align pairs."""
    import json
    import re

    from fixtures.batch_pipelines import _pairs

    text = (TARGETS.parent.parent / "docs" / "config.md").read_text(encoding="utf-8")
    start = text.index("Three pipelines as they are usually written")
    blocks = re.findall(r"```python\n# mypipe/(\w+)\.py\n(.*?)```", text[start:], re.S)
    modules = {}
    for name, code in blocks:
        mod = types.ModuleType(f"docs_{name}")
        exec(compile(code, f"docs/config.md:{name}", "exec"), mod.__dict__)  # noqa: S102
        sys.modules[mod.__name__] = mod
        modules[name] = mod.__name__
    rows = tmp_path / "train.jsonl"
    rows.write_text("".join(json.dumps({"prompt_ids": p, "answer_ids": r}) + "\n"
                            for p, r in _pairs()), encoding="utf-8")
    return modules, str(rows)


@pytest.mark.parametrize("name", ["generator", "collator"])
def test_the_docs_pipeline_examples_pass_the_stage(ctx, tmp_path, name):
    modules, rows = _doc_pipelines(tmp_path)
    try:
        found = _judge(ctx, None, source=f"{modules[name]}:make_batches",
                       batches_kwargs={"path": rows})
    finally:
        for m in modules.values():
            sys.modules.pop(m, None)
    skipped = {"OBJ016"} if name == "generator" else set()  # a GeneratorDataset: no mask column
    assert all(v is Verdict.PASS for c, (v, _) in _without_eos_checks(found).items()
               if c not in skipped), found
    assert "labels are the inputs 1 position ahead: shifted once (pre-shifted)" in found["OBJ013"][1] and "7 rows" in found["OBJ012"][1]


def test_the_docs_mindrecord_example_passes_the_stage(hf):
    """The docs' keys (batch_size 4, shift = false) on the fixture's MindFormers-style file."""
    import tomllib

    text = (TARGETS.parent.parent / "docs" / "config.md").read_text(encoding="utf-8")
    start = text.index("A **MindRecord** file")
    keys = tomllib.loads(text[start:].split("```toml\n", 1)[1].split("```", 1)[0])["data"]
    assert keys.pop("batches") == "data/train.mindrecord"
    found = _judge(hf, None, target="batches_hf_shift",
                   source=str(TARGETS / "batches_mindrecord" / "healthy.mindrecord"), **keys)
    assert found.pop("OBJ016")[0] is Verdict.SKIP  # no mask column
    assert all(v is Verdict.PASS for v, _ in _without_eos_checks(found).values()), found
    assert "labels are the inputs at the same positions: unshifted" in found["OBJ013"][1] and "7 rows" in found["OBJ012"][1]
