"""Issue 23, first group: the gate never passes without checking anything.

A string where a list is expected, a selection that matches no code (or none of the stages that
run), a run whose findings are all skips, a target that ends the process with sys.exit(0) or
os._exit(0): none of them may exit 0. Config errors run in-process (no MindSpore); the verdicts
come from real CLI processes on the tiny target.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from objdebug.core.config import load_config
from objdebug.core.errors import InputError
from objdebug.core.findings import CheckResult, Finding, Verdict
from objdebug.pipeline import selection

from .conftest import cli_exit_2, messages

ROOT = Path(__file__).resolve().parent.parent
# the tiny target with an objective that scores the padded positions: OBJ105 fails on it
FAILING = ["--set", "objective.kwargs={ignore_index=0}"]


def _cli(args, cwd, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "objdebug.cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _append_run(target: Path, text: str) -> Path:
    """Add keys to the tiny config's [run] table (its last table)."""
    cfg = target / "objdebug.toml"
    cfg.write_text(cfg.read_text() + text + "\n")
    return cfg


# --------------------------------------------------------------------------- list keys given a string
@pytest.mark.parametrize("key", ["ignore", "select", "stages"])
def test_a_string_for_a_list_key_names_the_key(tiny_target, key):
    cfg = _append_run(tiny_target, f'{key} = "OBJ103"' if key != "stages" else 'stages = "align"')
    out = cli_exit_2(["run", "-c", cfg, "-q"], f"run.{key}", "list of strings")
    assert "--stages" not in out


@settings(max_examples=40, deadline=None)
@given(key=st.sampled_from(["stages", "select", "ignore"]),
       value=st.one_of(st.text(max_size=12), st.integers(), st.lists(st.integers(), min_size=1,
                                                                        max_size=3)))
def test_any_non_list_of_strings_is_refused(key, value):
    """Never read letter by letter: a string, a number, a list of numbers -> exit 2 naming run.KEY."""
    target = ROOT / "fixtures" / "targets" / "tiny" / "objdebug.toml"
    with pytest.raises(InputError, match=f"run.{key}"):
        load_config(target, overrides={f"run.{key}": value})


def test_an_unknown_stage_in_the_config_names_the_config_key(tiny_target):
    cfg = _append_run(tiny_target, 'stages = ["algin"]')
    out = cli_exit_2(["run", "-c", cfg, "-q"], "run.stages", "'algin'")
    assert "--stages" not in out


# --------------------------------------------------------------------------- selections
def test_codes_are_case_insensitive():
    assert selection.prefixes(["obj105", " Obj1 "], "--select") == ["OBJ105", "OBJ1"]


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="OBJ0123456789xyz_-", min_size=1, max_size=8))
def test_a_prefix_matching_no_code_is_refused(text):
    from objdebug.rules import all_rules

    if any(code.startswith(text.strip().upper()) for code in all_rules()) and text.strip():
        assert selection.prefixes([text], "--select") == [text.strip().upper()]
    else:
        with pytest.raises(InputError, match="--select"):
            selection.prefixes([text], "--select")


@pytest.mark.parametrize("flag, value", [("--select", "OBJ99"), ("--select", "obj1O5"),
                                         ("--ignore", "OBX")])
def test_a_selection_matching_no_code_is_exit_2(tiny_target, flag, value):
    cli_exit_2(["run", "-c", tiny_target / "objdebug.toml", "--stages", "align", flag, value],
               flag, repr(value))


def test_a_selection_keeping_no_code_of_the_stages_is_exit_2(tiny_target):
    cli_exit_2(["run", "-c", tiny_target / "objdebug.toml", "--stages", "align", "--select", "OBJ8"],
               "nothing to check", "['align']")
    cli_exit_2(["run", "-c", tiny_target / "objdebug.toml", "--stages", "align", "--ignore", "OBJ"],
               "nothing to check")


def test_config_ignore_matching_no_code_names_the_config(tiny_target):
    cfg = _append_run(tiny_target, 'ignore = ["OBJ999"]')
    cli_exit_2(["run", "-c", cfg, "--stages", "align"], "run.ignore", str(cfg))


@pytest.mark.slow
def test_a_lower_case_selection_still_fails_a_failing_target(tiny_target):
    """`--select obj105` on a target whose OBJ105 fails: exit 1 (was: 0, 'PASSED: 0 pass')."""
    proc = _cli(["run", "--stages", "align", "-q", *FAILING, "--select", "obj105"], tiny_target)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith("FAILED: 0 pass, 0 warn, 1 fail"), proc.stdout


# --------------------------------------------------------------------------- nothing checked
def _result(*verdicts):
    res = CheckResult(stage="align", check="alignment")
    res.findings = [Finding(code="OBJ101", verdict=v, message="m") for v in verdicts]
    return res


@pytest.mark.parametrize("verdicts, fails", [((), True), ((Verdict.SKIP,), True),
                                             ((Verdict.SKIP, Verdict.INFO), True),
                                             ((Verdict.SKIP, Verdict.PASS), False),
                                             ((Verdict.WARN,), False), ((Verdict.ERROR,), False)])
def test_nothing_checked(verdicts, fails):
    res = selection.nothing_checked([_result(*verdicts)])
    assert (res is not None) == fails
    if fails:
        (f,) = res.findings
        assert f.code == "OBJ005" and f.verdict is Verdict.FAIL and "nothing was checked" in f.message


def test_a_run_whose_checks_all_skip_is_not_a_pass(tiny_target, tmp_path):
    """The tiny target has no preference objective: every check of the stage skips -> exit 1."""
    proc = _cli(["run", "--stages", "preference", "--json", tmp_path / "r.json"], tiny_target)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "OBJ005" in proc.stdout and "nothing was checked" in proc.stdout
    import json

    report = json.loads((tmp_path / "r.json").read_text())
    assert report["passed"] is False and report["exit_code"] == 1


# --------------------------------------------------------------------------- the target ends the process
@pytest.mark.parametrize("call, where", [
    ("sys.exit(0)", "build"), ("os._exit(0)", "build"), ("sys.exit(0)", "import")])
def test_a_target_that_exits_is_exit_2(tiny_target, call, where):
    body = f"import os, sys\n{call}\n" if where == "import" else \
        f"import os, sys\n\ndef build(**kwargs):\n    {call}\n"
    (tiny_target / "exiting.py").write_text(body + ("def build(**kwargs):\n    pass\n"
                                                     if where == "import" else ""))
    proc = _cli(["run", "--stages", "align", "-q", "--set", "objective.factory=exiting:build"],
                tiny_target)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = messages(proc.stderr)
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"called {call.split('(')[0]}(0)" in lines[0] and "objective.factory" in lines[0], lines


def test_os_exit_in_a_forked_child_still_ends_the_child():
    """The guard raises only in the process that set it: a forked child's os._exit is real."""
    from objdebug.engine.exit_guard import user_exits

    with pytest.raises(InputError, match=r"os\._exit\(3\)"):
        with user_exits("the test"):
            pid = os.fork()
            if pid == 0:
                os._exit(7)  # the real one: the child ends here, with 7
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 7
            os._exit(3)
    assert os._exit.__module__ in ("posix", "nt")  # restored


# --------------------------------------------------------------------------- a stage that checked nothing
def _stage(stage, *verdicts, message="the batches hold no chosen / rejected columns"):
    res = CheckResult(stage=stage, check="c")
    res.findings = [Finding(code="OBJ030", verdict=v, message=message) for v in verdicts]
    return res


def test_a_stage_its_data_opts_in_that_checked_nothing_fails(tiny_target):
    """[data] batches set, every batches finding a skip, another stage passing (so the run as a
    whole checked something): OBJ005 FAILs for the batches stage, naming the key and the first
    skip reason. Before, the batches stage skipped every check under `call = "preference"` and
    the run exited 0 (issue 53)."""
    from dataclasses import replace

    cfg = load_config(tiny_target / "objdebug.toml")
    with_batches = replace(cfg, data=replace(cfg.data, batches="mypipe:collate"))
    results = [_stage("batches", Verdict.SKIP, Verdict.SKIP), _stage("align", Verdict.PASS)]
    (res,) = selection.stages_checking_nothing(with_batches, results)
    (f,) = res.findings
    assert f.code == "OBJ005" and f.verdict is Verdict.FAIL and f.stage == "batches"
    assert f.message == ("the batches stage checked nothing although data.batches gives it what it "
                         "reads: all 2 of its findings skipped (first: the batches hold no chosen / "
                         "rejected columns)")
    # one measured finding is enough; no [data] batches: the skip is the stage not applying
    assert not selection.stages_checking_nothing(with_batches, [_stage("batches", Verdict.SKIP, Verdict.PASS)])
    assert not selection.stages_checking_nothing(cfg, results)
    # packing reads the batches' packed rows only when there are some: no FAIL without [packing]
    assert not selection.stages_checking_nothing(with_batches, [_stage("packing", Verdict.SKIP)])
