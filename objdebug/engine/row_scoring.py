"""Rows scored through one fused static graph per bucket, on CPU, when a run only scores rows.

Why (issue 48, measured on MindSpore 2.10 CPU with the Llama fixture, [8, 256], steady calls
alternated in one process): the shared dynamic-shape `model.forward` costs ~2x a static graph's
call (0.40 s against 0.21 s of CPU per call), and the split form then calls the objective once
per row (`objective.forward`, 8 calls per batch). A bare MindSpore script compiles the model and
the per-row objective into one static graph and calls it once per batch. On CPU a compile is
seconds, so where a run calls the model only at the few [batch_size, bucket] shapes of its rows
(`objdebug align`, `objdebug correlate`: `STATIC_ROW_STAGES`) it does what the bare script does:
`objective.per_sample`, one static graph per bucket that runs the model and calls the user's
objective once per row inside it (its own masking and reduction, in graph mode), returning the
per-row outputs and the logits (the contract probe reads them: no graph of its own).

Runs with a gradient stage keep the shared dynamic graphs: there the forward is one of three
graphs that hold the model (docs/performance.md, "The graph floor"), and a static graph per
bucket would be a fourth. Accelerators keep them too: there a compile that holds the model costs
minutes and a call milliseconds, the trade the other way round. At most `MAX_STATIC` shapes: a
row at a shape beyond them (or a model whose output the fused graph cannot take) goes through the
dynamic graphs, so no run compiles more than `MAX_STATIC` + 1 graphs holding the model.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

STATIC_ROW_STAGES = frozenset({"align", "correlate"})  # stages that call the model only to score rows
MAX_STATIC = 2  # fused static shapes per run; + a `model.forward` a model-state measurement may need
NAME = "objective.per_sample"  # the previous releases' name for the same fused graph


def static_rows_wanted(device: str, stages: Iterable[str], buckets: Sequence[int]) -> bool:
    """Whether this run scores rows through fused static graphs: on CPU, when every chosen stage
    only scores rows and its rows plan at most `MAX_STATIC` buckets."""
    stages = set(stages)
    return (str(device or "").upper() == "CPU" and bool(stages) and stages <= STATIC_ROW_STAGES
            and 0 < len(buckets) <= MAX_STATIC)


def _cell(engine: Any) -> Any:
    import mindspore as ms
    from mindspore import ops

    from objdebug.engine.cells import PerSampleObjective

    class RowScores(PerSampleObjective):
        """(input_ids [B, T], labels [B, T]) -> (float32[B, K]: the objective once per row,
        logits [B, T, V]): the model and the user's objective in one graph."""

        def construct(self, x, labels):
            logits = self.model(x)
            outs = []
            for b in range(self.batch):
                if self.flat:
                    r = self.objective(logits[b], labels[b])
                else:
                    r = self.objective(logits[b:b + 1], labels[b:b + 1])
                if isinstance(r, tuple):
                    outs.append(ops.stack([ops.cast(ops.reshape(p, ()), ms.float32) for p in r]))
                else:
                    outs.append(ops.reshape(ops.cast(ops.reshape(r, ()), ms.float32), (1,)))
            return ops.stack(outs), logits

    return engine.cell(NAME, lambda: RowScores(engine.target, engine.batch_size, on_logits=False))


def _fits(engine: Any, shape: Sequence[int]) -> bool:
    from objdebug.engine.model_inputs import is_wrapped

    target = engine.target
    if not engine.static_rows or target.model is None or is_wrapped(target.model):
        return False
    if len(shape) != 2 or int(shape[0]) != engine.batch_size:
        return False
    seen = {sig for name, sig in engine._seen if name == NAME}
    return _signature(shape) in seen or len(seen) < MAX_STATIC


def _signature(shape: Sequence[int]) -> str:
    b, t = (int(x) for x in shape)
    return f"Int32[{b}, {t}],Int32[{b}, {t}]"


@contextlib.contextmanager
def _compile_said_only_if_it_works() -> Iterator[None]:
    """What the fused graph's first call writes to stderr (fd 2: MindSpore's C++ log too) is held
    and written after it succeeded, dropped when it raised: a model the fused graph cannot take
    (graph-mode fallback, a tuple output) then falls back to the dynamic graphs without MindSpore's
    "[ERROR] ANALYZER ... Framework Unexpected Exception" page on the user's screen. Only where
    stderr is not a terminal: a live display there keeps drawing while the graph compiles."""
    if sys.stderr is None or sys.stderr.isatty():
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    held = tempfile.TemporaryFile()
    os.dup2(held.fileno(), 2)
    ok = False
    try:
        yield
        ok = True
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        if ok:
            held.seek(0)
            said = held.read()
            if said:
                os.write(2, said)
        held.close()


def score(engine: Any, ids: Any, labels: Any) -> tuple[Any, Any] | None:
    """(per-row outputs float32[B, K], logits) of Tensors ids / labels [batch_size, T] through
    the fused static graph; None when this run or this shape does not take it. A graph that
    cannot compile (a model whose output is not a Tensor) ends the static plan for the run: the
    dynamic graphs then answer, with their own errors."""
    if not _fits(engine, tuple(ids.shape)):
        return None
    cell = _cell(engine)
    first = not engine.called(NAME)
    try:
        if first:
            with _compile_said_only_if_it_works():
                return engine.call(NAME, cell, ids, labels, signature=_signature(ids.shape))
        return engine.call(NAME, cell, ids, labels, signature=_signature(ids.shape))
    except Exception:
        from objdebug.core.interrupts import raise_swallowed

        raise_swallowed()
        if not first:
            raise  # it compiled and ran before: a genuine run-time error (retired by the engine)
        engine.static_rows = False
        engine.release(NAME)
        return None


def forward(engine: Any, ids: Any) -> Any:
    """The logits of ids [batch_size, T] through the fused graph (labels 0: a class every
    vocabulary has, as the contract probe uses), the per-row outputs kept for `stashed`; None
    when the fused graph does not take this call."""
    import mindspore as ms

    labels = np.zeros(tuple(int(x) for x in ids.shape), np.int32)
    got = score(engine, ids, ms.Tensor(labels, ms.int32))
    if got is None:
        return None
    outs, logits = got
    engine._row_stash = (logits, labels, outs)
    return logits


def stashed(engine: Any, logits: Any, labels: Any) -> Any:
    """The per-row outputs the fused graph computed with `logits` (`forward`) when `labels` are
    the ones it used, else None (the caller then calls the objective on the logits)."""
    stash = engine._row_stash
    if stash is None or stash[0] is not logits:
        return None
    if not np.array_equal(labels.asnumpy(), stash[1]):
        return None
    return stash[2]


STEP = 16  # static lengths: multiples of 16 (a bare script pads to its longest row)


def plan(lengths: Sequence[int], batch_size: int, cap: int | None = None) -> tuple[int, ...]:
    """The length buckets of a static-rows run: the longest row rounded up to a multiple of
    `STEP` (capped at the model's position limit), and at most one shorter multiple of `STEP`
    when it saves more padded work than a compile costs (`data.choose_buckets`' cost: compile
    seconds against padded tokens). Why not the power-of-two ladder: it exists so that every
    stage and the compile cache meet at the same few shapes of the shared dynamic graphs; a run
    that only scores rows compiles its own static shapes, and padding 239 tokens to 256 is ~10%
    more work in every call (attention grows with the square of the length)."""
    from objdebug.engine.data import COMPILE_SECONDS, TOKEN_SECONDS

    lengths = sorted(int(n) for n in lengths)
    if not lengths:
        return ()
    longest = lengths[-1]
    top = -(-longest // STEP) * STEP
    if cap and longest <= cap:
        top = min(top, int(cap))

    def cost(chosen: tuple[int, ...]) -> float:
        counts = dict.fromkeys(chosen, 0)
        for n in lengths:
            counts[next(b for b in chosen if b >= n)] += 1
        tokens = sum(-(-c // batch_size) * batch_size * b for b, c in counts.items() if c)
        return sum(1 for c in counts.values() if c) * COMPILE_SECONDS + tokens * TOKEN_SECONDS

    best, best_cost = (top,), cost((top,))
    for b in range(-(-lengths[0] // STEP) * STEP, top, STEP):
        c = cost((b, top))
        if c < best_cost - 1e-12:
            best, best_cost = (b, top), c
    return best
