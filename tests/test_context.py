"""The run context: typed options, typed shared measurements, no profile import."""

from __future__ import annotations

import subprocess
import sys

import pytest

from objdebug.pipeline.context import Context, RunOptions

from .conftest import ROOT


def test_options_are_typed_and_unknown_ones_refused():
    opts = RunOptions.of({"synthesize": True, "batch_size": None, "samples": 3})
    assert opts == RunOptions(synthesize=True, batch_size=None, samples=3, expect_trained=False)
    assert RunOptions.of(None) == RunOptions() and RunOptions.of(opts) is opts
    with pytest.raises(TypeError, match="'samplez'"):
        RunOptions.of({"samplez": 3})
    ctx = Context(config=None, target=None, engine=None, profile=None, options={"samples": 5})
    assert ctx.options.samples == 5 and ctx.options.batch_size is None


def test_a_provider_is_computed_once_and_keyed_by_itself():
    ctx = Context(config=None, target=None, engine=None, profile=None)
    calls = []

    def rows(ctx):  # a provider: the function is the key
        return ctx.provide(rows, lambda: calls.append(1) or [1, 2, 3])

    def other(ctx):
        return ctx.provide(other, lambda: "other")

    assert ctx.provided(rows) is None  # nothing computed by asking
    assert rows(ctx) == [1, 2, 3] and rows(ctx) is rows(ctx) and calls == [1]
    assert other(ctx) == "other" and ctx.provided(rows) == [1, 2, 3]
    ctx.forget(rows)
    assert ctx.provided(rows) is None and rows(ctx) == [1, 2, 3] and calls == [1, 1]


def test_context_does_not_import_the_profile_or_the_engine():
    code = ("import sys, objdebug.pipeline.context; "
            "print(sorted(m for m in sys.modules if m.startswith('objdebug.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert "objdebug.pipeline.profile" not in out and "objdebug.engine" not in out, out
