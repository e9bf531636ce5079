"""CI-native output: GitHub annotations and job summary, GitLab Code Quality, plain CI logs.

One real run of a failing fixture (fixtures/targets/reports_tiny with label_pad_id=0 and
MindSpore's CrossEntropyLoss, whose ignore_index is -100: OBJ105 fails) under GITHUB_ACTIONS=true
with stdout/stderr piped, as on a runner. The GitLab report is checked against a golden file built
from the synthetic result (fixtures/reports_data.py); regenerate with OBJDEBUG_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.reports_data import synthetic_result
from objdebug.report import github, gitlab, json_report
from tests.test_reports import check_golden

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "fixtures" / "targets" / "reports_tiny"
LENIENT = TARGET / "lenient.toml"
BROKEN = ["--set", "data.label_pad_id=0", "--set", "objective.factory=mindspore.nn:CrossEntropyLoss"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "GITLAB", "CI_"))}
    env.update(PYTHONPATH=str(ROOT), GLOG_v="3", **extra)
    return env


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "objdebug.cli", *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def report():
    """The synthetic report, OBJ102 given a data-row location as align findings have."""
    rep = json_report.to_dict(synthetic_result())
    rep = copy.deepcopy(rep)
    rep["results"][0]["findings"][1]["location"] = {"file": "/target/align.jsonl", "line": 4}
    return rep


# --------------------------------------------------------------------------- GitHub, units
def test_github_escaping_follows_the_runner():
    assert github.escape_data("50% a\r\nb: c, d") == "50%25 a%0D%0Ab: c, d"
    assert github.escape_property("a:b,c%\n") == "a%3Ab%2Cc%25%0A"


def test_github_annotations_by_verdict(report, monkeypatch):
    monkeypatch.setenv("GITHUB_WORKSPACE", "/target")
    lines = github.annotations(report)
    assert [line.split(" ", 1)[0] for line in lines] == ["::warning", "::error", "::error"]  # no PASS/SKIP
    warn, fail, error = lines
    assert warn.startswith("::warning file=align.jsonl,line=4,title=OBJ102::WARN [align/alignment] 83%")
    assert fail.startswith("::error file=objdebug.toml,title=OBJ105::FAIL [align/label-pad-masking] ")
    assert "%0Afix: Make the objective's ignore_index" in fail and "\n" not in "".join(lines)
    assert "title=OBJ503::ERROR [stress/garbage-ids]" in error


def test_info_is_a_notice_never_an_error(report):
    rep = copy.deepcopy(report)
    rep["results"][2]["findings"][0]["verdict"] = "INFO"
    assert github.annotations(rep)[2].startswith("::notice ")
    assert [i["severity"] for i in gitlab.issues(rep)].count("info") == 1


# --------------------------------------------------------------------------- GitLab
def test_gitlab_golden(report):
    check_golden("synthetic.gl-code-quality.json", gitlab.dumps(report, root="/target"))


def test_gitlab_issue_fields_and_stable_fingerprints(report):
    issues = gitlab.issues(report, root="/target")
    assert [(i["check_name"], i["severity"]) for i in issues] == [
        ("OBJ102", "minor"), ("OBJ105", "critical"), ("OBJ503", "major")]
    for i in issues:
        assert set(i) == {"description", "check_name", "fingerprint", "severity", "location"}
        assert re.fullmatch(r"[0-9a-f]{64}", i["fingerprint"])
        assert i["location"]["lines"]["begin"] >= 1
    assert issues[0]["location"] == {"path": "align.jsonl", "lines": {"begin": 4}}
    moved = copy.deepcopy(report)  # new numbers, same finding: GitLab must see the same issue
    moved["results"][0]["findings"][1]["message"] = "50% of rows ordered ..."
    assert gitlab.issues(moved, root="/target")[0]["fingerprint"] == issues[0]["fingerprint"]
    assert len({i["fingerprint"] for i in issues}) == len(issues)


def test_render_writes_gitlab_report_from_saved_json(tmp_path):
    saved = tmp_path / "r.json"
    json_report.write(synthetic_result(), str(saved))
    proc = subprocess.run([sys.executable, "-m", "objdebug.cli", "render", str(saved), "--output-format",
                           "gitlab"], capture_output=True, text=True, timeout=120, env=_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    issues = json.loads((tmp_path / gitlab.DEFAULT_PATH).read_text())  # the default path, in the cwd
    assert [i["check_name"] for i in issues] == ["OBJ102", "OBJ105", "OBJ503"]
    bad = _cli("render", str(saved), "--output-format", "yaml", env=_env())
    assert bad.returncode == 2 and "For '--output-format'" in bad.stderr


# --------------------------------------------------------------------------- a real failing run
@pytest.fixture(scope="module")
def github_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gha")
    summary = out / "step_summary.md"
    summary.write_text("## an earlier step\n")
    proc = _cli("run", "-c", str(TARGET / "objdebug.toml"), "-p", str(LENIENT), "--stages", "align",
                *BROKEN, env=_env(GITHUB_ACTIONS="true", GITHUB_STEP_SUMMARY=str(summary),
                                  GITHUB_WORKSPACE=str(ROOT)))
    return proc, summary


def test_ci_log_has_stage_lines_and_no_escape_codes(github_run):
    proc, _ = github_run
    log = proc.stderr.splitlines()
    assert "objdebug: align (1/1): started" in log, proc.stderr
    assert any(re.fullmatch(r"objdebug: align: done: 4 pass, 1 fail · [\d.]+ s · \d+ compiles?( .*)?", line)
               for line in log), proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr


def test_github_annotations_of_a_failing_run(github_run):
    proc, _ = github_run
    assert proc.returncode == 1, proc.stdout + proc.stderr
    notes = [line for line in proc.stdout.splitlines() if line.startswith("::")]
    assert notes == [line for line in notes if line.startswith("::error ")] and len(notes) == 1, notes
    config = (TARGET / "objdebug.toml").read_text().splitlines()
    line = next(i for i, text in enumerate(config, 1) if text.startswith("label_pad_id"))
    assert notes[0].startswith(f"::error file=fixtures/targets/reports_tiny/objdebug.toml,line={line},"
                               "title=OBJ105::FAIL [align/label-pad-masking] the objective scores positions "
                               "labelled label_pad_id=0")


def test_github_step_summary_is_appended(github_run):
    _, summary = github_run
    text = summary.read_text()
    assert text.startswith("## an earlier step\n# objdebug report: FAILED\n")
    assert "- **FAIL OBJ105** [align/label-pad-masking]" in text
    assert "| OBJ105 | label-pad-masking | FAIL |" in text
    assert "![" not in text  # no figure links: a job summary cannot show local files


# --------------------------------------------------------------------------- locations
def test_config_key_finds_the_line_or_the_section(tmp_path):
    from objdebug.core.locations import config_key

    toml = tmp_path / "objdebug.toml"
    toml.write_text("[objective]\nfactory = 'x:y'\nlabel_pad_id = 1  # not this section\n\n"
                    "[data]  # comment\npad_id = 0\n  label_pad_id = -100\n")
    assert config_key(str(toml), "data.label_pad_id") == {"file": str(toml), "line": 7}
    assert config_key(str(toml), "data.shift") == {"file": str(toml), "line": 5}  # set with --set
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text("[project]\nname = 'p'\n[tool.objdebug.data]\nlabel_pad_id = 0\n")
    assert config_key(str(pyproject), "data.label_pad_id")["line"] == 4
    assert config_key(str(tmp_path / "missing.toml"), "data.label_pad_id") is None
