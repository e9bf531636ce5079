"""The thin CLI: the library does what the command does (api.run(baseline=), api.write_reports),
the report's schema version is checked on read, and the shared options are declared once."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from fixtures.reports_data import synthetic_result
from objdebug import api
from objdebug.cli import OPTIONS, app
from objdebug.core.errors import InputError
from objdebug.report import json_report

from .conftest import ROOT, cli_exit_2

GOLDEN = ROOT / "tests" / "golden" / "synthetic.json"
TARGET = ROOT / "fixtures" / "targets" / "reports_tiny"


def _with_schema(tmp_path, version):
    data = json.loads(GOLDEN.read_text())
    data["schema_version"] = version
    path = tmp_path / f"v{version}.json"
    path.write_text(json.dumps(data))
    return path


# --------------------------------------------------------------------------- schema version
def test_report_carries_the_serializer_schema_version():
    assert json_report.to_dict(synthetic_result())["schema_version"] == json_report.SCHEMA_VERSION
    assert api.SCHEMA_VERSION == json_report.SCHEMA_VERSION
    assert json_report.load(str(GOLDEN))["schema_version"] == json_report.SCHEMA_VERSION


def test_newer_schema_is_exit_2_for_render_and_baseline(tmp_path):
    newer = _with_schema(tmp_path, json_report.SCHEMA_VERSION + 1)
    needle = f"schema_version {json_report.SCHEMA_VERSION + 1}, newer than this objdebug"
    cli_exit_2(["render", newer], needle, "upgrade objdebug")
    # before the run starts: no MindSpore work for a baseline that cannot be read
    cli_exit_2(["run", "-c", TARGET / "objdebug.toml", "--stages", "align", "--baseline", newer],
               needle)
    cli_exit_2(["render", _with_schema(tmp_path, "1")], "'schema_version'", "but got '1'")


def test_api_run_refuses_a_bad_baseline_before_any_work(tmp_path):
    cfg = api.load_config(TARGET / "objdebug.toml")
    with pytest.raises(InputError, match="newer than this objdebug"):
        api.run(cfg, stages=["align"], baseline=_with_schema(tmp_path, 99))


# --------------------------------------------------------------------------- write_reports
def test_write_reports_matches_the_cli_and_the_serializers(tmp_path):
    result = synthetic_result()
    written = api.write_reports(result, json=tmp_path / "r.json", junit=tmp_path / "r.xml",
                                markdown=tmp_path / "md", gitlab=tmp_path / "gl.json")
    assert written.committed and len(written.paths) >= 4
    assert (tmp_path / "r.json").read_text() == json_report.dumps(result)
    # `objdebug render` of that JSON writes the same files through the same call
    res = CliRunner().invoke(app, ["render", str(tmp_path / "r.json"), "--junit",
                                   str(tmp_path / "c.xml"), "--markdown", str(tmp_path / "cmd")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "c.xml").read_bytes() == (tmp_path / "r.xml").read_bytes()
    assert (tmp_path / "cmd" / "report.md").read_bytes() == (tmp_path / "md" / "report.md").read_bytes()


def test_write_reports_is_all_or_nothing(tmp_path):
    (tmp_path / "html").write_text("a file where the HTML directory should go")
    with pytest.raises(OSError):
        api.write_reports(synthetic_result(), json=tmp_path / "r.json", junit=tmp_path / "r.xml",
                          html=tmp_path / "html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["html"]  # nothing else, no temporaries


def test_api_run_with_baseline_is_the_cli_gate(tmp_path):
    """The comparison the CLI's --baseline made now happens in api.run: same findings."""
    old = {"tool": "objdebug", "schema_version": 1, "created": "2026-01-01T00:00:00+00:00",
           "passed": True, "stages": ["align"], "profile": {"name": "reports-lenient"},
           "config": {"objective": {"factory": "objdebug.losses:MaskedCrossEntropy"},
                      "model": {"factory": "objdebug.demo.model:build_model"}},
           "results": [{"stage": "align", "check": "alignment", "findings": [
               {"code": "OBJ101", "verdict": "PASS", "message": "", "value": 5.0}]}]}
    (tmp_path / "old.json").write_text(json.dumps(old))
    cfg = api.load_config(TARGET / "objdebug.toml")
    result = api.run(cfg, stages=["align"], profile=str(TARGET / "lenient.toml"),
                     baseline=tmp_path / "old.json")
    codes = {f.code: f for f in result.findings}
    assert result.stages == ["align"] and "OBJ001" in codes and result.exit_code == 1
    assert codes["OBJ001"].value == pytest.approx(5.0 - codes["OBJ101"].value)
    assert result.extra["baseline"]["source"] == str(tmp_path / "old.json")


# --------------------------------------------------------------------------- shared options
def _flags(command: str) -> set[str]:
    import re

    out = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"}).output
    return set(re.findall(r"(--[a-z][a-z-]+)", out))


def test_shared_options_are_declared_once_and_reach_every_command():
    run_flags = _flags("run")
    for stage in ("align", "grad", "invariants", "decompose", "correlate", "stress", "preference"):
        assert _flags(stage) == run_flags - {"--stages"}, stage
    assert {"--compile-cache", "--no-cache", "--baseline", "--junit", "--workers"} <= run_flags
    assert {"--no-cache", "--compile-cache", "--json"} <= _flags("demo")
    assert "--baseline" not in _flags("demo") and "--no-cache" not in _flags("render")
    assert all(name in OPTIONS for name in ("config", "no_cache", "gitlab_report"))
    assert os.environ.get("OBJDEBUG_NO_CACHE") == "1"  # conftest: the suite writes no cache
