"""Issue 23, second and third groups: exit 2 (one line, before any work) where exit 3 or a wrong
result came after the whole run; outputs all-or-nothing. Almost all of these stop before MindSpore
starts, so they run in-process; the deleted working directory needs a real process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import example, given, settings, strategies as st

from objdebug.core.config import load_config
from objdebug.core.errors import InputError

from .conftest import cli_exit_2, digest

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "fixtures" / "targets" / "tiny" / "objdebug.toml"
GOLDEN = ROOT / "tests" / "golden" / "synthetic.json"


def _run(target, *args):
    return ["run", "-c", target / "objdebug.toml", "--stages", "align", *args]


# --------------------------------------------------------------------------- config types and ranges
@pytest.mark.parametrize("key, value", [("model.checkpoint", "5"), ("data.align", '["a.jsonl"]'),
                                        ("data.tokenizer", "5"), ("data.scores", "true"),
                                        ("run.compile_cache", "[1]")])
def test_path_keys_of_the_wrong_type(tiny_target, key, value):
    cli_exit_2(_run(tiny_target, "--set", f"{key}={value}"), f"'{key}'", "must be str")


@pytest.mark.parametrize("seed", ["-1", "99999999999"])
def test_seed_out_of_range(tiny_target, seed):
    cli_exit_2(_run(tiny_target, "--seed", seed), "'run.seed'", "[0, 4294967295]", f"--seed {seed}")


@settings(max_examples=50, deadline=None)
@given(key=st.sampled_from(["data.pad_id", "data.label_pad_id", "data.vocab_size", "data.max_length",
                            "run.seed"]),
       value=st.one_of(st.integers(max_value=-2 ** 31 - 1), st.integers(min_value=2 ** 32)))
def test_ids_and_lengths_out_of_range(key, value):
    """label_pad_id=9999999999 wrapped to 1410065407 in int32: every id, length and seed is
    range-checked (lengths and sizes from 1, ids within int32, seeds within uint32)."""
    with pytest.raises(InputError, match=key):
        load_config(TINY, overrides={key: value})


@pytest.mark.parametrize("value", [0, -3])
def test_max_length_must_be_positive(tiny_target, value):
    cli_exit_2(_run(tiny_target, "--set", f"data.max_length={value}"), "'data.max_length'", "[1,")


def test_label_pad_id_beyond_int32(tiny_target):
    cli_exit_2(_run(tiny_target, "--set", "data.label_pad_id=9999999999"), "'data.label_pad_id'",
               "2147483647")


def test_a_utf8_byte_order_mark_is_accepted(tiny_target):
    cfg = tiny_target / "objdebug.toml"
    cfg.write_bytes(b"\xef\xbb\xbf" + cfg.read_bytes())
    assert load_config(cfg).data.label_pad_id == -100


def test_pyproject_tool_not_a_table(tiny_target, monkeypatch):
    (tiny_target / "objdebug.toml").unlink()
    (tiny_target / "pyproject.toml").write_text("tool = 5\n")
    monkeypatch.chdir(tiny_target)
    cli_exit_2(["run", "--stages", "align"], "pyproject.toml", "'tool'")


def test_a_broken_pyproject_is_a_toml_error_naming_it(tiny_target, monkeypatch):
    (tiny_target / "objdebug.toml").unlink()
    (tiny_target / "pyproject.toml").write_text("[tool.objdebug\n")
    monkeypatch.chdir(tiny_target)
    out = cli_exit_2(["run", "--stages", "align"], "pyproject.toml", "not valid TOML")
    assert "no objdebug.toml" not in out


@pytest.mark.parametrize("extends, needle", [("5", "'extends'"), ('"nosuch"', "'nosuch'")])
def test_profile_extends_blames_the_profile_file(tiny_target, extends, needle):
    prof = tiny_target / "p.toml"
    prof.write_text(f"extends = {extends}\n")
    out = cli_exit_2(_run(tiny_target, "--profile", prof), needle, str(prof))
    assert "--profile" not in out


# --------------------------------------------------------------------------- data rows
def test_an_empty_bad_answer_is_refused(tiny_target):
    path = tiny_target / "align.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[1]["bad"] = ""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cli_exit_2(_run(tiny_target), f"{path}:2:", "field 'bad' is empty")


@pytest.mark.parametrize("what, row, typo", [
    ("preference", {"prompt": "a", "chosen": "b", "rejected": "c", "strenght": 1.0}, "strenght"),
    ("text", {"id": "d1", "txt": "hello world"}, "txt")])
def test_unknown_fields_in_preference_and_text_rows(tiny_target, what, row, typo):
    path = tiny_target / f"{what}.jsonl"
    path.write_text(json.dumps({**row, "id": "r0"} if what == "preference" else row) + "\n")
    out = cli_exit_2(_run(tiny_target, "--set", f"data.{what}={what}.jsonl"), f"{path}:1:",
                     f"unknown field '{typo}'")
    assert ("'strength'" if what == "preference" else "'text'") in out


# --------------------------------------------------------------------------- output paths
@pytest.mark.parametrize("length", [250, 5000])
def test_json_names_over_the_os_limit(tiny_target, tmp_path, length):
    cli_exit_2(_run(tiny_target, "--json", tmp_path / ("a" * (length - 5) + ".json")), "'--json'",
               "limit")


@pytest.mark.parametrize("flag, name", [("--html", "index.html"), ("--markdown", "report.md")])
def test_a_directory_where_the_report_file_goes(tiny_target, tmp_path, flag, name):
    """Detected before any work: the JSON report is not replaced, no temporary is left."""
    (tmp_path / "rep" / name).mkdir(parents=True)
    old = tmp_path / "r.json"
    old.write_text("old\n")
    cli_exit_2(_run(tiny_target, "--json", old, flag, tmp_path / "rep"), flag, "is a directory",
               unchanged=[old])
    assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == [name]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_an_unwritable_step_summary(tiny_target, monkeypatch):
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tiny_target / "objdebug.toml" / "summary.md"))
    cli_exit_2(_run(tiny_target, "--output-format", "github"), "GITHUB_STEP_SUMMARY")


@pytest.mark.parametrize("change", ["no code", "no verdict", "config a list"])
def test_a_bad_baseline_is_refused_before_the_run(tiny_target, tmp_path, change):
    report = json.loads(GOLDEN.read_text())
    finding = report["results"][0]["findings"][0]
    if change == "no code":
        del finding["code"]
    elif change == "no verdict":
        del finding["verdict"]
    else:
        report["config"] = []
    bad = tmp_path / "b.json"
    bad.write_text(json.dumps(report))
    cli_exit_2(_run(tiny_target, "--baseline", bad), str(bad))


def test_workers_beyond_the_cpu_count(tiny_target):
    cli_exit_2(_run(tiny_target, "--workers", str((os.cpu_count() or 1) + 1)), "'--workers'",
               "CPU count")


def test_init_max_probe_length_must_be_positive(tmp_path):
    cli_exit_2(["init", "--model", "objdebug.demo.model:build_model", "--objective",
                "objdebug.losses:MaskedCrossEntropy", "--output", tmp_path / "o.toml",
                "--max-probe-length", "-5"], "'--max-probe-length'", "-5")
    assert not (tmp_path / "o.toml").exists()


def test_a_deleted_working_directory(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", "import os, runpy, sys; os.chdir(sys.argv[1]); "
                             "os.rmdir(sys.argv[1]); sys.argv = ['objdebug', 'run', '-c', sys.argv[2]]; "
                             "runpy.run_module('objdebug.cli', run_name='__main__')", str(gone), str(TINY)],
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert err.strip() == ("objdebug: error: the working directory no longer exists (it was deleted); "
                           "cd to an existing directory")


# --------------------------------------------------------------------------- render, monitor-log
def _prune(report, path):
    node = report
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]


def _paths(node, prefix=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node[:2]):
            yield from _paths(v, prefix + (i,))


_GOLDEN_PATHS = [p for p in _paths(json.loads(GOLDEN.read_text())) if len(p) <= 6]


@settings(max_examples=6, deadline=None)
@given(path=st.sampled_from(_GOLDEN_PATHS))
@example(path=("device",))  # was exit 3: KeyError 'device'
def test_render_of_a_report_missing_a_field_is_never_exit_3(tmp_path_factory, path):
    from typer.testing import CliRunner

    from objdebug.cli import app

    tmp = tmp_path_factory.mktemp("render")
    report = json.loads(GOLDEN.read_text())
    _prune(report, path)
    (tmp / "r.json").write_text(json.dumps(report))
    res = CliRunner().invoke(app, ["render", str(tmp / "r.json"), "--html", str(tmp / "h"),
                                   "--markdown", str(tmp / "m"), "--junit", str(tmp / "j.xml"),
                                   "--output-format", "github"],
                             env={"GITHUB_STEP_SUMMARY": str(tmp / "summary.md")})
    assert res.exit_code in (0, 2), (path, res.output)
    assert "internal error" not in res.output, (path, res.output)


def _monitor_log(tmp_path, thresholds=None):
    from objdebug.monitor.log import SCHEMA

    header = {"type": "header", "schema": SCHEMA, "components": [], "every": 1,
              "thresholds": thresholds if thresholds is not None else {"dead_steps": 10}}
    steps = [{"type": "step", "step": i, "loss": 2.0 - 0.1 * i, "findings": []} for i in range(1, 4)]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in [header, *steps]))
    return path


def test_monitor_log_header_threshold_a_string(tmp_path):
    path = _monitor_log(tmp_path, {"scale_warn": "100"})
    cli_exit_2(["monitor-log", path], f"{path}:1:", "'scale_warn'", "must be a number")


def test_monitor_log_tolerates_a_cut_last_line(tmp_path):
    from typer.testing import CliRunner

    from objdebug.cli import app

    path = _monitor_log(tmp_path)
    path.write_text(path.read_text() + '{"type": "step", "step": 4, "lo')  # killed mid-write
    res = CliRunner().invoke(app, ["monitor-log", str(path)])
    assert res.exit_code == 0, res.output
    assert "3 steps" in res.output and "line 5 cut" in res.output


def test_monitor_log_says_a_run_report_is_a_run_report():
    out = cli_exit_2(["monitor-log", GOLDEN], "objdebug run report", "objdebug render")
    assert "not valid JSON" not in out


@settings(max_examples=30, deadline=None)
@given(scale=st.sampled_from([1e300, 1e-300, 1e200, 3.7e250]), seed=st.integers(0, 100))
def test_huge_scores_give_the_same_correlation_and_ci_without_warnings(scale, seed):
    """Scores of 1e300 gave a CI of [0.000, 0.000] and numpy overflow warnings."""
    import warnings

    import numpy as np

    from objdebug.core import stats

    rng = np.random.default_rng(seed)
    loss = rng.normal(size=20)
    score = -loss + rng.normal(scale=0.5, size=20)
    ref = stats.bootstrap_pearson_ci(loss, score, n_resamples=200, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="raise"):
            big = stats.bootstrap_pearson_ci(loss, score * scale, n_resamples=200, seed=0)
            r = stats.correlations(loss, score * scale)
    assert r.pearson_r == pytest.approx(stats.correlations(loss, score).pearson_r, abs=1e-12)
    assert (big.low, big.high) == pytest.approx((ref.low, ref.high), abs=1e-9)
