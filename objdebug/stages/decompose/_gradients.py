"""The decompose stage's gradient measurement: the norm of each component's gradient on the
shared parameters, from sum_i w_i * c_i called with one-hot `w` (one compile for K components;
split form: the objective's weighted logit gradient and the model's shared VJP), computed once
and shared by OBJ304 and OBJ305."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import objdebug.stages.decompose.task_terms as task_terms
from objdebug.engine.data import Sample
from objdebug.pipeline.context import Context
from objdebug.stages.decompose._common import _samples, shared_params

GRAPH_NAME = "decompose.component_grad"
LOGIT_GRAPH_NAME = "decompose.component_logit_grad"


def _build_weighted_grad(ctx: Context):
    """One Cell: (input_ids, labels, w) -> ((sum_i w_i c_i, components), grads wrt model params):
    the engine's gradient family (`ObjectiveGradient`) on a weighted total."""
    from mindspore import nn

    from objdebug.engine.cells import BatchObjective
    from objdebug.engine.gradients import ObjectiveGradient

    class WeightedComponents(nn.Cell):
        def __init__(self, target):
            super().__init__(auto_prefix=False)  # keep the user's parameter names
            self.batch = BatchObjective(target)

        def construct(self, input_ids, labels, w):
            _, outputs = self.batch(input_ids, labels)
            comps = outputs[1:]
            return (comps * w).sum(), comps

    return ObjectiveGradient(WeightedComponents(ctx.target), shared_params(ctx))


def gradient_batches(ctx: Context, samples: list[Sample], n_batches: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Up to n_batches engine batches at ONE bucket length (one graph), short ones filled."""
    chosen = samples[:max(1, n_batches) * ctx.engine.batch_size]
    length = ctx.engine.bucket(max(s.length for s in chosen))
    return [(b.input_ids, b.labels) for b in ctx.engine.batches(chosen, length)]


def _build_weighted_logit_grad(ctx: Context):
    """(logits, labels, w) -> (components, d(sum_i w_i c_i) / d logits): the objective alone."""
    import mindspore as ms
    from mindspore import nn

    from objdebug.engine.cells import as_outputs, call_on_logits

    class WeightedLogitGrad(nn.Cell):
        def __init__(self, objective, flat):
            super().__init__(auto_prefix=False)
            self.objective = objective
            self.flat = flat
            self.grad_fn = ms.value_and_grad(self._weighted, 0, None, has_aux=True)

        def _weighted(self, logits, labels, w):
            _, outputs = as_outputs(call_on_logits(self.objective, self.flat, logits, labels))
            comps = outputs[1:]
            return (comps * w).sum(), comps

        def construct(self, logits, labels, w):
            (_, comps), g = self.grad_fn(logits, labels, w)
            return comps, g

    return WeightedLogitGrad(ctx.target.objective, ctx.config.objective.call == "flat")


def _component_grad(ctx: Context, ids: np.ndarray, labels: np.ndarray, w: np.ndarray):
    """(components float32[K], gradients) of sum_i w_i c_i on one batch.

    Split form (engine/gradients.py `vjp_applies`): the objective's weighted logit gradient
    (`decompose.component_logit_grad`, the objective alone, dynamic shapes) and the model's
    VJP (`model.vjp`, shared with every other parameter gradient of the run); otherwise one
    graph of model + objective (`decompose.component_grad`)."""
    import mindspore as ms

    from objdebug.engine import dynamic_graph
    from objdebug.engine.gradients import model_vjp, vjp_applies

    x, y = ms.Tensor(ids, ms.int32), ms.Tensor(labels, ms.int32)
    if vjp_applies(ctx.target):
        logits = ctx.engine.forward(x)
        if logits.dtype == ms.float32:
            comps, g = dynamic_graph.call(
                ctx.engine, LOGIT_GRAPH_NAME, lambda: _build_weighted_logit_grad(ctx),
                (ms.Tensor(shape=[None, None, logits.shape[-1]], dtype=ms.float32),
                 ms.Tensor(shape=[None, None], dtype=ms.int32), ms.Tensor(shape=[None], dtype=ms.float32)),
                logits, y, ms.Tensor(w))
            return comps, model_vjp(ctx.engine, ctx.target, x, g)[1]
    cell = ctx.engine.cell(GRAPH_NAME, lambda: _build_weighted_grad(ctx))
    (_, comps), grads = ctx.engine.call(GRAPH_NAME, cell, x, y, ms.Tensor(w))
    return comps, grads


def component_gradients(ctx: Context, n_components: int, batches) -> dict[str, Any]:
    """Norm of each component's mean gradient over `batches` (float64 accumulation)."""
    task = task_terms.is_task(ctx)
    params = task_terms.params(ctx) if task else shared_params(ctx)
    sums = [[np.zeros(p.shape, np.float64) for p in params] for _ in range(n_components)]
    values = np.zeros((n_components, len(batches)))
    for b, batch in enumerate(batches):
        for k in range(n_components):
            w = np.zeros(n_components, np.float32)
            w[k] = 1.0
            if task:  # the kind's graphs (task_terms.py): numpy already
                comps, grads = task_terms.component_grad(ctx, batch, w)
            else:
                comps, grads = _component_grad(ctx, *batch, w)
                comps, grads = comps.asnumpy(), [g.asnumpy() for g in grads]
            values[k, b] = float(comps[k])
            for acc, g in zip(sums[k], grads):
                acc += g.astype(np.float64)
    norms = []
    for k in range(n_components):
        sq = sum(float(np.sum((acc / len(batches)) ** 2)) for acc in sums[k])
        norms.append(math.sqrt(sq))
    return {"norms": norms, "batch_values": values.tolist(), "n_params": len(params)}


def measured_gradients(ctx: Context, n_components: int):
    """(batches, component_gradients): computed once, shared by OBJ304 and OBJ305."""
    def build():
        th = ctx.profile.section("decompose")
        if task_terms.is_task(ctx):
            batches = task_terms.gradient_batches(ctx, task_terms.rows(ctx), int(th["grad_batches"]))
        else:
            batches = gradient_batches(ctx, _samples(ctx), int(th["grad_batches"]))
        return batches, component_gradients(ctx, n_components, batches)
    return ctx.provide(measured_gradients, build)
