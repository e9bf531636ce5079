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
