"""--baseline: regressions against an earlier JSON report become OBJ0xx findings and gate the run."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from fixtures.reports_data import synthetic_result
from objdebug.pipeline import baseline
from objdebug.core.errors import InputError
from objdebug.report import json_report

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "fixtures" / "targets" / "reports_tiny"
LENIENT = TARGET / "lenient.toml"


@pytest.fixture(scope="module")
def report():
    return json_report.to_dict(synthetic_result())


def _finding(rep, code):
    return next(f for r in rep["results"] for f in r["findings"] if f["code"] == code)


def _by_code(res):
    out = {}
    for f in res.findings:
        out.setdefault(f.code, []).append(f)
    return out


def test_identical_reports_have_no_regression(report):
    res = baseline.compare(report, copy.deepcopy(report))
    assert res.stage == "baseline" and res.verdict.value == "PASS"
    assert [f.code for f in res.findings] == ["OBJ001", "OBJ002", "OBJ003"]
    # compared: findings with a number and a direction, not SKIP/ERROR
    assert res.value["compared"] == 5  # OBJ101, OBJ102, OBJ105, OBJ303, OBJ401 (OBJ201: in-band, none)
    assert res.value["value_regressions"] == [] and res.value["verdict_regressions"] == []


def test_shrunk_gap_is_a_regression_with_numbers(report):
    old = copy.deepcopy(report)
    _finding(old, "OBJ101")["value"] = 2.5  # the gap was 2.5, now 1.85: -26%, tolerance 0.25
    res = baseline.compare(report, old)
    (reg,) = _by_code(res)["OBJ001"]
    assert reg.verdict.value == "FAIL"
    assert reg.value == pytest.approx(2.5 - 1.85)
    assert "OBJ101 [align/alignment] value 2.5 -> 1.85 (-26.0%, higher is better" in reg.message
    assert "tolerance 0.25" in reg.message


def test_change_within_tolerance_or_in_good_direction_passes(report):
    old = copy.deepcopy(report)
    _finding(old, "OBJ101")["value"] = 1.85 * 1.09   # 8% worse, tolerance 10%
    _finding(old, "OBJ401")["value"] = -0.5          # r was weaker before: now better
    res = baseline.compare(report, old)
    assert res.verdict.value == "PASS", [f.message for f in res.findings]


def test_weakened_correlation_uses_direction_table(report):
    old = copy.deepcopy(report)
    _finding(old, "OBJ401")["value"] = -0.85  # r -0.85 -> -0.71: weaker by 0.14 > 0.085
    res = baseline.compare(report, old)
    (reg,) = _by_code(res)["OBJ001"]
    assert "OBJ401" in reg.message and reg.value == pytest.approx(0.14)
    assert baseline.direction("OBJ401") == ("lower", None)
    assert baseline.direction("OBJ103") == ("lower", 0.01)
    assert baseline.direction("OBJ999") == ("none", None)


def test_profile_overrides_direction_tolerance_and_verdict(report):
    old = copy.deepcopy(report)
    _finding(old, "OBJ101")["value"] = 2.5
    settings = {"tolerances": {"OBJ101": 1.0}, "regression_verdict": "warn"}
    assert baseline.compare(report, old, settings).verdict.value == "PASS"  # 0.65 < 1.0
    settings = {"directions": {"OBJ101": "none"}}
    assert baseline.compare(report, old, settings).verdict.value == "PASS"
    settings = {"regression_verdict": "warn"}
    assert baseline.compare(report, old, settings).verdict.value == "WARN"


def test_bad_baseline_settings_are_input_errors(report):
    old = copy.deepcopy(report)
    _finding(old, "OBJ101")["value"] = 2.5
    with pytest.raises(InputError, match="regression_verdict"):
        baseline.compare(report, old, {"regression_verdict": "eror"})
    with pytest.raises(InputError, match="directions"):
        baseline.compare(report, old, {"directions": {"OBJ101": "up"}})


def test_nonfinite_new_value_is_a_regression(report):
    new = copy.deepcopy(report)
    _finding(new, "OBJ105")["value"] = "NaN"
    _finding(new, "OBJ105")["verdict"] = "FAIL"  # unchanged verdict: the number decides
    res = baseline.compare(new, report)
    (reg,) = _by_code(res)["OBJ001"]
    assert "OBJ105" in reg.message and reg.verdict.value == "FAIL"


def test_newly_failing_and_newly_erroring(report):
    old = copy.deepcopy(report)
    _finding(old, "OBJ105")["verdict"] = "PASS"
    _finding(old, "OBJ503")["verdict"] = "PASS"
    res = baseline.compare(report, old, error_fails=False)
    regs = _by_code(res)["OBJ002"]
    assert [(f.condition, f.verdict.value) for f in regs] == [
        ("OBJ105 [align/label-pad-masking]", "FAIL"), ("OBJ503 [stress/garbage-ids]", "WARN")]
    assert regs[0].message.startswith("OBJ105 [align/label-pad-masking] PASS -> FAIL: the objective")
    assert regs[0].fix  # the rule page's advice


def test_not_comparable_reports_warn(report):
    old = copy.deepcopy(report)
    old["config"]["objective"]["factory"] = "mindspore.nn:CrossEntropyLoss"
    old["results"].append({"stage": "grad", "check": "gone", "findings": [
        {"code": "OBJ209", "verdict": "PASS", "message": "", "value": 1.0}]})
    (diff,) = _by_code(baseline.compare(report, old))["OBJ003"]
    assert diff.verdict.value == "WARN" and "objective 'mindspore.nn:CrossEntropyLoss'" in diff.message
    assert "1 baseline findings missing now: OBJ209 [grad/gone]" in diff.message


def test_apply_appends_result_and_changes_exit_code(report):
    result = synthetic_result(passed_only=True)
    assert result.exit_code == 0
    old = copy.deepcopy(json_report.to_dict(result))
    _finding(old, "OBJ101")["value"] = 3.0
    old["_source"] = "old.json"
    baseline.apply(result, old)
    assert result.results[-1].stage == "baseline" and result.exit_code == 1
    assert result.extra["baseline"]["source"] == "old.json"
    rep = json_report.to_dict(result)
    assert rep["results"][-1]["findings"][0]["code"] == "OBJ001"
    result = synthetic_result(passed_only=True)
    baseline.apply(result, old, ignore=["OBJ001"])
    assert result.exit_code == 0 and "OBJ001" not in [f.code for f in result.findings]


def test_load_rejects_bad_files(tmp_path):
    with pytest.raises(InputError, match="report not found"):
        baseline.load(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tool": "objdebug", "schema_version": 1, "results": {}}))
    with pytest.raises(InputError, match="must have a 'results' list"):
        baseline.load(str(bad))


def test_load_rejects_a_directory_and_binary_file(tmp_path):
    with pytest.raises(InputError, match="cannot read the report"):
        baseline.load(str(tmp_path))
    binary = tmp_path / "b.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(InputError, match="not a JSON report"):
        baseline.load(str(binary))


def _invoke(args):
    from typer.testing import CliRunner

    from objdebug.cli import app

    return CliRunner().invoke(app, args, catch_exceptions=False)


def test_cli_bad_baseline_exits_2_before_running(tmp_path):
    bad = tmp_path / "old.json"
    bad.write_text("not json")
    res = _invoke(["run", "-c", str(TARGET / "objdebug.toml"), "--stages", "align", "--baseline", str(bad)])
    assert res.exit_code == 2 and "old.json" in res.output and "not a JSON report" in res.output


def test_cli_gate_fails_on_regression(tmp_path):
    """A release report whose align gap was larger: the live run regresses, exit 1, OBJ001 in JUnit."""
    old = {"tool": "objdebug", "schema_version": 1, "created": "2026-01-01T00:00:00+00:00", "passed": True,
           "stages": ["align"], "profile": {"name": "reports-lenient"},
           "config": {"objective": {"factory": "objdebug.losses:MaskedCrossEntropy"},
                      "model": {"factory": "objdebug.demo.model:build_model"}},
           "results": [{"stage": "align", "check": "alignment", "findings": [
               {"code": "OBJ101", "verdict": "PASS", "message": "", "value": 5.0}]}]}
    (tmp_path / "old.json").write_text(json.dumps(old))
    res = _invoke(["run", "-c", str(TARGET / "objdebug.toml"), "-p", str(LENIENT), "--stages", "align",
                   "--baseline", str(tmp_path / "old.json"), "--json", str(tmp_path / "new.json"),
                   "--junit", str(tmp_path / "new.xml")])
    assert res.exit_code == 1, res.output
    new = json_report.load(str(tmp_path / "new.json"))
    reg = _finding(new, "OBJ001")
    gap = _finding(new, "OBJ101")["value"]
    assert reg["verdict"] == "FAIL" and reg["value"] == pytest.approx(5.0 - gap)
    assert new["extra"]["baseline"]["source"] == str(tmp_path / "old.json")
    assert _finding(new, "OBJ003")["verdict"] == "PASS"
    assert 'name="objdebug.baseline"' in (tmp_path / "new.xml").read_text()
