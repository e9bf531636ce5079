"""engine/row_scoring.py (issue 48): a run that only scores rows, on CPU, scores them through one
fused static graph per length (the model and the user's objective per row, as a bare script does),
with the same per-row values as the shared dynamic graphs; and pipeline/time_profile.py: where a
run's time goes."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from objdebug import api
from objdebug.core.config import load_config
from objdebug.engine import row_scoring

from .conftest import TARGETS


# --------------------------------------------------------------------------- the choice (no MindSpore)
@pytest.mark.parametrize("device, stages, buckets, wanted", [
    ("CPU", ["align"], (64,), True),
    ("CPU", ["align", "correlate"], (128, 256), True),
    ("CPU", ["align", "grad"], (64,), False),          # a gradient stage: the shared dynamic graphs
    ("CPU", ["stress"], (64,), False),
    ("GPU", ["align"], (64,), False),                  # compile-dear devices keep one dynamic graph
    ("Ascend", ["correlate"], (64,), False),
    ("CPU", ["align"], (), False),                     # no rows to plan
    ("CPU", ["align"], (64, 128, 256), False),         # more static graphs than the floor allows
])
def test_static_rows_only_on_cpu_for_row_scoring_stages(device, stages, buckets, wanted):
    assert row_scoring.static_rows_wanted(device, stages, buckets) is wanted


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 700), min_size=1, max_size=200), st.sampled_from([1, 4, 8]),
       st.one_of(st.none(), st.integers(64, 1024)))
def test_static_plan_holds_every_row_in_at_most_two_lengths(lengths, batch, cap):
    plan = row_scoring.plan(lengths, batch, cap)
    assert 1 <= len(plan) <= row_scoring.MAX_STATIC and list(plan) == sorted(set(plan))
    longest = max(lengths)
    if cap is None or longest <= cap:
        assert plan[-1] >= longest and plan[-1] - longest < row_scoring.STEP  # no ladder padding
        assert plan[-1] % row_scoring.STEP == 0 or plan[-1] == cap
    assert all(b % row_scoring.STEP == 0 for b in plan[:-1])


def test_static_plan_pads_like_a_bare_script():
    """The benchmark's rows (55-239 tokens): one graph at 240, not the ladder's 256."""
    lengths = [55 + (i * 37) % 185 for i in range(120)] + [239]
    assert row_scoring.plan(lengths, 8) == (240,)


# --------------------------------------------------------------------------- end to end (tiny target)
@pytest.fixture(scope="module")
def align_runs():
    """The tiny target's align stage: alone (static rows) and beside a stage that keeps the shared
    dynamic graphs (the values must agree)."""
    cfg = load_config(TARGETS / "tiny" / "objdebug.toml")
    alone = api.run(cfg, stages=["align"])
    return cfg, alone


def _rows(result):
    return next(r for r in result.results if r.check == "alignment").value["rows"]


def test_align_alone_compiles_one_graph_that_holds_the_model(align_runs):
    _, alone = align_runs
    comp = alone.compiles
    assert [g["graph"] for g in comp["graphs"]] == ["objective.per_sample"]
    assert comp["holds_model"] == 1
    assert alone.exit_code in (0, 1)


def test_static_rows_equal_the_dynamic_graphs(align_runs):
    """Every answer's loss through the fused static graph equals the split dynamic path's
    (`model.forward` then `objective.forward` once per row) to 1e-5: the same objective, called
    the same way, on the same rows."""
    from objdebug.engine import runtime
    from objdebug.engine.core import Engine
    from objdebug.engine.target import load_target
    from objdebug.pipeline.context import Context
    from objdebug.pipeline.datasets import align_rows
    from objdebug.pipeline.profile import load_profile

    cfg, alone = align_runs
    runtime.setup("CPU", "graph", 0)
    target = load_target(cfg)
    engine = Engine(target)  # static_rows False: the shared dynamic graphs
    rows = align_rows(Context(config=cfg, target=target, engine=engine, profile=load_profile()))
    samples = [s for r in rows for s in r["samples"].values()]
    dynamic = engine.evaluate(samples)[:, 0]
    assert "objective.forward" in [g.graph for g in engine.compiles.records]
    static = [row[k] for row in _rows(alone) for k in ("good", "medium", "bad") if k in row]
    np.testing.assert_allclose(static, dynamic, rtol=1e-5, atol=1e-6)


def test_time_profile_says_where_the_time_went(align_runs):
    _, alone = align_runs
    prof = alone.extra["time_profile"]
    steps = prof["steps"]
    assert list(steps)[:3] == ["load", "contract", "align"]
    for name, e in steps.items():
        assert set(e) == {"wall", "compile", "calls", "host"}
        assert all(v >= 0 for v in e.values())
        # host is what compiles and calls leave of the wall (rounded to the millisecond)
        assert e["compile"] + e["calls"] + e["host"] == pytest.approx(e["wall"], abs=5e-3)
    # the contract probe compiled the run's one graph; align only called it
    assert steps["contract"]["compile"] > 0 and steps["align"]["compile"] == 0
    assert steps["align"]["calls"] > 0
    assert prof["compile"] == pytest.approx(alone.compiles["seconds"], abs=5e-3)
    assert sum(e["wall"] for e in steps.values()) <= prof["total"] + 1e-3
    assert prof["total"] == pytest.approx(alone.timings["total"], abs=1e-3)
    assert math.isclose(prof["other"], prof["total"] - sum(e["wall"] for e in steps.values()), abs_tol=5e-3)


def test_time_profile_in_the_terminal_report(align_runs):
    """`-v` prints it after the findings: a table, one row per step and the total."""
    from objdebug.report.json_report import to_dict
    from objdebug.report.terminal import render

    _, alone = align_runs
    report = to_dict(alone)
    assert "time (s)" not in render(report)
    text = render(report, verbose=True)
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("time (s)"))
    assert lines[start].split() == ["time", "(s)", "wall", "compile", "calls", "host"]
    assert [line.split()[0] for line in lines[start + 1:start + 4]] == ["load", "contract", "align"]
    total = next(line for line in lines[start:] if line.split()[:1] == ["total"])
    assert float(total.split()[1]) == pytest.approx(alone.extra["time_profile"]["total"], abs=0.01)


TUPLE_MODEL = '''from objdebug.demo.model import build_model


def build(**kwargs):
    import mindspore.nn as nn

    inner = build_model(**kwargs)

    class Both(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.inner = inner

        def construct(self, input_ids):
            logits = self.inner(input_ids)
            return logits, logits * 0
    return Both()
'''


def test_a_model_the_fused_graph_cannot_take_falls_back_to_the_dynamic_graphs(tiny_target, align_runs):
    """A model that returns a tuple: the fused graph cannot index its rows, so the run scores
    through the shared dynamic graphs (the contract's note on the tuple), with the same values."""
    _, alone = align_runs
    (tiny_target / "tuple_model.py").write_text(TUPLE_MODEL)
    cfg = load_config(tiny_target / "objdebug.toml", overrides={"model.factory": "tuple_model:build"})
    result = api.run(cfg, stages=["align"])
    graphs = [g["graph"] for g in result.compiles["graphs"]]
    assert "objective.per_sample" not in graphs and "model.forward" in graphs
    assert any("first element" in n for n in result.target.get("notes", []))
    np.testing.assert_allclose([r["good"] for r in _rows(result)], [r["good"] for r in _rows(alone)],
                               rtol=1e-5)
