"""A compile-cache hit proves itself by behaviour before its results count (issue 46).

Whoever can write a cache folder can write a manifest that vouches for any graph file (a CI cache
shared between branches, an artifact of a fork's job, restored into the default ./.objdebug_cache
or a folder named with --compile-cache): no checksum stored beside the graphs can tell the user's
graph from another model's. Only the graph's own behaviour can. So the first call of EVERY graph
MindSpore loaded from the cache, whichever folder, is checked against an answer objdebug gets
without that graph (`answer`):

- a forward graph: the same Cell run once in PyNative mode (`eager`) on the very same inputs (a
  batch-first dynamic graph on its first row: no compile, it takes any batch size). Same inputs,
  not a separate probe: a graph compiled for fixed shapes would compile again on another shape;
- a gradient graph (a Cell that builds its gradient with `value_and_grad` below, or the model's
  VJP): never a PyNative gradient, which builds and compiles its backward graph (~1 s on the demo's
  objective: about the compile it checks). Its value comes from the forward in PyNative (the VJP:
  from the proved `model.forward` graph), and the gradient g it claims must pass the
  directional-derivative identity (f(x + e g) - f(x - e g)) / 2e = <g, g> on forward calls only
  (`directional_ok`: inputs moved along g, parameters moved and restored exactly); another model's
  gradient misses it by O(1);
- every reference runs with MindSpore's compile cache paused (`cache_paused`): MindSpore numbers
  its cache files by compile order, and anything compiled inside a proof (a Cell's own jit, a
  gradient Cell that declares nothing) must take no index, or every later graph would load the
  wrong file (measured: tests/test_cache_proof.py).

A mismatch beyond float tolerance rejects the entry: the engine drops the loaded graph and
compiles it afresh with the cache off from there on (`CompileCache.reject`), and its result is
the fresh one. A Cell that cannot run eagerly (PyNative raises) is proved the other way: the
fresh compile's output against the cached one's (the cache is then cold from there on either
way: a fresh compile means MindSpore must miss at its index).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# float tolerance of a graph against PyNative on the same inputs: relative to the reference's
# largest magnitude (fusion and reduction order differ between the two; another model's graph
# differs by the size of the values themselves)
RTOL = {"float16": 2e-2, "bfloat16": 5e-2}
DEFAULT_RTOL = 1e-3


def _leaves(out: Any) -> list[Any]:
    if isinstance(out, (tuple, list)):
        return [leaf for item in out for leaf in _leaves(item)]
    if isinstance(out, dict):
        return [leaf for k in sorted(out, key=str) for leaf in _leaves(out[k])]
    return [out]


def _array(x: Any) -> tuple[np.ndarray | None, str]:
    """(float64 values, dtype name) of a Tensor or array; (None, '') for anything else."""
    dtype = str(getattr(x, "dtype", "")).lower()
    if hasattr(x, "asnumpy"):
        if "bfloat16" in dtype:  # numpy has no bfloat16
            import mindspore as ms

            x = x.astype(ms.float32)
        x = x.asnumpy()
    if isinstance(x, np.ndarray) or np.isscalar(x) and not isinstance(x, (str, bytes)):
        return np.asarray(x, dtype=np.float64), dtype
    return None, ""


def same_answer(got: Any, want: Any) -> bool:
    """Whether `got` (the cached graph's output) answers like `want` (the reference): the same
    structure, shapes and non-finite positions, values within float tolerance."""
    a, b = _leaves(got), _leaves(want)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        xa, dtype = _array(x)
        ya, _ = _array(y)
        if xa is None or ya is None:
            if (xa is None) != (ya is None) or x != y:
                return False
            continue
        if xa.shape != ya.shape:
            return False
        if not np.array_equal(np.isnan(xa), np.isnan(ya)):
            return False
        fin = np.isfinite(ya)
        if not np.array_equal(np.isfinite(xa), fin) or not np.array_equal(xa[~fin & ~np.isnan(ya)],
                                                                          ya[~fin & ~np.isnan(ya)]):
            return False
        if not fin.any():
            continue
        rtol = next((t for name, t in RTOL.items() if name in dtype), DEFAULT_RTOL)
        scale = float(np.max(np.abs(ya[fin])))
        if float(np.max(np.abs(xa[fin] - ya[fin]))) > rtol * max(scale, 1e-12):
            return False
    return True


@contextlib.contextmanager
def cache_paused() -> Iterator[None]:
    """MindSpore's compile cache off for the block: a compile inside it (a PyNative gradient builds
    its backward graph; a Cell that cannot run eagerly is compiled afresh) neither loads a cache
    file nor takes an index, so every later graph still finds its own file. MindSpore reads the
    context switch `enable_compile_cache` at each compile (measured on 2.10: a graph compiled with
    it off between two others leaves the next one at the index after the first, and a warm run
    loads it right). Set through the context's own parameter: `set_context` warns the key is
    deprecated."""
    if os.environ.get("MS_COMPILER_CACHE_ENABLE") != "1":
        yield
        return
    _switch(False)
    try:
        yield
    finally:
        _switch(True)


def _switch(on: bool) -> None:
    from mindspore import context

    try:
        ctx = context._context()  # pylint: disable=protected-access
        ctx.enable_compile_cache = on
        ctx.set_param(context.ms_ctx_param.enable_compile_cache, int(on))
    except Exception:  # an internal that moved: the public, warning, way
        context.set_context(enable_compile_cache=on)


def eager(fn: Callable, args: Sequence[Any]) -> Any:
    """`fn(*args)` in PyNative mode, MindSpore's compile cache paused: the Cell's answer without
    its compiled graph."""
    from objdebug.engine.pynative import pynative

    with cache_paused(), pynative():
        return fn(*args)


# --------------------------------------------------------------------------- gradient graphs
# A gradient's PyNative call costs about a compile (it builds the backward graph: ~1 s on the demo's
# objective), so a gradient graph is proved without one: its value in PyNative, and its claimed
# gradient g by the directional-derivative identity <g, g> = d/de f(x + e g) at e = 0, taken as a
# central difference of forward calls only. Another model's gradient misses by O(1).
GRADIENT_OFF = "gradient off"  # what a claimed gradient that fails the identity answers as
STEPS = (1e-2, 1e-3, 1e-1)  # what a central difference's step moves f by, relative to |f| (next if one misses)
FD_RTOL = 2e-2        # |difference quotient - <g, g>| within this of <g, g>, float32
FD_RTOL_LOW = 8e-2    # a gradient in float16 / bfloat16 (its own rounding is ~1e-3 per element)


@dataclass(frozen=True)
class GradSpec:
    """What a gradient Cell differentiates: `ms.value_and_grad(fn, position, weights, has_aux)`."""
    fn: Any
    position: Any
    weights: Any
    has_aux: bool


def value_and_grad(owner: Any, fn: Any, position: Any = 0, weights: Any = None, has_aux: bool = False):
    """`ms.value_and_grad(fn, position, weights, has_aux=has_aux)`, remembered on the Cell `owner`
    (which calls it as `self.grad_fn` and says by `proof_gradients(out)` where its output holds the
    gradient): a compile-cache hit of the owner's graph is then proved without a PyNative gradient
    (`gradient_answer`)."""
    import mindspore as ms

    object.__setattr__(owner, "_proof_grad", GradSpec(fn, position, weights, has_aux))
    return ms.value_and_grad(fn, position, weights, has_aux=has_aux)


def _positions(position: Any) -> tuple[int, ...]:
    if position is None:
        return ()
    return (position,) if isinstance(position, int) else tuple(position)


def _split(spec: GradSpec, grads: Any) -> tuple[list, list]:
    """value_and_grad's gradient structure -> (per position, per weight) lists."""
    pos, has_w = _positions(spec.position), spec.weights is not None
    if pos and has_w:
        g_pos, g_w = grads
    elif has_w:
        g_pos, g_w = (), grads
    else:
        g_pos, g_w = grads, ()
    if pos and isinstance(spec.position, int):
        g_pos = (g_pos,)
    return list(g_pos), list(g_w)


def scalar(out: Any, has_aux: bool) -> float:
    """The differentiated value of a forward's output: the first element with has_aux, else the
    sum of every output (value_and_grad's sensitivity of ones)."""
    if has_aux and isinstance(out, (tuple, list)):
        out = out[0]
    return float(sum(float(np.sum(a)) for a in (_array(x)[0] for x in _leaves(out)) if a is not None))


def _host(x: Any) -> np.ndarray:
    return _array(x)[0]


def _low(x: Any) -> bool:
    dtype = str(getattr(x, "dtype", "")).lower()
    return "float16" in dtype


@contextlib.contextmanager
def _moved(params: list, deltas: list[np.ndarray]) -> Iterator[None]:
    """`params` at their values plus `deltas` inside the block, restored exactly on exit."""
    import mindspore as ms

    saved = [p.data.asnumpy().copy() for p in params]
    try:
        for p, theta, d in zip(params, saved, deltas):
            p.set_data(ms.Tensor((theta.astype(np.float64) + d).astype(theta.dtype)))
        yield
    finally:
        for p, theta in zip(params, saved):
            p.set_data(ms.Tensor(theta))


def directional_ok(f: Callable[[list], float], f0: float, bases: list[np.ndarray],
                   grads: list[np.ndarray], low: bool = False, scale: float | None = None) -> bool:
    """Whether `grads` (float64, one per moved quantity) is the gradient of `f` at `bases` (where
    f is `f0`): (f(x + e g) - f(x - e g)) / 2e against <g, g>; `f(deltas)` takes the deltas to add.

    The step e moves f by a fraction `STEPS` of `scale` (|f0| by default; the size of f's terms
    where they cancel): small enough that f is linear over it, large enough that f's float32
    rounding stays under the tolerance; the next fraction is tried when one misses (a wrong
    gradient misses at every step), and last a step of 1e-3 of |x|. A gradient that is zero, or at
    float32 noise (at a stationary point: a policy loss at its zero point), cannot pass that
    identity: f stationary along a fixed pseudo-random direction passes it instead (`_flat`; a
    small real gradient, where f is not stationary, goes on to the identity)."""
    s = float(sum(np.sum(g * g) for g in grads))
    if not np.isfinite(s):
        return True  # a non-finite gradient is compared by value (same_answer's NaN/Inf places)
    scale = abs(f0) if scale is None else abs(scale)
    norm = float(np.sqrt(sum(np.sum(b.astype(np.float64) ** 2) for b in bases))) or 1.0
    size = float(sum(b.size for b in bases)) or 1.0
    tol = FD_RTOL_LOW if low else FD_RTOL
    gmax = max((float(np.max(np.abs(g))) for g in grads if g.size), default=0.0)
    if gmax * norm / np.sqrt(size) <= NOISE * max(scale, 1.0) and _flat(f, f0, grads, norm, scale):
        return True  # zero, or float32 noise where f is stationary (a small real gradient goes on)
    if s == 0.0:
        return False
    for e in [r * scale / s for r in STEPS if scale] + [1e-3 * norm / np.sqrt(s)]:
        up, down = f([e * g for g in grads]), f([-e * g for g in grads])
        if abs((up - down) / (2 * e) - s) <= tol * s:
            return True
    return False  # a gradient that matters, and f does not follow it


NOISE = 1e-6  # a gradient under this (times the inputs' rms, relative to |f|) is float32 noise


FLAT_STEPS = (1e-3, 1e-2)  # `_flat`'s steps, relative to |x| (the next if one misses)


def _flat(f: Callable[[list], float], f0: float, grads: list[np.ndarray], norm: float, scale: float) -> bool:
    """Whether f is stationary at x: along a fixed pseudo-random direction of 1e-3 of |x| (else
    1e-2) its odd (first-order) part is under a tenth of its even part, or at float32 rounding.

    The second step: where f is 0 at x (a policy loss at its zero point, the demo's GRPO row with
    advantage 0: f = beta * mean k3, k3 = e^d - d - 1 of d ~ 1e-4 at 1e-3 of |x|), f's float32
    rounding is set by its terms (e^d ~ 1: ~1e-9 after beta and the mean), not by f, so at 1e-3
    up and down are each one rounding step (0 and -1.2e-9) and their odd part is all rounding;
    at 1e-2 the even part (3.8e-8) is over it (measured on MindSpore 2.7.2, 2.9.0, 2.10.0: the
    demo's warm run rejected `policy.objective` as another model's and went cold from there). A
    real first-order slope still shows at the larger step (its odd part grows as the step, the
    even part as its square, so the test is 10x less sensitive there, and never passes a slope
    that dominates at both)."""
    rng = np.random.default_rng(0)
    d = [rng.standard_normal(g.shape) for g in grads]
    dn = float(np.sqrt(sum(np.sum(x * x) for x in d))) or 1.0
    for rel in FLAT_STEPS:
        e = rel * norm / dn
        up, down = f([e * x for x in d]), f([-e * x for x in d])
        if abs(up - down) <= (0.1 * (abs(up - f0) + abs(down - f0))
                              + 1e-5 * max(abs(f0), abs(up), abs(down), scale)):
            return True
    return False


def gradient_answer(cell: Any, args: Sequence[Any], got: Any) -> Any:
    """The answer of a gradient Cell (`value_and_grad` above) without a PyNative gradient: its
    construct runs in PyNative with `grad_fn` answering the value from a forward call and the
    gradient the graph claims (`cell.proof_gradients(got)`); that gradient must pass the
    directional-derivative identity (`directional_ok`), else the answer is `GRADIENT_OFF`."""
    import mindspore as ms

    spec: GradSpec = cell._proof_grad  # pylint: disable=protected-access
    claimed = cell.proof_gradients(got)
    seen: dict[str, Any] = {}

    def stub(*a):
        seen["args"] = a
        seen["value"] = spec.fn(*a)
        return seen["value"], claimed

    real = cell.__dict__.get("grad_fn")
    object.__setattr__(cell, "grad_fn", stub)
    try:
        want = eager(cell, args)
    finally:
        object.__setattr__(cell, "grad_fn", real)
    a = list(seen["args"])
    g_pos, g_w = _split(spec, claimed)
    pos = _positions(spec.position)
    params = list(spec.weights) if spec.weights is not None else []
    moved = [g for g in g_pos] + [g for g in g_w]
    low = any(_low(g) for g in moved) or any(_low(a[i]) for i in pos)
    bases = [_host(a[i]) for i in pos] + [p.data.asnumpy() for p in params]

    def f(deltas: list[np.ndarray]) -> float:
        x = list(a)
        for i, d in zip(pos, deltas):  # float32 moves even for low-precision inputs: the step survives
            dtype = ms.float32 if _low(a[i]) else a[i].dtype
            x[i] = ms.Tensor((_host(a[i]) + d).astype(np.float32)).astype(dtype)
        with _moved(params, deltas[len(pos):]):
            return scalar(eager(spec.fn, x), spec.has_aux)

    f0 = scalar(seen["value"], spec.has_aux)
    return want if directional_ok(f, f0, bases, [_host(g) for g in moved], low) else GRADIENT_OFF


def vjp_answer(cell: Any, args: Sequence[Any], got: Any, forward: Callable | None) -> Any:
    """The answer of `model.vjp` (`cells.ModelVJP`: (input_ids, cotangent u) -> (model output,
    d<model(input_ids), u>/dparams)) without a gradient: the output from `forward` (the engine's
    proved `model.forward` graph: a call, no compile), else the model in PyNative; the gradient
    by the directional-derivative identity on forward calls with the parameters moved."""
    ids, u = args
    run = forward if forward is not None else (lambda x: eager(cell.model, (x,)))
    params = list(cell.weights)
    out0 = run(ids)
    u64 = _host(u)
    grads = [_host(g) for g in got[1]]

    def f(deltas: list[np.ndarray]) -> float:
        with _moved(params, deltas):
            return float(np.sum(_host(run(ids)) * u64))

    bases = [p.data.asnumpy() for p in params]
    terms = float(np.sum(np.abs(_host(out0) * u64)))  # <out, u> cancels: its terms' size is the scale
    f0 = float(np.sum(_host(out0) * u64))
    ok = directional_ok(f, f0, bases, grads, any(_low(g) for g in got[1]), scale=terms)
    return (out0, got[1]) if ok else GRADIENT_OFF


def answer(fn: Any, args: Sequence[Any], got: Any, reference: Callable = eager,
           forward: Callable | None = None) -> Any:
    """The answer a graph's first call must match, got without the graph: `vjp_answer` for the
    model's VJP, `gradient_answer` for a Cell that declares its gradient (`value_and_grad`), else
    `reference(fn, args)` (PyNative, the compile cache paused)."""
    if getattr(fn, "proof_vjp", False):
        return vjp_answer(fn, args, got, forward)
    if getattr(fn, "_proof_grad", None) is not None and hasattr(fn, "proof_gradients"):
        return gradient_answer(fn, args, got)
    return reference(fn, args)
