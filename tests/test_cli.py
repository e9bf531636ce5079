"""The CLI: CliRunner for the commands, and one real subprocess on the demo target."""

import json
import os
import re
import subprocess
import sys

from typer.testing import CliRunner

from objdebug.cli import app

from .conftest import ROOT, TARGETS

runner = CliRunner()


def test_explain_prints_the_rule_page():
    result = runner.invoke(app, ["explain", "OBJ105"])
    assert result.exit_code == 0
    for heading in ("OBJ105", "## What it does", "## Why it matters", "## Example", "## How to fix"):
        assert heading in result.output


def test_explain_unknown_code_is_exit_2():
    result = runner.invoke(app, ["explain", "OBJ999"])
    assert result.exit_code == 2 and "OBJ999" in result.output


def test_every_rule_page_is_complete():
    from objdebug.rules import all_rules

    rules = all_rules()
    assert len(rules) >= 5
    for rule in rules.values():
        assert rule.fix and rule.summary, rule.code
        for heading in ("## What it does", "## Why it matters", "## Example", "## How to fix"):
            assert heading in rule.doc, (rule.code, heading)


def test_rules_lists_codes():
    result = runner.invoke(app, ["rules"])
    assert result.exit_code == 0 and "OBJ101" in result.output and "OBJ105" in result.output


def test_align_json_report_and_exit_code(tmp_path):
    out = tmp_path / "r.json"
    result = runner.invoke(app, ["align", "-c", str(TARGETS / "tiny" / "objdebug.toml"),
                                 "--json", str(out)])
    report = json.loads(out.read_text())
    assert result.exit_code == report["exit_code"]
    assert report["schema_version"] == 1 and report["tool"] == "objdebug"
    assert report["mode"] == "graph" and report["device"] == "CPU"
    assert report["compiles"]["count"] >= 1 and report["compiles"]["seconds"] > 0
    # the contract probe ("setup") compiles the model and the per-sample graph align reuses
    assert set(report["compiles"]["by_stage"]) <= {"setup", "align"} and "setup" in report["compiles"]["by_stage"]
    assert "objective.per_sample" in report["compiles"]["by_check"]["alignment"]["uses"]
    assert set(report["extra"]["time_profile"]["steps"]) >= {"load", "contract", "align"}
    assert {"mindspore", "numpy", "python"} <= set(report["versions"])
    # the tiny model is random: its state (OBJ004, untrained) comes first, the align ranking is a note
    assert [r["check"] for r in report["results"]] == ["model-state", "alignment", "label-pad-masking"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".r.json")]  # no temp left


def test_strict_turns_warnings_into_failure(tmp_path):
    args = ["align", "-c", str(TARGETS / "tiny" / "objdebug.toml"), "--select", "OBJ104"]
    assert runner.invoke(app, args).exit_code == 0
    prof = tmp_path / "p.toml"
    prof.write_text('extends = "default"\n[align]\ngap_pass = 100.0\ngap_fail = -100.0\n')
    # --expect-trained: the tiny model is random, and on an untrained model OBJ101 is a note (OBJ004)
    args = ["align", "-c", str(TARGETS / "tiny" / "objdebug.toml"), "--select", "OBJ101", "-p", str(prof),
            "--expect-trained"]
    assert runner.invoke(app, args).exit_code == 0  # a WARN passes
    assert runner.invoke(app, args + ["--strict"]).exit_code == 1


def test_demo_align_as_a_real_subprocess(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "objdebug.cli", "align", "--demo", "--json",
                           str(tmp_path / "r.json")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASSED" in proc.stdout and re.search(r"^align +\d+ pass", proc.stdout, re.M), proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # no MindSpore droppings
