"""The MindSpore range (objdebug/engine/ms_versions.py): releases parsed as pip names them, the range
refused outside it in one line, and the internals found on the installed release (CI runs this file
on the newest and on the oldest supported MindSpore)."""

from __future__ import annotations

import pytest

from objdebug.engine import ms_versions

pytestmark = pytest.mark.mindspore_range


@pytest.mark.parametrize("text, parsed", [("2.10.0", (2, 10)), ("2.7.1.post1", (2, 7)), ("2.7.2", (2, 7)),
                                          ("2.11.0rc1", (2, 11)), ("nightly", (0, 0))])
def test_parse_reads_the_minor_release(text, parsed):
    assert ms_versions.parse(text) == parsed


@pytest.mark.parametrize("version", ["2.7.0", "2.7.1.post1", "2.8.0", "2.9.0", "2.10.0"])
def test_supported_releases_are_not_refused(version):
    assert ms_versions.unsupported_reason(version) == ""


@pytest.mark.parametrize("version", ["2.6.0", "2.11.0", "1.10.1"])
def test_releases_outside_the_range_are_refused_in_one_line(version):
    why = ms_versions.unsupported_reason(version)
    assert why.startswith(f"MindSpore {version} is outside the range objdebug supports (2.7 to 2.10)")
    assert "\n" not in why


def test_the_installed_release_is_in_range_and_its_graph_api_has_what_objdebug_reads():
    assert ms_versions.unsupported_reason(ms_versions.installed()) == ""
    api = ms_versions.graph_api()
    for name in ("_cell_graph_executor", "ms_compile_cache", "cells_compile_cache", "entry_script_path"):
        assert hasattr(api, name), (ms_versions.installed(), api.__name__, name)
    expected = "mindspore.graph.api" if ms_versions.parse(ms_versions.installed()) >= (2, 9) else "mindspore.common.api"
    assert api.__name__ == expected


def test_a_fresh_process_reports_no_compiled_graph_on_the_installed_release():
    """The compile cache's per-process test (compile_cache._any_graph_compiled) reads MindSpore's
    counters: on 2.7 they were in another module, and a failed lookup turned the cache off for
    every run ('this process already compiled graphs')."""
    import subprocess
    import sys

    code = ("from objdebug.engine.compile_cache import _any_graph_compiled as f; "
            "import mindspore as ms, numpy as np; a = f(); "
            "ms.set_context(mode=ms.GRAPH_MODE); "
            "net = ms.nn.Dense(2, 2); net(ms.Tensor(np.ones((1, 2), np.float32))); print(a, f())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split()[-2:] == ["False", "True"], out.stdout + out.stderr[-2000:]


@pytest.mark.parametrize("text, parsed", [("2.7.0", (2, 7, 0)), ("2.7.1.post1", (2, 7, 1)), ("2.10.0rc1", (2, 10, 0)),
                                          ("2.9", (2, 9, 0)), ("nightly", (0, 0, 0))])
def test_parse_patch_reads_the_patch_release(text, parsed):
    assert ms_versions.parse_patch(text) == parsed


@pytest.mark.parametrize("version, refused", [("2.7.0", True), ("2.7.0.post1", True), ("2.7.1", False), ("2.7.2", False),
                                              ("2.9.0", False), ("2.10.0", False)])
def test_the_compile_cache_is_refused_where_it_loaded_another_graphs_code(version, refused):
    """MindSpore 2.7.0's cache served the demo's second run graphs that raised (a Gather index out of
    range in align and grad); 2.7.1, 2.7.2, 2.9.0 and 2.10.0 hit every graph with the cold run's verdicts."""
    why = ms_versions.cache_refusal(version)
    assert bool(why) is refused
    if refused:
        assert why.startswith(f"not on MindSpore {version}: ") and "2.7.1 and later cache" in why and "\n" not in why


def test_a_run_on_such_a_release_says_why_its_cache_is_off(tmp_path, monkeypatch):
    """The runner asks ms_versions: on a refused release the cache is 'unavailable' with that one
    line (the report's header shows it) and nothing is written."""
    from objdebug import api
    from objdebug.report import compile_cache_line

    from .conftest import TARGETS

    monkeypatch.setattr(ms_versions, "installed", lambda: "2.7.0")
    cfg = api.load_config(TARGETS / "cache_tiny" / "objdebug.toml")
    r = api.run(cfg, stages=["align"], profile="quick", compile_cache=str(tmp_path / "c"))
    c = r.extra["compile_cache"]
    assert c["status"] == "unavailable" and c["reason"] == ms_versions.cache_refusal("2.7.0"), c
    assert compile_cache_line({"extra": r.extra}) == f"compile cache unavailable ({c['reason']})"
    from objdebug.report import json_report, terminal

    assert f"  compile cache unavailable: {c['reason']}" in terminal.render(json_report.to_dict(r)).splitlines()
    assert not (tmp_path / "c").exists()
