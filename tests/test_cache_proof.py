"""Issue 46, the proof of a compile-cache hit without a PyNative gradient (engine/cache_proof.py).

A gradient graph's claimed gradient g must pass the directional-derivative identity
(f(x + e g) - f(x - e g)) / 2e = <g, g> on forward calls only; another model's gradient misses by
O(1). The identity is checked against float64 numpy functions with their analytic gradients (the
reference), then on real MindSpore graphs (the objective's logit gradient, the model's VJP);
and the pause of MindSpore's compile cache, which lets a proof compile without taking a cache
index, in a real process pair.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from objdebug.engine import cache_proof
from objdebug.engine.cache_proof import GRADIENT_OFF, directional_ok

pytestmark = pytest.mark.mindspore_range  # what differs between releases: CI runs it on the oldest too


# --------------------------------------------------------------------------- the identity (float64 reference)
def _quartic(x):
    return float(np.sum(np.sin(x) * x ** 2) + 0.1 * np.sum(x ** 4))


def _quartic_grad(x):
    return np.cos(x) * x ** 2 + 2 * x * np.sin(x) + 0.4 * x ** 3


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_true_gradient_passes_a_wrong_one_misses(seed):
    x = np.random.default_rng(seed).standard_normal((4, 7))
    f = lambda d: _quartic(x + d[0])  # noqa: E731
    g, f0 = _quartic_grad(x), _quartic(x)
    assert directional_ok(f, f0, [x], [g])
    assert not directional_ok(f, f0, [x], [1.05 * g])  # a 5% scale (another reduction's count)
    assert not directional_ok(f, f0, [x], [_quartic_grad(np.roll(x, 1))])  # another input's gradient
    assert not directional_ok(f, f0, [x], [np.zeros_like(g)])  # a zero claimed where f moves


def test_a_zero_gradient_passes_where_f_is_flat_and_float32_rounding_passes():
    x = np.random.default_rng(3).standard_normal(50)
    assert directional_ok(lambda d: 2.5, 2.5, [x], [np.zeros_like(x)])
    # the function evaluated in float32, as a graph does: the steps in STEPS keep its rounding out
    f32 = lambda d: float(np.sum(np.sin((x + d[0]).astype(np.float32)) * 3.0, dtype=np.float32))  # noqa: E731
    assert directional_ok(f32, f32([0.0]), [x], [3.0 * np.cos(x)])


def test_a_nearly_zero_loss_far_from_linear_at_the_input_scale_passes():
    """A trained model's loss (the demo's: ~3e-3, logits ~15): a step of 1e-3 of |logits| moves
    it far beyond linear; steps relative to |f| do not (a cross-entropy, float64 reference)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((64, 16)) * 2
    y = rng.integers(0, 16, 64)
    x[np.arange(64), y] += 14.0  # confident and right: loss ~1e-5 per row

    def ce(z):
        z = z - z.max(axis=1, keepdims=True)
        return float(np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(64), y]))

    p = np.exp(x - x.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    g = (p - np.eye(16)[y]) / 64
    assert directional_ok(lambda d: ce(x + d[0]), ce(x), [x], [g])
    assert not directional_ok(lambda d: ce(x + d[0]), ce(x), [x], [1.1 * g])


def test_at_a_stationary_point_float32_noise_passes_a_real_gradient_does_not():
    """A policy loss at its zero point: the true gradient is 0 and the graph's is float32 noise
    (~1e-9), which the identity cannot check; f must then be stationary instead."""
    x = np.random.default_rng(5).standard_normal(40)
    bowl = lambda d: float(np.sum((x + d[0] - x) ** 2))  # noqa: E731  (minimum at x, f = 0)
    noise = np.random.default_rng(6).standard_normal(40) * 1e-9
    assert directional_ok(bowl, 0.0, [x], [noise])
    tilted = lambda d: float(np.sum((x + d[0] - x) ** 2) + 0.1 * np.sum(d[0]))  # noqa: E731
    assert not directional_ok(tilted, 0.0, [x], [noise])  # f moves at first order: not noise


def test_a_zero_loss_whose_float32_rounding_is_its_terms_passes_a_slope_does_not():
    """The demo's GRPO row with advantage 0 (issue 54, every MindSpore measured): f = beta * mean
    k3, k3 = e^d - d - 1, is exactly 0 at x; its float32 rounding comes from e^d ~ 1, not from f,
    so at 1e-3 of |x| up and down are one rounding step apart (f ~ 1e-9) and the odd part is all
    rounding. The warm demo rejected `policy.objective` as another model's graph for it."""
    x = np.random.default_rng(5).standard_normal(40)
    m = np.random.default_rng(8).standard_normal((20, 40)) * 0.02  # d ~ 1e-4 per token at 1e-3 of |x|

    def k3(d):
        r = (m @ d[0]).astype(np.float32)
        return float(np.float32(0.04) * np.mean(np.exp(r) - r - np.float32(1.0), dtype=np.float32))

    noise = np.random.default_rng(6).standard_normal(40) * 1e-9
    assert k3([np.zeros(40)]) == 0.0
    assert directional_ok(k3, 0.0, [x], [noise])
    sloped = lambda d: k3(d) + 1e-4 * float(np.sum(d[0]))  # noqa: E731  (a small real slope)
    assert not directional_ok(sloped, 0.0, [x], [noise])


# --------------------------------------------------------------------------- real graphs
@pytest.fixture(scope="module")
def tiny():
    """A tiny model (embedding + dense to V logits) and the mean cross-entropy on its logits."""
    import mindspore as ms
    from mindspore import nn

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)

    class Model(nn.Cell):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(32, 8)
            self.out = nn.Dense(8, 32)

        def construct(self, ids):
            return self.out(ms.ops.tanh(self.emb(ids)))

    class Objective(nn.Cell):
        def __init__(self):
            super().__init__()
            self.ce = nn.CrossEntropyLoss()

        def construct(self, logits, labels):
            return self.ce(logits, labels)

    rng = np.random.default_rng(0)
    ids = ms.Tensor(rng.integers(0, 32, (3, 6)).astype(np.int32))
    labels = ms.Tensor(rng.integers(0, 32, (18,)).astype(np.int32))
    return Model(), Objective(), ids, labels


def test_a_logit_gradient_graph_is_proved_and_another_labels_gradient_is_off(tiny):
    import mindspore as ms

    from objdebug.engine.gradients import ObjectiveLogitGrad

    model, objective, ids, labels = tiny
    logits = model(ids).reshape(-1, 32)
    one = ms.Tensor(np.float32(1.0))
    cell = ObjectiveLogitGrad(objective, True)
    got = cell(logits, labels, one)
    want = cache_proof.answer(cell, (logits, labels, one), got)
    assert cache_proof.same_answer(got, want)
    other = cell(logits, ms.Tensor(np.roll(labels.asnumpy(), 1)), one)
    forged = (got[0], other[1], got[2], got[3])  # the right loss, another batch's gradient
    assert cache_proof.answer(cell, (logits, labels, one), forged) == GRADIENT_OFF
    assert cell.grad_fn is not None and "grad_fn" in cell.__dict__  # the stub went again


def test_a_vjp_graph_is_proved_on_forward_calls_and_another_rows_gradient_is_off(tiny):
    import mindspore as ms

    from objdebug.engine.cells import ModelForward, ModelVJP

    model, _, ids, _ = tiny
    params = list(model.trainable_params())
    before = [p.data.asnumpy().copy() for p in params]
    vjp, forward = ModelVJP(model, params), ModelForward(model)
    u = ms.Tensor(np.random.default_rng(1).standard_normal((3, 6, 32)).astype(np.float32))
    got = vjp(ids, u)
    for run in (forward, None):  # the proved forward graph, or the model in PyNative
        assert cache_proof.same_answer(got, cache_proof.answer(vjp, (ids, u), got, forward=run))
    other = vjp(ids, ms.Tensor(np.roll(u.asnumpy(), 1, axis=0)))
    assert cache_proof.answer(vjp, (ids, u), (got[0], other[1]), forward=forward) == GRADIENT_OFF
    assert all(np.array_equal(p.data.asnumpy(), b) for p, b in zip(params, before))  # restored


# --------------------------------------------------------------------------- the cache's pause
_PAUSE = textwrap.dedent("""
    import glob, os, sys
    import numpy as np, mindspore as ms
    from mindspore import nn
    from objdebug.engine.cache_proof import eager, cache_paused
    ms.set_context(mode=ms.GRAPH_MODE)
    class A(nn.Cell):
        def construct(self, x): return x * 2
    class B(nn.Cell):
        def construct(self, x): return x + 1
    class C(nn.Cell):
        def construct(self, x): return x - 3
    def square(y):
        return (y * y).sum()
    x = ms.Tensor(np.ones(3, np.float32))
    a = A()(x)
    with cache_paused():  # a compile inside: a PyNative gradient's backward graph, a fresh compile
        b = B()(x)
        g = eager(ms.grad(square), (x,))  # PyNative's gradient compiles (jit)
    c = C()(x)
    names = sorted(os.path.basename(f) for f in glob.glob(sys.argv[1] + "/rank_0/graph_cache/*.mindir"))
    print(float(a[0]), float(b[0]), float(g[0]), float(c[0]), names)
""")


@pytest.mark.slow  # two MindSpore processes (~12 s on 2 idle cores); CI twin: the fake engine's tests in test_gate_cache.py
def test_a_compile_while_the_cache_is_paused_takes_no_index(tmp_path):
    """A proof compiles nothing the cache numbers: the graph after it keeps its file, cold and warm."""
    script = tmp_path / "pause.py"
    script.write_text(_PAUSE)
    env = dict(os.environ, MS_COMPILER_CACHE_ENABLE="1", MS_COMPILER_CACHE_PATH=str(tmp_path / "c"),
               GLOG_v="3", PYTHONPATH=os.pathsep.join(sys.path))
    runs = [subprocess.run([sys.executable, str(script), str(tmp_path / "c")], env=env, capture_output=True,
                           text=True, timeout=300) for _ in range(2)]
    for proc in runs:  # cold, then warm: C loads its own file (index 1), never B's or the gradient's
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.strip().splitlines()[-1] == (
            "2.0 2.0 2.0 -2.0 ['compile_cache_0.mindir', 'compile_cache_1.mindir']")


# --------------------------------------------------------------------------- a real warm run
@pytest.mark.slow  # three real grad-stage runs (~60 s on 2 shared cores)
def test_a_proved_warm_run_with_gradient_graphs_hits_every_graph(tiny_target, tmp_path):
    """The default cache (./.objdebug_cache), proved: every hit of the grad stage's graphs (the
    model's forward and VJP, the objective's logit gradient) proves itself and the run still hits
    every later graph (no proof compiled anything the cache numbers), with the same findings."""
    import json

    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items()
           if k not in ("OBJDEBUG_NO_CACHE", "MS_COMPILER_CACHE_ENABLE", "MS_COMPILER_CACHE_PATH")}
    env.update(PYTHONPATH=str(root), GLOG_v="3")

    def run(name):
        proc = subprocess.run([sys.executable, "-m", "objdebug.cli", "run", "--stages", "grad", "-q",
                               "--json", str(tmp_path / name)], cwd=tiny_target, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
        report = json.loads((tmp_path / name).read_text())
        return report["extra"]["compile_cache"], [(f["code"], f["verdict"], f["value"]) for r in report["results"]
                                                  for f in r["findings"]]

    cold, found_cold = run("cold.json")
    assert cold["status"] == "cold" and cold["trust"] == "default"
    graphs = set()
    for name in ("warm.json", "again.json"):  # a proved warm run keeps its manifest: the next is warm too
        warm, found = run(name)
        assert warm["status"] == "warm" and warm["misses"] == 0 and warm["hits"] == cold["compiles"]
        assert warm["proof"]["proved"] == warm["hits"] and "unprovable" not in warm and "rejected" not in warm
        assert found == found_cold
        graphs |= set(warm["proof"]["by_graph"])
    assert {"model.forward", "model.vjp", "objective.logit_grad"} <= graphs
