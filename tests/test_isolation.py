"""Memory-heavy measurements in a process of their own (objdebug/pipeline/isolation.py): the same
numbers as in the run's own process, on the run's own parameter values, and a child killed for
memory is a SKIP with what it held, never a dead run."""

from __future__ import annotations

import numpy as np
import pytest

from objdebug.core.findings import Verdict
from objdebug.engine import runtime
from objdebug.pipeline import isolation
from objdebug.pipeline.runner import run_check
from objdebug.stages import stress

from .test_stress import Target

pytestmark = pytest.mark.skipif(not isolation.available(), reason="needs /proc to watch the child")


def _check(name: str):
    return next(c for c in stress.checks() if c.name == name)


@pytest.fixture(scope="module")
def target():
    return Target("stress_healthy")


def _perturbed(target):
    """Scale one parameter in this process: the child must see the run's values, not the
    checkpoint's (a random-init model is not re-initialised the same way in another process)."""
    p = target.ctx.target.trainable_params()[0]
    old = p.asnumpy()
    import mindspore as ms

    p.set_data(ms.Tensor(old * 1.5))
    return p, old


def test_long_inputs_in_a_child_give_this_process_numbers(target, monkeypatch):
    from objdebug.engine import host_memory

    th = target.th.replace(long_lengths=[128], memory_calibration_lengths=[])
    p, old = _perturbed(target)
    engine = target.ctx.engine
    # a busy machine (other jobs' memory): the engine lets go of its graphs to make room before
    # each compile and before the child starts (Engine.make_room), and compiles again what it
    # calls again (the run, at load 8: one graph more than an idle machine's)
    make_room = engine.make_room

    def under_pressure(compiling, want=None):
        with monkeypatch.context() as m:
            m.setattr(host_memory, "available_bytes", lambda: 0)
            make_room(compiling, want)

    monkeypatch.setattr(engine, "make_room", under_pressure)
    merged = []  # the compile records that came back from the child
    merge = isolation._merge_compiles
    monkeypatch.setattr(isolation, "_merge_compiles",
                        lambda engine, records: (merged.extend(records), merge(engine, records)))
    try:
        with runtime.scratch_dir():
            here = run_check(_check("long-inputs"), target.ctx, th)
            before = engine.compiles.count
            child = run_check(_check("long-inputs"), target.ctx, th.replace(isolate_above_gib=0.0))
    finally:
        monkeypatch.undo()
        import mindspore as ms

        p.set_data(ms.Tensor(old))
    assert here.error is None and child.error is None, child.error
    a, b = here.value["lengths"]["128"], child.value["lengths"]["128"]
    assert b["isolated"] is True and "isolated" not in a
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-6)
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    # the child's graph is a graph of the run: it joins the compile log; any other compile here
    # is one this process let go for room and needed again (counted, never hidden)
    added = [(r.graph, r.shapes) for r in engine.compiles.records[before:]]
    child_graphs = [(r["graph"], r["shapes"]) for r in merged]
    assert [g for g, _ in child_graphs] == ["objective.param_grad.static"]
    assert child_graphs[0] in added
    let_go = {r["graph"] for r in engine.compiles.released}
    assert {g for g, _ in added if (g, _) not in child_graphs} <= let_go, (added, let_go)
    finding = next(f for f in child.findings if f.code == "OBJ501")
    assert finding.verdict == Verdict.PASS and "in its own process" in finding.message


def test_long_objective_in_a_child_matches_and_shares_one_dynamic_graph(target):
    th = target.th.replace(objective_long_lengths=[2048, 4096])
    shared = "objective.logit_grad"  # the configured objective's logit-gradient graph (engine/gradients.py)
    before = [r.graph for r in target.ctx.engine.compiles.records].count(shared)
    with runtime.scratch_dir():
        here = run_check(_check("long-objective"), target.ctx, th)
        child = run_check(_check("long-objective"), target.ctx, th.replace(isolate_above_gib=0.0))
    assert here.error is None and child.error is None, child.error
    for t in ("2048", "4096"):
        a, b = here.value["lengths"][t], child.value["lengths"][t]
        assert b["isolated"] and b["loss"] == pytest.approx(a["loss"], rel=1e-6)
    # in this process the reference and both lengths ran on one dynamic-length graph
    graphs = [r.graph for r in target.ctx.engine.compiles.records if r.graph.startswith(shared)]
    assert graphs.count(shared) - before == (0 if before else 1) + 2  # here at most once, one in each child
    assert shared + ".static" not in graphs


def test_a_child_killed_for_memory_is_a_skip_and_the_run_goes_on(target, monkeypatch):
    # a floor above any machine's memory: the parent ends every child at once
    monkeypatch.setenv(isolation.FLOOR_ENV, str(1 << 62))
    th = target.th.replace(long_lengths=[128, 256], memory_calibration_lengths=[], isolate_above_gib=0.0)
    with runtime.scratch_dir():
        res = run_check(_check("long-inputs"), target.ctx, th)
    assert res.error is None
    rows = res.value["lengths"]
    assert rows["128"]["ran"] is False and "killed for memory" in rows["128"]["reason"]
    assert rows["256"]["ran"] is False and "T=128 did not fit in its own process" in rows["256"]["reason"]
    verdicts = [(f.code, f.verdict) for f in res.findings]
    assert verdicts == [("OBJ501", Verdict.SKIP), ("OBJ501", Verdict.SKIP), ("OBJ502", Verdict.SKIP)]
    assert "GiB" in res.findings[0].message


def test_an_error_in_the_child_is_the_checks_error(target):
    with pytest.raises(isolation.IsolatedError, match="ValueError"):
        isolation.run_isolated(target.ctx, "tests.test_isolation:_raise", text="no such length")
    assert isolation.run_isolated(target.ctx, "tests.test_isolation:_echo", x=np.arange(3)) == [0, 1, 2]


def _raise(ctx, text):
    raise ValueError(text)


def _echo(ctx, x):
    return [int(v) for v in x]


def test_a_length_the_objective_cannot_run_is_reported_and_the_others_judged(target, monkeypatch):
    """A length that fails after the reference ran (MindSpore's CPU kernels refuse buffers over
    2 GiB: 'GatherDGradV2, memset_s failed' at [1, 32768, 32000]) is listed with its error; the
    lengths that ran are judged, the check does not crash."""
    from objdebug.stages.stress import long_objective

    real = long_objective.measure_one

    def failing(ctx, rows, labels, length, seed, offset=0):
        if length == 4096:
            raise RuntimeError("For 'GatherDGradV2', memset_s failed, ret=34")
        return real(ctx, rows, labels, length, seed, offset)

    monkeypatch.setattr(long_objective, "measure_one", failing)
    with runtime.scratch_dir():
        res = run_check(_check("long-objective"), target.ctx, target.th.replace(objective_long_lengths=[2048, 4096]))
    assert res.error is None
    row = res.value["lengths"]["4096"]
    assert row["ran"] is False and "memset_s failed" in row["reason"]
    finding = res.findings[0]
    assert finding.verdict == Verdict.PASS and "T=4096 not run: failed at this length" in finding.message


def test_a_length_started_at_the_stage_start_gives_the_same_numbers(target):
    """`LongInputs.prepare` starts the length in its own process (one core of its own) before the
    checks before it run; `measure` collects that result: the numbers of a run started when its
    turn comes, and no second process."""
    import os

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("the head start needs two cores")
    th = target.th.replace(long_lengths=[128], memory_calibration_lengths=[], isolate_above_gib=0.0)
    check = _check("long-inputs")
    with runtime.scratch_dir():
        alone = run_check(_check("long-inputs"), target.ctx, th)
        check.prepare(target.ctx, th)
        assert len(target.ctx.background) == 1
        early = run_check(check, target.ctx, th)
    assert alone.error is None and early.error is None, early.error
    a, b = alone.value["lengths"]["128"], early.value["lengths"]["128"]
    assert b["started_early"] is True and "started_early" not in a
    assert b["loss"] == a["loss"] and b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-6)
    # the short reference `prepare` took ahead is the one `measure` takes itself
    assert early.value["reference"]["loss"] == alone.value["reference"]["loss"]
    assert early.value["reference"]["grad_norm"] == pytest.approx(alone.value["reference"]["grad_norm"],
                                                                  rel=1e-6)
    assert target.ctx.background == []  # collected


def test_a_length_started_early_and_never_collected_ends_with_the_run(target):
    import os

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("the head start needs two cores")
    th = target.th.replace(long_lengths=[128], memory_calibration_lengths=[], isolate_above_gib=0.0)
    _check("long-inputs").prepare(target.ctx, th)
    (handle,) = target.ctx.background
    target.ctx.close()  # the run ends before the check runs (stopped, or a stage failed)
    assert target.ctx.background == [] and handle.proc.poll() is not None
    assert not os.path.exists(handle.job) and handle.done()  # cancel() waited for its watcher
    from objdebug.stages.stress.long_inputs import _ahead

    _ahead(target.ctx).clear()


def test_no_head_start_without_room_or_on_an_accelerator(target, monkeypatch):
    th = target.th.replace(long_lengths=[128], memory_calibration_lengths=[], isolate_above_gib=0.0)
    from objdebug.stages.stress import long_inputs

    monkeypatch.setattr(long_inputs.memory, "available_bytes", lambda: 1 << 20)  # 1 MiB free
    long_inputs.LongInputs().prepare(target.ctx, th)
    assert target.ctx.background == []
    monkeypatch.undo()
    monkeypatch.setattr(target.ctx.config.run, "device", "GPU")
    long_inputs.LongInputs().prepare(target.ctx, th)
    assert target.ctx.background == []


@pytest.mark.slow
def test_long_inputs_after_the_probes_compile_no_graph_again(tmp_path, monkeypatch):
    """Through the runner: long inputs are the stress stage's last check, after the out-of-range
    probes retired the shared graphs they were rejected on. Their short reference was taken when
    the stage started and their length started then in its own process (beside the probes'
    waits), so every graph that holds the model compiles once (the numbers equal those of the
    check run alone: the test above)."""
    import os

    from objdebug import api
    from objdebug.core.config import load_config

    from .conftest import TARGETS, only_checks

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("the head start needs two cores")
    profile = tmp_path / "p.toml"
    profile.write_text('extends = "default"\n[stress]\nlong_lengths = [128]\n'
                       'memory_calibration_lengths = []\nisolate_above_gib = 0.0\n')
    only_checks(monkeypatch, stress={"out-of-range-ids", "long-inputs"})
    cfg = load_config(TARGETS / "stress_healthy" / "objdebug.toml")
    res = api.run(cfg, stages=["stress"], profile=str(profile), compile_cache=False)
    by_check = {r.check: r for r in res.results}
    assert [r.check for r in res.results if r.stage == "stress"] == ["out-of-range-ids", "long-inputs"]
    probes = by_check["out-of-range-ids"].value["probes"]
    assert all(p["rejected"] for p in probes.values())  # this target rejects all four
    assert {r["graph"] for r in res.compiles["retired"]} >= {"model.forward", "model.vjp"}
    names = [g["graph"] for g in res.compiles["graphs"]]
    assert names.count("model.forward") == 1 and names.count("model.vjp") == 1, names
    long = by_check["long-inputs"]
    assert long.error is None and long.value["lengths"]["128"]["started_early"] is True
    assert all(f.verdict == Verdict.PASS for f in long.findings), [f.message for f in long.findings]
