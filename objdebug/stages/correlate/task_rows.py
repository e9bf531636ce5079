"""Correlate on a `[task] kind` other than the causal LM (issue 47): one loss per `[data] scores`
row of the kind, the same measurement as the causal LM's (per-sample loss vs the row's human
`score`), so the same codes (OBJ401-OBJ404) and conditions.

Each row's loss is the user's objective on that row through the kind's graphs (engine/tasks.py):
classification and tagging, the row alone (a batch of one, `task.objective`) with its label or
tags; embedding triplets, the row alone; embedding pairs, the row's share of the in-batch loss of
every score row together: N L(all rows) - (N - 1) L(all rows but this one), the row's own term
plus what its positive costs the other rows as their in-batch negative (an in-batch loss of a
batch of one is a constant). For a mean that is the difference of the sums; for a sum, the same
plus a constant, times N - 1: either way a per-row measure in one context. (Issue 55: the row
first in a batch with "the first batch_size - 1 other rows" gave every row of the first batch
the same loss, a mean being blind to the order of its rows: r(loss, score) -0.47 on the Llama
encoder, whose cosines track the scores with Spearman 0.82; its shares give -0.65.) A row's
length is its tokens (the anchor's for embeddings).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.engine import tasks
from objdebug.pipeline import task_kind


def row_losses(ctx) -> dict[str, Any]:
    """{"rows": the kind's score rows, "losses": float64[N]}, measured once per run."""
    def build():
        import mindspore as ms

        rows = task_kind.score_rows(ctx)
        engine = ctx.engine
        if tasks.kind_of(ctx.config) == "embedding":
            return {"rows": rows, "losses": _pair_losses(ctx, rows)}
        out = task_kind.outputs_of(ctx, rows).astype(np.float32)
        if tasks.kind_of(ctx.config) == "classification":
            labels = np.array([r.target for r in rows], np.int32)
        else:
            labels = tasks.pad([r.target for r in rows], ctx.config.data.label_pad_id, out.shape[1])
        return {"rows": rows, "losses": tasks.per_row(engine, ms.Tensor(out), ms.Tensor(labels))}
    return ctx.provide(row_losses, build)


def _pair_losses(ctx, rows) -> np.ndarray:
    pad, engine = ctx.engine.padding.pad_id, ctx.engine
    triplet = all(r.negative is not None for r in rows)

    def embed(seqs):
        length = tasks.bucket(max(map(len, seqs)))
        return np.concatenate([tasks.forward(engine, tasks.pad(seqs[i:i + engine.batch_size], pad, length)).asnumpy()
                               for i in range(0, len(seqs), engine.batch_size)])

    import mindspore as ms

    a, p = embed([r.ids for r in rows]), embed([r.positive for r in rows])
    n = embed([r.negative for r in rows]) if triplet else None
    if triplet:  # the row alone
        return np.asarray([float(tasks.pair_objective(engine, *[ms.Tensor(x[i:i + 1]) for x in (a, p, n)])
                                 .asnumpy()[0]) for i in range(len(rows))], np.float64)
    size = len(rows)

    def batch(pick):
        return float(tasks.pair_objective(engine, ms.Tensor(a[pick]), ms.Tensor(p[pick])).asnumpy()[0])

    whole = batch(list(range(size)))
    if size == 1:
        return np.asarray([whole], np.float64)
    out = [size * whole - (size - 1) * batch([j for j in range(size) if j != i]) for i in range(size)]
    return np.asarray(out, np.float64)


def vectors(ctx) -> tuple[list[str], np.ndarray, list[float], list[int]]:
    """(ids, losses, scores, lengths) of the kind's score rows for `measure_vectors`."""
    data = row_losses(ctx)
    rows = data["rows"]
    return ([r.id for r in rows], data["losses"], [float(r.score) for r in rows],
            [len(r.ids) for r in rows])
