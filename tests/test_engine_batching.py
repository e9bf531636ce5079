"""The engine's batching and gradient family (issue 10): one fill policy, buckets chosen by cost,
one in-graph gradient reduction (numpy reference), OBJ202 and the monitor on the same gradients,
and the compile hook. On the `tiny` fixture target: a handful of small graphs."""

from __future__ import annotations

import itertools
import math
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from objdebug.engine.data import BUCKETS, Sample, choose_buckets, filled_rows, group_by_length
from .conftest import settings

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "fixtures" / "targets" / "tiny" / "objdebug.toml"


# --------------------------------------------------------------------------- no MindSpore
def brute_force_buckets(lengths, batch, compile_s, token_s, ladder=BUCKETS):
    """Every subset of the ladder that holds the longest row, each row in its smallest bucket."""
    best, cost_best = None, math.inf
    cands = [b for b in ladder if b >= min(lengths)]
    for r in range(1, len(cands) + 1):
        for subset in itertools.combinations(cands, r):
            if max(subset) < max(lengths):
                continue
            rows = {}
            for n in lengths:
                b = min(x for x in subset if x >= n)
                rows[b] = rows.get(b, 0) + 1
            cost = len(rows) * compile_s + sum(math.ceil(c / batch) * batch * b * token_s
                                               for b, c in rows.items())
            if cost < cost_best - 1e-12:
                best, cost_best = tuple(sorted(rows)), cost
    return best, cost_best


@pytest.mark.parametrize("seed,low,high,n", [(0, 10, 60, 300), (1, 50, 250, 120),
                                             (2, 20, 4000, 500), (3, 100, 1500, 40)])
def test_choose_buckets_is_the_cheapest_ladder_subset(seed, low, high, n):
    lengths = list(np.random.default_rng(seed).integers(low, high, n))
    for compile_s, token_s in ((1.2, 4e-6), (1.2, 1e-3), (0.0, 1e-6)):
        got = choose_buckets(lengths, 8, compile_seconds=compile_s, token_seconds=token_s)
        want, cost = brute_force_buckets(lengths, 8, compile_s, token_s)
        assert got[-1] >= max(lengths)
        _, got_cost = brute_force_buckets(lengths, 8, compile_s, token_s, ladder=got)
        assert got_cost == pytest.approx(cost, rel=1e-12), (got, want)


def test_few_short_answers_get_one_bucket_long_varied_data_more():
    rng = np.random.default_rng(0)
    assert choose_buckets(list(rng.integers(40, 64, 300)), 8) == (64,)
    assert choose_buckets(list(rng.integers(50, 250, 120)), 8) == (256,)  # the align target
    assert len(choose_buckets(list(rng.integers(20, 4000, 2000)), 8)) > 1
    assert choose_buckets([100, 3000], 8, cap=2500) == (4096,)  # too long for the model: its error
    assert choose_buckets([100, 200], 8, cap=150) == (256,)
    assert choose_buckets([100, 120], 8, cap=150) == (128,)
    assert choose_buckets([], 8) == ()


def test_one_fill_policy_and_grouping():
    rows = [Sample(str(i), [1], [2] * i) for i in range(3)]
    assert [s.id for s in filled_rows(rows, 8)] == ["0", "1", "2", "0", "1", "2", "0", "1"]
    groups = group_by_length([40, 100, 30, 70, 60], lambda n: 64 if n <= 64 else 128, 2)
    assert groups == [(64, [0, 2]), (64, [4]), (128, [1, 3])]


# --------------------------------------------------------------------------- MindSpore
@pytest.fixture(scope="module")
def tiny():
    from objdebug.core.config import load_config
    from objdebug.pipeline.context import Context
    from objdebug.engine import runtime
    from objdebug.engine.core import Engine
    from objdebug.engine.target import load_target
    from objdebug.pipeline.profile import load_profile

    old = os.getcwd()
    os.chdir(tempfile.mkdtemp(prefix="objdebug-test-engine-"))  # MindSpore may drop rank_0/ here
    cfg = load_config(TINY)
    runtime.setup(cfg.run.device, cfg.run.mode, cfg.run.seed)
    target = load_target(cfg)
    ctx = Context(config=cfg, target=target, engine=Engine(target, batch_size=4),
                  profile=load_profile("default"))
    yield ctx
    os.chdir(old)


@pytest.fixture(params=["host", "graph"])
def stats_path(request, monkeypatch):
    """Both ways gradients are reduced: on the host (small gradients, the default on every test
    target) and in the compiled graph (what a real model's gradients get)."""
    from objdebug.engine import gradients

    if request.param == "graph":
        monkeypatch.setattr(gradients, "HOST_STATS_MAX_ELEMENTS", 0)
    return request.param


def test_gradient_stats_match_numpy(tiny, stats_path):
    from objdebug.engine.gradients import reduce_gradients

    rng = np.random.default_rng(0)
    grads = [rng.normal(size=(4, 3)).astype(np.float32), (rng.normal(size=(3, 3)) * 1e3).astype(np.float32),
             np.zeros((3, 2), np.float32), np.array([1.0, np.nan, -np.inf, 0.0, -2.5], np.float32),
             rng.normal(size=7).astype(np.float16)]
    s = reduce_gradients(grads)
    for i, g in enumerate(grads):
        a = g.astype(np.float64)
        finite = np.isfinite(a)
        kept = np.where(finite, a, 0.0)
        assert s["finite_sq"][i] == pytest.approx((kept ** 2).sum(), rel=1e-6)
        assert s["nonfinite"][i] == (~finite).sum()
        assert s["zeros"][i] == (a == 0).sum()
        if finite.all():
            assert s["max_abs"][i] == pytest.approx(np.abs(a).max(), rel=1e-6)
            assert s["sq_norm"][i] == pytest.approx((a ** 2).sum(), rel=1e-6)
        else:  # MindSpore's max may give inf where numpy gives NaN: both not finite
            assert not np.isfinite(s["max_abs"][i]) and not np.isfinite(s["sq_norm"][i])


def test_host_and_graph_gradient_stats_agree_on_a_models_gradients(tiny, monkeypatch):
    """The same forward + backward reduced both ways: equal to float32 rounding, zero counts exact."""
    from objdebug.engine import gradients
    from objdebug.stages import grad as G

    g = G.param_gradients(tiny)
    assert gradients.on_host(g.grads)
    host = tiny.engine.gradient_stats(g.grads)
    monkeypatch.setattr(gradients, "HOST_STATS_MAX_ELEMENTS", 0)
    graph = tiny.engine.gradient_stats(g.grads)
    assert tiny.engine.called(gradients.STATS)
    for k in ("sq_norm", "max_abs", "finite_sq"):
        np.testing.assert_allclose(graph[k], host[k], rtol=1e-5, err_msg=k)
    for k in ("zeros", "nonfinite"):
        assert graph[k].tolist() == host[k].tolist(), k


def test_engine_gradient_stats_count_nonfinite_only_when_a_norm_is_not_finite(tiny, monkeypatch):
    """One `gradient.stats` graph per parameter set (whatever the batch length); the graph that
    counts NaN/Inf elements runs only for a gradient whose squared norm is not finite, and both
    paths give numpy's numbers."""
    import mindspore as ms

    from objdebug.engine import gradients
    from objdebug.engine.gradients import STATS, STATS_NONFINITE

    monkeypatch.setattr(gradients, "HOST_STATS_MAX_ELEMENTS", 0)  # the graph path
    engine = tiny.engine
    first = len(engine.compiles.records)  # the engine is shared with the tests above
    rng = np.random.default_rng(1)
    healthy = [rng.normal(size=(5, 4)).astype(np.float32), np.zeros(3, np.float32)]
    s = engine.gradient_stats([ms.Tensor(g) for g in healthy])
    assert s["nonfinite"].tolist() == [0, 0] and s["zeros"].tolist() == [0, 3]
    np.testing.assert_allclose(s["finite_sq"], [(healthy[0].astype(np.float64) ** 2).sum(), 0.0], rtol=1e-6)
    assert [r.graph for r in engine.compiles.records[first:]].count(STATS) == 1
    assert not engine.called(STATS_NONFINITE)
    sick = [healthy[0].copy(), np.array([1.0, np.nan, 2.0], np.float32)]
    sick[0][0, 0] = np.inf
    s = engine.gradient_stats([ms.Tensor(g) for g in sick])
    assert s["nonfinite"].tolist() == [1, 1]
    assert s["finite_sq"][1] == pytest.approx(5.0)
    np.testing.assert_allclose(s["finite_sq"][0], (np.where(np.isfinite(sick[0]), sick[0], 0).astype(np.float64) ** 2).sum(),
                               rtol=1e-6)
    graphs = [r.graph for r in engine.compiles.records[first:]]
    assert graphs.count(STATS) == 1 and graphs.count(STATS_NONFINITE) == 1  # same shapes: no recompile


def test_obj202_and_the_monitor_read_the_same_gradients(tiny):
    """OBJ202 (grad stage) and OBJ603's monitor statistics on ONE forward + backward: the same
    per-parameter norms and the same all-parameter max/mean (the monitor judges it over matrices,
    documented on both rule pages)."""
    from objdebug import monitor
    from objdebug.engine.gradients import max_mean_ratio
    from objdebug.stages import grad as G

    ctx = tiny
    v = G.GradientHealth().measure(ctx, settings("grad"))
    g = G.param_gradients(ctx)
    s = monitor.grad_stats(g.names, g.grads)
    assert s["n_params"] == v["n_params"]
    assert s["max_mean_ratio_all"] == v["max_mean_ratio"]          # bit for bit: one reduction
    assert s["global_norm"] == pytest.approx(v["global_norm"], rel=1e-12)
    norms = np.array([p["norm"] for p in v["params"]])
    matrices = [i for i, t in enumerate(g.grads) if len(t.shape) >= 2]
    assert s["max_mean_ratio"] == max_mean_ratio(norms, matrices if len(matrices) >= 2 else None)[0]
    # and both against numpy float64 on the gradients themselves
    host = [t.asnumpy().astype(np.float64) for t in g.grads]
    ref = np.array([np.sqrt((a ** 2).sum()) for a in host])
    np.testing.assert_allclose(norms, ref, rtol=1e-5)
    assert v["max_mean_ratio"] == pytest.approx(ref.max() / ref.mean(), rel=1e-5)


def test_buckets_by_cost_leave_per_sample_results_unchanged(tiny):
    """The same rows at the ladder's buckets (one graph each) and at the one bucket a cost plan
    picks: per-sample losses equal to float32 tolerance (a correct objective ignores padding)."""
    from objdebug.engine.core import Engine
    from objdebug.pipeline.datasets import text_samples

    ctx = tiny
    base = text_samples(ctx)
    samples = [Sample(f"{s.id}-{k}", s.prompt, (s.response * 12)[:n], s.kind)
               for k, (s, n) in enumerate(zip(itertools.cycle(base), (3, 20, 40, 70, 100, 5, 90, 33)))]
    ladder = Engine(ctx.target, batch_size=4)
    planned = Engine(ctx.target, batch_size=4)
    assert planned.plan_buckets([s.length for s in samples]) == (128,)
    assert {ladder.bucket(s.length) for s in samples} == {32, 64, 128}
    a, b = ladder.evaluate(samples), planned.evaluate(samples)
    np.testing.assert_allclose(b, a, rtol=2e-6, atol=1e-7)
    per_sample = [[r.shapes for r in e.compiles.records if r.graph in ("model.forward", "objective.forward")]
                  for e in (planned, ladder)]
    # dynamic shapes: one compile of each graph serves every bucket; the plan saves padded work
    assert len(per_sample[0]) == 2 and len(per_sample[1]) == 2
    # every stage asks the engine: each row's padded length is the planned one
    assert {planned.bucket(s.length) for s in samples} == {128}
    assert {b.length for b in planned.batches(samples)} == {128}
    assert planned.bucket(129) == 256  # beyond the plan: the ladder (stress lengths)


def test_compile_listener_hears_every_first_call_once(tiny):
    from objdebug.engine.core import Engine

    heard = []

    class Listener:
        def before_compile(self, graph, signature):
            heard.append(("before", graph, signature))

        def after_compile(self, graph, signature, seconds):
            heard.append(("after", graph, signature))

    data = SimpleNamespace(pad_id=0, label_pad_id=-100, shift=True, vocab_size=256)
    engine = Engine(SimpleNamespace(config=SimpleNamespace(data=data)))
    engine.add_compile_listener(Listener())
    x = np.zeros((2, 3), np.float32)
    engine.call("g", lambda a: a, x)
    engine.call("g", lambda a: a, x)                      # compiled: not heard again
    with pytest.raises(ZeroDivisionError):
        engine.call("bad", lambda a: 1 / 0, x)            # a raising first call is heard too
    assert heard == [("before", "g", "float32[2, 3]"), ("after", "g", "float32[2, 3]"),
                     ("before", "bad", "float32[2, 3]"), ("after", "bad", "float32[2, 3]")]
    assert engine.compiles.count == 1
