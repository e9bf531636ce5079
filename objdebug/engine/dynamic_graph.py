"""One compile for every input shape: a graph with dynamic dimensions, static where it cannot be.

MindSpore compiles a graph once per input shape. `Cell.set_inputs` with `None` dimensions makes
one compile serve every shape; measured on MindSpore 2.10 CPU (docs/performance.md): the same
losses and gradients bit for bit, the one compile about as long as a static one, a steady call up
to ~2.5x a static one. So the run's small, many-shaped calls (padding extras, micro-batches, the
all-padding batch, resampled lengths) share one graph, and measurements that need a graph of
their own shape (the peak memory of one long input) call `call_static`.

An objective that cannot compile with dynamic shapes (a reshape to a Python int read off
`.shape`, a kernel without dynamic-shape support) falls back, for the rest of the run, to one
static graph per shape, named `<name>.static`: the same graph the static callers use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from objdebug.core.interrupts import raise_swallowed

STATIC_SUFFIX = ".static"


def call(engine: Any, name: str, build: Callable[[], Any], dynamic: Sequence[Any], *tensors: Any,
         rows: bool = False) -> Any:
    """`build()`'s Cell on `tensors` through the dynamic graph `name` (input specs `dynamic`,
    `mindspore.Tensor(shape=[None, ...], dtype=...)` each), compiled once; through one static
    graph per shape where it cannot compile (see the module docstring). `rows`: every input's
    first dimension is the batch, so a compile-cache hit is proved on the first row alone."""
    if name not in engine.static_fallbacks:
        def built():
            cell = build()
            cell.set_inputs(*dynamic)
            return cell
        cell = engine.cell(name, built)
        # a new shape allocates like a compile does, but the engine sees no compile: the same
        # headroom rule before every call (measured: +3 GiB at [1, 618] on a 32000-token model)
        engine.make_room(name)
        try:  # no shape arguments: the compile log counts one compile for the dynamic graph
            # what a compile-cache hit is proved on: the Cell, its inputs (cut to the first row
            # only when a hit is proved, `rows`)
            return engine.call(name, lambda: cell(*tensors), probe=(cell, tensors, rows))
        except Exception:
            raise_swallowed()  # a ^C that MindSpore's compile turned into an error
            if engine.called(name):
                raise  # it compiled and ran before: a genuine run-time error
            engine.static_fallbacks.add(name)
            engine.release(name)
    return call_static(engine, name, build, *tensors)


def first_row(tensors: Sequence[Any]) -> tuple:
    """The call's own inputs cut to their first row: what a compile-cache hit of a batch-first
    dynamic graph is proved on (engine/cache_proof.py), a batch-size times cheaper PyNative call
    than the whole batch, and no compile (the graph takes any batch size). The first row is a
    data row (filler rows go last), all its positions kept, so the supervised ones are in it."""
    return tuple(t[:1] for t in tensors)


def call_static(engine: Any, name: str, build: Callable[[], Any], *tensors: Any) -> Any:
    """`build()`'s Cell on `tensors` through the static graph `<name>.static` (one compile per
    shape): a measurement of one shape's own graph, or the fallback of `call`."""
    static = name + STATIC_SUFFIX
    cell = engine.cell(static, build)
    return engine.call(static, cell, *tensors)
