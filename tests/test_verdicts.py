"""The INFO verdict: a note about the model or MindSpore, reported and counted apart, never a failure."""

from __future__ import annotations

import pytest

from fixtures.reports_data import _f, synthetic_result
from objdebug.core.errors import InputError
from objdebug.core.findings import CheckResult, Verdict
from objdebug.pipeline.profile import Profile
from objdebug.report import json_report, junit, markdown, terminal


def _with_note(fail_on: str = "fail", strict: bool = False):
    result = synthetic_result(passed_only=True)
    note = CheckResult("stress", "out-of-range-ids", seconds=0.1)
    note.findings = [_f("stress", "out-of-range-ids", "OBJ507", "INFO",
                        "input -1: accepted, loss 5.1 (the model's embedding wraps negative ids)", 1.0,
                        "out_of_range_input_ids_rejected", "Reject negative ids in the data pipeline.")]
    result.results.append(note)
    result.profile = Profile("gate", "builtin:gate", dict(result.profile.data, fail_on=fail_on))
    result.strict = strict
    return result


@pytest.mark.parametrize("fail_on,strict", [("fail", False), ("warn", False), ("fail", True)])
def test_a_note_never_fails_the_run(fail_on, strict):
    result = _with_note(fail_on, strict)
    assert result.counts()["INFO"] == 1
    assert result.exit_code == 0 and result.passed


def test_a_note_outranks_a_pass_for_display_only():
    res = CheckResult("stress", "x")
    res.findings = [_f("stress", "x", "OBJ506", "PASS", "ok"), _f("stress", "x", "OBJ507", "INFO", "n")]
    assert res.verdict is Verdict.INFO
    res.findings.append(_f("stress", "x", "OBJ507", "WARN", "w"))
    assert res.verdict is Verdict.WARN


def test_notes_are_rendered_with_their_fix():
    report = json_report.to_dict(_with_note("warn"))
    text = terminal.render(report)
    assert "INFO OBJ507" in text and "fix: Reject negative ids" in text
    assert "1 note (exit 0)" in text.splitlines()[-1]
    md = markdown.render(report)
    assert "## Notes" in md and "**INFO OBJ507**" in md
    xml = junit.dumps(report)
    assert "wraps negative ids" in xml and "<failure" not in xml.split("OBJ507")[1].split("</testcase>")[0]


def test_verdict_settings_are_validated():
    assert Verdict.from_setting("Info", "[stress] x") is Verdict.INFO
    assert Verdict.from_setting("fail", "[stress] x") is Verdict.FAIL
    with pytest.raises(InputError, match=r"For '\[stress\] x', the value must be in"):
        Verdict.from_setting("loud", "[stress] x")
