"""Decompose on a `[task] kind` other than the causal LM (issue 47): a composite objective's terms
(e.g. a class-weighted CE + a logit penalty, returned as (total, ce, penalty) with `[objective]
components`) measured on the kind's rows, the same measurements as the causal LM's, so the same
codes (OBJ300-OBJ305) and conditions.

- values: the objective on each align row (score rows when there is no align file) alone, a batch
  of one through `task.objective` (embedding pairs: the row first in a batch with one fixed context
  of other rows, as correlate does; triplets: alone); a "batch" of the dead-term count is
  `batch_size` consecutive rows.
- gradients: sum_i w_i c_i with one-hot w, differentiated w.r.t. the model's output by the
  objective alone (`decompose.task_logit_grad`, `decompose.task_pair_grad`, dynamic shapes) and
  carried to the model's parameters by the shared `model.vjp` (every text of an embedding row:
  summed), on `grad_batches` batches of `batch_size` rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.engine import tasks
from objdebug.pipeline import task_kind

LOGIT_GRAPH = "decompose.task_logit_grad"
PAIR_GRAPH = "decompose.task_pair_grad"


def is_task(ctx) -> bool:
    return tasks.kind_of(ctx.config) != tasks.CAUSAL_LM


def rows(ctx) -> list[tasks.TaskRow]:
    th = ctx.profile.section("decompose")
    n = ctx.options.samples or th["max_samples"] or None
    out = task_kind.align_rows(ctx) or task_kind.score_rows(ctx)
    return out[:n] if n else out


def params(ctx) -> list:
    """The model's parameters: what `model.vjp` differentiates (a CRF's own transitions are the
    grad stage's, OBJ222)."""
    return list(ctx.target.model.trainable_params())


def _embedded(ctx, rs):
    pad, engine = ctx.engine.padding.pad_id, ctx.engine
    texts = [[r.ids for r in rs], [r.positive for r in rs]]
    if all(r.negative is not None for r in rs):
        texts.append([r.negative for r in rs])
    ids = [tasks.pad(t, pad, tasks.bucket(max(map(len, t)))) for t in texts]
    return ids, [np.concatenate([tasks.forward(engine, i[k:k + engine.batch_size]).asnumpy()
                                 for k in range(0, len(i), engine.batch_size)]) for i in ids]


def _labels(ctx, rs, length: int) -> np.ndarray:
    if tasks.kind_of(ctx.config) == "classification":
        return np.array([r.target for r in rs], np.int32)
    return tasks.pad([r.target for r in rs], ctx.config.data.label_pad_id, length)


def per_sample(ctx, rs) -> np.ndarray:
    """float64 [N, 1 + K]: the objective's outputs (total, components) on each row."""
    import mindspore as ms

    engine = ctx.engine
    if tasks.kind_of(ctx.config) == "embedding":
        _, embs = _embedded(ctx, rs)
        triplet = len(embs) == 3
        out = []
        for i in range(len(rs)):
            pick = [i] if triplet else [i] + [j for j in range(len(rs)) if j != i][:engine.batch_size - 1]
            out.append(tasks.pair_objective(engine, *[ms.Tensor(e[pick]) for e in embs]).asnumpy())
        return np.asarray(out, np.float64)
    x = task_kind.outputs_of(ctx, rs).astype(np.float32)
    y = _labels(ctx, rs, x.shape[1] if x.ndim == 3 else 0)
    return np.asarray([tasks.objective(engine, ms.Tensor(x[i:i + 1]), ms.Tensor(y[i:i + 1])).asnumpy()
                       for i in range(len(rs))], np.float64)


def batches(ctx, n: int) -> list[list[int]]:
    """Consecutive groups of batch_size row indices (the dead-term count's batches)."""
    b = ctx.engine.batch_size
    return [list(range(i, min(i + b, n))) for i in range(0, n, b)]


def gradient_batches(ctx, rs, n_batches: int) -> list[tuple[np.ndarray, list]]:
    """Up to n_batches groups of batch_size rows: (the anchors' / texts' ids, the rows)."""
    b = ctx.engine.batch_size
    chosen = rs[:max(1, n_batches) * b]
    pad = ctx.engine.padding.pad_id
    return [(tasks.pad([r.ids for r in chosen[i:i + b]], pad), chosen[i:i + b])
            for i in range(0, len(chosen), b)]


def _logit_cell(objective):
    import mindspore as ms
    from mindspore import nn

    from objdebug.engine.cells import as_outputs

    class WeightedTaskGrad(nn.Cell):
        """(output, labels, w) -> (components, d(sum_i w_i c_i) / d output)."""

        def __init__(self):
            super().__init__(auto_prefix=False)
            self.objective = objective
            self.grad_fn = ms.value_and_grad(self._weighted, 0, None, has_aux=True)

        def _weighted(self, out, labels, w):
            comps = as_outputs(self.objective(out, labels))[1][1:]
            return (comps * w).sum(), comps

        def construct(self, out, labels, w):
            (_, comps), g = self.grad_fn(out, labels, w)
            return comps, g

    return WeightedTaskGrad()


def _pair_cell(objective, three: bool):
    import mindspore as ms
    from mindspore import nn

    forward = tasks._pair_cell(objective, three)

    class WeightedPairGrad(nn.Cell):
        """(anchor, positive, negative, w) -> (components, d(sum_i w_i c_i) / d each embedding)."""

        def __init__(self):
            super().__init__(auto_prefix=False)
            self.forward = forward
            self.grad_fn = ms.value_and_grad(self._weighted, (0, 1, 2), None, has_aux=True)

        def _weighted(self, a, p, n, w):
            comps = self.forward(a, p, n)[1:]
            return (comps * w).sum(), comps

        def construct(self, a, p, n, w):
            (_, comps), g = self.grad_fn(a, p, n, w)
            return comps, g

    return WeightedPairGrad()


def component_grad(ctx, batch, w: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """(components float64[K], the model's parameter gradients) of sum_i w_i c_i on one batch."""
    import mindspore as ms

    from objdebug.engine import dynamic_graph

    engine, (_, rs) = ctx.engine, batch
    wt = ms.Tensor(np.asarray(w, np.float32))
    wspec = ms.Tensor(shape=[None], dtype=ms.float32)
    if tasks.kind_of(ctx.config) == "embedding":
        ids, embs = _embedded(ctx, rs)
        xs = [ms.Tensor(e.astype(np.float32)) for e in embs]
        three = len(xs) == 3
        spec = ms.Tensor(shape=[None, xs[0].shape[-1]], dtype=ms.float32)
        comps, gs = dynamic_graph.call(engine, PAIR_GRAPH + (".triplet" if three else ".pair"),
                                       lambda: _pair_cell(engine.target.objective, three),
                                       (spec, spec, spec, wspec), xs[0], xs[1], xs[2] if three else xs[0], wt)
        grads = None
        for i, g in zip(ids, gs[:len(xs)]):  # the model sees each text: its gradients add up
            part = tasks.param_grad(engine, i, g.asnumpy())[1]
            grads = part if grads is None else [a + b for a, b in zip(grads, part)]
        return comps.asnumpy().astype(np.float64), grads
    ids = tasks.pad([r.ids for r in rs], engine.padding.pad_id, tasks.bucket(max(len(r.ids) for r in rs)))
    out = tasks.forward(engine, ids)
    labels = ms.Tensor(_labels(ctx, rs, ids.shape[1]))
    spec = (ms.Tensor(shape=[None] * (len(out.shape) - 1) + [out.shape[-1]], dtype=out.dtype),
            ms.Tensor(shape=[None] * len(labels.shape), dtype=labels.dtype), wspec)
    comps, g = dynamic_graph.call(engine, LOGIT_GRAPH + f".rank{len(out.shape)}",
                                  lambda: _logit_cell(engine.target.objective), spec, out, labels, wt)
    return comps.asnumpy().astype(np.float64), tasks.param_grad(engine, ids, g.asnumpy())[1]


def values(ctx) -> dict[str, Any]:
    """(per-sample outputs [N, 1 + K], batches of row indices) for `component_values`."""
    rs = rows(ctx)
    return {"out": per_sample(ctx, rs), "batches": batches(ctx, len(rs))}
