"""A compile-cache hit proves itself by behaviour before its results count (issue 46).

Whoever can write a cache folder can write a manifest that vouches for any graph file (a CI cache
shared between branches, an artifact of a fork's job): no checksum stored beside the graphs can
tell the user's graph from another model's. Only the graph's own behaviour can. So the first call
of a graph MindSpore loaded from the cache is checked against an answer objdebug gets without that
graph: the same Cell (or the engine's call of it) run once in PyNative mode on the very same
inputs. Same inputs, not a separate probe: a graph compiled for fixed shapes would compile again
on a probe of another shape, and MindSpore numbers its cache files by compile order, so one extra
compile would shift every later file. A PyNative call compiles no graph (measured: a warm run
that proves every hit still hits every later graph).

A mismatch beyond float tolerance rejects the entry: the engine drops the loaded graph and
compiles it afresh with the cache off from there on (`CompileCache.reject`), and its result is
the fresh one. A Cell that cannot run eagerly (PyNative raises) is proved the other way: the
fresh compile's output against the cached one's (the cache is then cold from there on either
way: a fresh compile means MindSpore must miss at its index).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


def eager(fn: Callable, args: Sequence[Any]) -> Any:
    """`fn(*args)` in PyNative mode: the Cell's answer without its compiled graph."""
    from objdebug.engine.pynative import pynative

    with pynative():
        return fn(*args)
