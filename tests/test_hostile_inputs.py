"""Hostile data and settings (issue 9): exit 2 with one line that names file and line, profile key
or command line; never a check crash, never a replaced report. Model-free except OBJ105."""

import json
import shutil
from pathlib import Path

import pytest

from .conftest import cli_exit_2
from typer.testing import CliRunner
from objdebug.pipeline.runner import run_check  # the runner reviews verdicts (untrained-model notes)


ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "synthetic.json"
runner = CliRunner()



def _append(path: Path, raw: bytes) -> int:
    """Append one raw line; returns its line number."""
    text = path.read_bytes()
    path.write_bytes(text + raw + b"\n")
    return text.count(b"\n") + 1


# --------------------------------------------------------------------------- data files
def test_non_utf8_data_names_file_and_line_and_keeps_the_old_report(tiny_target):
    data = tiny_target / "align.jsonl"
    line = _append(data, b'{"id": "x", "prompt": "caf\xe9", "good": "a", "bad": "b"}')
    old = tiny_target / "r.json"
    shutil.copy(GOLDEN, old)
    before = old.read_bytes()
    cli_exit_2(["align", "-c", tiny_target / "objdebug.toml", "--json", old],
           f"align.jsonl:{line}: not UTF-8 text: byte 0xe9")
    assert old.read_bytes() == before


@pytest.mark.parametrize("score", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_scores(tiny_target, score):
    scores = tiny_target / "scores.jsonl"
    scores.write_text('{"id": "a", "response": "ok", "score": 3}\n'
                      f'{{"id": "b", "response": "ok", "score": {score}}}\n')
    cli_exit_2(["correlate", "-c", tiny_target / "objdebug.toml", "--set", f"data.scores='{scores}'"],
           "scores.jsonl:2: not valid JSON", score)


def test_non_finite_aspect_score_in_a_large_integer(tiny_target):
    scores = tiny_target / "scores.jsonl"
    scores.write_text('{"id": "a", "response": "ok", "score": 3, "scores": {"fluency": %d}}\n' % 10 ** 400)
    cli_exit_2(["correlate", "-c", tiny_target / "objdebug.toml", "--set", f"data.scores='{scores}'"],
           "scores.jsonl:1: field 'scores' must be an object of finite numbers")


def test_misspelled_row_key(tiny_target):
    data = tiny_target / "align.jsonl"
    rows = [json.loads(x) for x in data.read_text().splitlines()]
    for r in rows:
        r["medum"] = r.pop("medium")
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cli_exit_2(["align", "-c", tiny_target / "objdebug.toml"],
           "align.jsonl:1: unknown field 'medum' (did you mean 'medium'?)")


def test_text_and_ids_for_one_field(tiny_target):
    line = _append(tiny_target / "align.jsonl",
                   b'{"id": "x", "prompt": "p", "good": "a", "good_ids": [1, 2], "bad": "b"}')
    cli_exit_2(["align", "-c", tiny_target / "objdebug.toml"],
           f"align.jsonl:{line}: the row has both 'good' and 'good_ids'")


def test_a_field_twice_in_one_row(tiny_target):
    line = _append(tiny_target / "align.jsonl",
                   b'{"id": "x", "prompt": "p", "good": "a", "bad": "b", "bad": "c"}')
    cli_exit_2(["align", "-c", tiny_target / "objdebug.toml"],
           f"align.jsonl:{line}: not valid JSON: field 'bad' appears twice")


# --------------------------------------------------------------------------- profiles
@pytest.mark.parametrize("text, needle", [
    ("[align]\ngap_pas = 2.0\n", "For '[align] gap_pas', unknown profile key (did you mean 'gap_pass'?)"),
    ("[align]\ngap_pass = \"big\"\n", "For '[align] gap_pass', the value must be a number"),
    ("[align]\nmin_rows = 6.5\n", "For '[align] min_rows', the value must be an integer"),
    ("[stress]\nlong_lengths = [2048.5]\n", "For '[stress] long_lengths', the value must be a list of integers"),
    ("[grad]\nfd_rel_steps = 0.01\n", "For '[grad] fd_rel_steps', the value must be a list of numbers"),
    ("fail_onn = \"warn\"\n", "For 'fail_onn', unknown profile key (did you mean 'fail_on'?)"),
    ("[alig]\ngap_pass = 2.0\n", "For 'alig', unknown profile key (did you mean 'align'?)"),
    ("align = 3\n", "For 'align', the value must be a table ([align])"),
    ("[stress]\nlow_precision_rtol = { float16 = \"x\" }\n",
     "For '[stress.low_precision_rtol] float16', the value must be a number"),
    ("[baseline.directions]\nOBJ4 = 3\n", "For '[baseline.directions] OBJ4', the value must be a string"),
])
def test_profile_keys_and_types_checked_against_default(tiny_target, tmp_path, text, needle):
    profile = tmp_path / "mine.toml"
    profile.write_text('extends = "default"\n' + text)
    cli_exit_2(["align", "-c", tiny_target / "objdebug.toml", "-p", profile], f"{profile}: {needle}")


def test_profile_open_tables_and_int_for_float_are_accepted(tmp_path):
    from objdebug.pipeline.profile import load_profile

    profile = tmp_path / "mine.toml"
    profile.write_text('extends = "default"\n[align]\ngap_pass = 2\n[baseline.tolerances]\nOBJ101 = 0.5\n'
                       '[baseline.directions]\nOBJ4 = "higher"\n[stress]\n'
                       'low_precision_rtol = { float16 = 1e-2, float8 = 1 }\n')
    prof = load_profile(str(profile))
    assert prof.section("baseline")["tolerances"] == {"OBJ101": 0.5}
    for name in ("default", "quick", "full", "ci-gate"):
        load_profile(name)


# --------------------------------------------------------------------------- command line
@pytest.mark.parametrize("args, needle", [
    (["--mode", "fast"], "command line (--mode fast): For 'run.mode', the value must be in"),
    (["--set", "data.pad_id="], "For '--set data.pad_id=', the value is empty"),
    (["--set", "data.pad_id=x"], "command line (--set data.pad_id=x): For 'data.pad_id', the value must be int"),
    (["--set", "data.padd_id=1"], "command line (--set data.padd_id=1): unknown key(s) ['padd_id']"),
    (["--set", "run.seed=1.5"], "command line (--set run.seed=1.5): For 'run.seed'"),
])
def test_command_line_errors_name_the_command_line(tiny_target, args, needle):
    out = cli_exit_2(["align", "-c", tiny_target / "objdebug.toml", *args], needle)
    assert "objdebug.toml" not in out


# --------------------------------------------------------------------------- render
@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.__setitem__("summary", "x"), "'summary' must be an object of counts, but got str"),
    (lambda d: d.__setitem__("results", None), "'results' must be a list, but got null"),
    (lambda d: d["results"][0].pop("findings"), "'results[0].findings' must be a list"),
    (lambda d: d["results"][1]["findings"][0].pop("verdict"), "'results[1].findings[0].verdict' must be one of"),
    (lambda d: d["results"][1]["findings"][0].__setitem__("code", 101), "'results[1].findings[0].code' must be a string"),
    (lambda d: d.__setitem__("target", []), "'target' must be an object, but got list"),
    (lambda d: d.__setitem__("stages", "align"), "'stages' must be a list"),
])
def test_render_on_a_broken_report(tmp_path, mutate, needle):
    data = json.loads(GOLDEN.read_text())
    mutate(data)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    cli_exit_2(["render", path, "--junit", tmp_path / "r.xml"], f"{path}: not a well-formed objdebug report",
           needle)
    assert not (tmp_path / "r.xml").exists()


# --------------------------------------------------------------------------- OBJ105
def test_padding_label_out_of_range_for_the_objective_is_explained(tiny_target):
    """ignore_index = 0 while the pipeline pads labels with -100: MaskedCrossEntropy rejects -100
    (GatherD); OBJ105 says the padding label is out of range for the objective and what to set."""
    from objdebug.core.config import load_config
    from objdebug.pipeline.context import Context
    from objdebug.engine.core import Engine
    from objdebug.pipeline.profile import load_profile
    from objdebug.stages.align import LabelPadMasking
    from objdebug.engine.target import load_target

    cfg = load_config(tiny_target / "objdebug.toml", overrides={"objective.kwargs": {"ignore_index": 0},
                                                                 "data.vocab_size": 256})
    target = load_target(cfg)
    ctx = Context(config=cfg, target=target, engine=Engine(target), profile=load_profile("default"))
    (f,) = run_check(LabelPadMasking(), ctx, ctx.profile.section("align")).findings
    assert f.verdict.value == "FAIL"
    assert "the objective rejects label_pad_id=-100" in f.message
    assert "set the objective's ignore_index to -100, or data.label_pad_id" in f.message
