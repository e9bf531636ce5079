"""Compiled gradient machinery: the user's objective, its parameter and logit gradients.

Three kinds of graph, each built once per engine through `engine.cell` and called through
`engine.call` so every compile is counted. The first two call the objective on a whole batch
exactly as the user does (flat / sequence / end-to-end) and return `(total, outputs)`, so
`value_and_grad(..., has_aux=True)` differentiates the total only.

- The parameter gradient (`param_grad`). Split form, every trainable parameter the model's
  (`vjp_applies`): `model.forward` (the engine's one dynamic forward), the objective's
  `objective.logit_grad` on those logits, and `model.vjp` (`cells.ModelVJP`, dynamic shapes) with
  that logit gradient as the cotangent: dL/dparams through the one model-holding backward graph
  every objective shares (the decomposition's components and a preference loss call `model_vjp`
  with their own cotangents; docs/performance.md "The graph floor"). Otherwise (end-to-end, an
  objective with parameters of its own, logits that are not float32) `objective.param_grad`
  (input_ids, labels), one fused dynamic-shape forward + backward graph (engine/dynamic_graph.py).
  A measurement of one shape's own cost (a long input's peak memory) calls the fused static twin
  `objective.param_grad.static`. The finite-difference evaluations need the batch total only:
  in the split form with float32 logits, `model.forward` + `objective.forward` on the whole batch
  (both compiled anyway, forward only); otherwise the static twin at the batch's shape, which
  the end-to-end form's gradient uses too (two dozen calls of one shape: a dynamic graph's call
  costs up to ~2x a static one on CPU).
- `gradient.stats` (*grads) reduces a gradient tuple to small tensors per parameter (squared L2
  norm, max |g|, exact zeros; and, only when a squared norm is not finite, a second graph
  `gradient.stats.nonfinite` counts the NaN/Inf elements and the finite squared norm), so a large
  model never copies its gradients to the host. It is a graph of its own, not part of each
  forward + backward graph: its shapes are the parameters', the same at every input length, so it
  compiles once per run while the stress stage compiles a forward + backward graph per length
  (each ~1.4 s cheaper on the demo model without the reductions of its 28 parameters). Gradients
  of at most `HOST_STATS_MAX_ELEMENTS` (2^24) elements in all are reduced on the host in float64
  instead (`host_stats`): the copy costs less than the compile.
  The directional derivatives g.d of the finite differences are taken on the host, in float64,
  from the gradients the gradient-direction check reads anyway (`ParamGradients.gdot`).
- `objective.logit_grad` (logits, labels, scale) differentiates the configured objective w.r.t.
  the logits (`ObjectiveLogitGrad`), one dynamic-shape graph (engine/dynamic_graph.py) for every
  batch shape: the grad stage reads the gradient [B, T, V] (the size of the logits, which are on
  the host already) and its squared norm per position, taken on the host in float64, for padding
  leakage, scale sensitivity and the likelihood shape (OBJ208); the invariants stage, the stress
  cases and the packing stage call the same graph.

The one family of gradient reductions: `ObjectiveGradient` differentiates any forward Cell,
`reduce_gradients` reduces its gradient tuple to per-parameter statistics (through
`Engine.gradient_stats` in the stages, directly in the training monitor). The grad stage,
decompose, the stress cases and the monitor all use them, and `max_mean_ratio` on the host, so
OBJ202 and OBJ603 read the same numbers off the same gradients.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from dataclasses import dataclass
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from objdebug.engine import cache_proof, dynamic_graph
from objdebug.engine.cells import BatchObjective, as_outputs, call_on_logits
from objdebug.engine.data import Batch  # noqa: F401  (re-exported: objdebug.engine.gradients.Batch)
from objdebug.core.naming import layer_of  # noqa: F401  (re-exported: objdebug.engine.gradients.layer_of)

PARAM_GRAD = "objective.param_grad"
MODEL_VJP = "model.vjp"
OBJECTIVE_LOGIT_GRAD = "objective.logit_grad"
STATS = "gradient.stats"
STATS_NONFINITE = "gradient.stats.nonfinite"


def gradient_norms(grads):
    """The per-parameter reduction every gradient gets -> float32[P] each: squared L2 norm, max
    |g| and exact zeros. A finite squared norm proves every element finite (a NaN or Inf element
    makes its square and the sum NaN / Inf), so a healthy gradient needs nothing more."""
    sq, mx, zeros = [], [], []
    for g in grads:
        g32 = ops.cast(g, ms.float32)
        sq.append((g32 * g32).sum())
        mx.append(ops.abs(g32).max())
        zeros.append(ops.cast(g32 == 0, ms.float32).sum())
    return ops.stack(sq), ops.stack(mx), ops.stack(zeros)


def gradient_stats(grads):
    """`gradient_norms`, then NaN/Inf elements and the squared L2 norm over the finite elements
    only (what a monitor plots when a few overflow) -> five float32[P]; needed only for a gradient
    whose squared norm is not finite."""
    bad, finite_sq = [], []
    for g in grads:
        g32 = ops.cast(g, ms.float32)
        finite = ops.isfinite(g32)
        bad.append(ops.cast(ops.logical_not(finite), ms.float32).sum())
        kept = ops.select(finite, g32, ops.zeros_like(g32))
        finite_sq.append((kept * kept).sum())
    return (*gradient_norms(grads), ops.stack(bad), ops.stack(finite_sq))


class GradientNorms(nn.Cell):
    """`gradient_norms` as a graph: (*grads) -> three float32[P] tensors.

    The gradients are separate arguments (not one tuple, which MindSpore would fold in as a
    constant and recompile on every call). Its input shapes are the parameters': one compile
    serves every batch shape of the forward + backward graphs that produced the gradients. It
    has 3 of `GradientStats`' 5 reductions per parameter, and compiles in ~60% of its time
    (demo model, 28 parameters: 0.9 s vs 1.5 s).
    """

    def construct(self, *grads):
        return gradient_norms(grads)


class GradientStats(nn.Cell):
    """`gradient_stats` as a graph: (*grads) -> five float32[P] tensors; run only for gradients
    whose squared norm is not finite (`complete_stats`)."""

    def construct(self, *grads):
        return gradient_stats(grads)


STAT_NAMES = ("sq_norm", "max_abs", "zeros", "nonfinite", "finite_sq")


def stats_on_host(stats) -> dict[str, np.ndarray]:
    """GradientStats' (or GradientNorms') outputs (Tensors) -> float64 arrays by name."""
    return {k: o.asnumpy().astype(np.float64) for k, o in zip(STAT_NAMES, stats)}


# Gradients of at most this many elements in all are reduced on the host, in float64: copying
# 2^24 float32 (64 MiB) costs ~10-20 ms, compiling the reduction graph ~1 s (the demo model's 28
# parameters; ~35 ms more per parameter), so every test and demo target skips the compile, and a
# real model's gradients (hundreds of millions of elements, on an accelerator) never leave the
# device.
HOST_STATS_MAX_ELEMENTS = 1 << 24


def on_host(grads) -> bool:
    """Whether `reduce_gradients` reduces these gradients on the host."""
    return sum(int(np.prod(g.shape)) for g in grads) <= HOST_STATS_MAX_ELEMENTS


def host_stats(grads) -> dict[str, np.ndarray]:
    """The five statistics of `gradient_stats` on the host, in float64 (each gradient read once)."""
    out: dict[str, list[float]] = {k: [] for k in STAT_NAMES}
    for g in grads:
        a = (g.asnumpy() if isinstance(g, ms.Tensor) else np.asarray(g)).astype(np.float64).ravel()
        finite = np.isfinite(a)
        kept = np.where(finite, a, 0.0)
        with np.errstate(invalid="ignore", over="ignore"):
            out["sq_norm"].append(float(np.dot(a, a)) if a.size else 0.0)
            out["max_abs"].append(float(np.abs(a).max()) if a.size else 0.0)
        out["zeros"].append(float(np.count_nonzero(a == 0)))
        out["nonfinite"].append(float(a.size - np.count_nonzero(finite)))
        out["finite_sq"].append(float(np.dot(kept, kept)) if a.size else 0.0)
    return {k: np.asarray(v, np.float64) for k, v in out.items()}


def complete_stats(norms, full: Any) -> dict[str, np.ndarray]:
    """The five statistics from `GradientNorms`' outputs: every squared norm finite means no
    NaN/Inf element (nonfinite 0, finite_sq = sq_norm, the very same sums); otherwise `full()`,
    the `GradientStats` outputs, counts them."""
    out = stats_on_host(norms)
    if np.isfinite(out["sq_norm"]).all():
        out["nonfinite"] = np.zeros_like(out["sq_norm"])
        out["finite_sq"] = out["sq_norm"].copy()
        return out
    return stats_on_host(full())


class ObjectiveGradient(nn.Cell):
    """(*inputs) -> (value, gradients) of `forward` w.r.t. `params`; reduce the gradients with
    `reduce_gradients` (`Engine.gradient_stats`).

    has_aux: `forward` returns (total, aux...) and only the total is differentiated (the value
    returned is the whole tuple); without it, the single output.
    """

    def __init__(self, forward, params, has_aux: bool = True):
        super().__init__(auto_prefix=False)  # keep the user's parameter names
        self.forward = forward
        self.weights = ms.ParameterTuple(params)
        self.grad_fn = cache_proof.value_and_grad(self, self.forward, None, self.weights, has_aux=has_aux)

    def proof_gradients(self, out):
        """Where the output holds the gradient value_and_grad returns (engine/cache_proof.py)."""
        return out[1]

    def construct(self, *inputs):
        return self.grad_fn(*inputs)


def param_grad(engine: Any, target: Any, input_ids, labels, static: bool = False):
    """((total, outputs), grads) of the batch total's forward + backward on Tensors (input_ids,
    labels) [B, T], grads in `target.trainable_params()` order.

    Split form (`vjp_applies`): the shared forward `model.forward`, the objective's own
    `objective.logit_grad` on its logits, and the model's vector-Jacobian product `model.vjp`
    with that logit gradient: the same dL/dparams, through the graphs every other objective's
    gradient shares (docs/performance.md). Otherwise (end-to-end, an objective with parameters
    of its own, logits that are not float32) the fused dynamic graph `objective.param_grad`.
    `static`: the batch's own fused static graph (one compile per shape, for a measurement of
    what that one shape costs)."""
    build = lambda: ObjectiveGradient(BatchObjective(target), list(target.trainable_params()))  # noqa: E731
    if static:
        return dynamic_graph.call_static(engine, PARAM_GRAD, build, input_ids, labels)
    if vjp_applies(target):
        logits = engine.forward(input_ids)
        if logits.dtype == ms.float32:
            flat = target.config.objective.call == "flat"
            outputs, g = objective_logit_grad(engine, target.objective, flat, logits, labels, unit_scale())
            return (outputs[0], outputs), model_vjp(engine, target, input_ids, g)[1]
    spec = ms.Tensor(shape=[None, None], dtype=ms.int32)
    return dynamic_graph.call(engine, PARAM_GRAD, build, (spec, spec), input_ids, labels, rows=True)


def unit_scale():
    """The scale 1 of `objective_logit_grad`: the objective's own gradient, bit for bit."""
    return ms.Tensor(np.float32(1.0), ms.float32)


def vjp_applies(target: Any) -> bool:
    """Whether the configured objective's parameter gradient can go through `model_vjp`: the
    split form, with every trainable parameter the model's (an objective's own parameters get
    no gradient from the logits)."""
    if target.model is None:
        return False
    model_ids = {id(p) for p in target.model.trainable_params()}
    params = list(target.trainable_params())
    return bool(params) and all(id(p) in model_ids for p in params)


def model_vjp(engine: Any, target: Any, input_ids, cotangent) -> tuple:
    """dL/dparams from dL/dlogits: the model's vector-Jacobian product (`ModelVJP`) through
    the one dynamic-shape graph `model.vjp` -> (the model's output, the gradients in
    `target.model.trainable_params()` order), Tensors. `cotangent` has the logits' shape and
    dtype (a reward model's output: [B, T] or [B])."""
    from objdebug.engine.cells import ModelVJP

    params = list(target.model.trainable_params())
    # logits [B, T, V]: V fixed; a reward model's [B, T] or [B] output: every dimension dynamic
    dims = [None] * min(len(cotangent.shape), 2) + list(cotangent.shape[2:])
    spec = (ms.Tensor(shape=[None, None], dtype=ms.int32),
            ms.Tensor(shape=dims, dtype=cotangent.dtype))
    out, grads = dynamic_graph.call(engine, MODEL_VJP, lambda: ModelVJP(target.model, params), spec,
                                    input_ids, cotangent, rows=True)
    return out, tuple(grads)


_REDUCER: dict[str, Any] = {}  # the reduction Cells, one per process (MindSpore keys graphs on them)


def reduce_gradients(grads, run: Any = None) -> dict[str, np.ndarray]:
    """Per-parameter statistics of a gradient tuple (Tensors or arrays; a training loop's, the
    grad stage's, a stress case's) -> float64[P] arrays by name (`STAT_NAMES`).

    Small gradients (`on_host`) on the host in float64; larger ones in `GradientNorms`, and in
    `GradientStats` only when a squared norm is not finite (`complete_stats`): one compiled graph
    per process and set of gradient shapes (~1 s once on CPU), then ~10 ms a call, never a copy.
    `run(name, cell, tensors)` calls a reduction graph (`Engine.gradient_stats` passes one that
    counts the compile); default: directly."""
    if on_host(grads):
        return host_stats(grads)
    run = run or (lambda name, cell, tensors: cell(*tensors))
    tensors = [g if isinstance(g, ms.Tensor) else ms.Tensor(np.asarray(g)) for g in grads]
    norms = run(STATS, _REDUCER.setdefault(STATS, GradientNorms()), tensors)
    return complete_stats(norms, lambda: run(STATS_NONFINITE, _REDUCER.setdefault(STATS_NONFINITE, GradientStats()),
                                             tensors))


def max_mean_ratio(norms: np.ndarray, over: list[int] | None = None) -> tuple[float, int, float]:
    """(max / mean, index of the max, mean) of per-parameter gradient norms over the indices
    `over` (all by default): OBJ202's and OBJ603's quantity. A NaN norm is never the max; the
    ratio is NaN when the mean is not > 0."""
    norms = np.asarray(norms, dtype=np.float64)
    pick = list(range(len(norms))) if over is None else list(over)
    if not pick:
        return float("nan"), 0, float("nan")
    sub = norms[pick]
    mean = float(sub.mean())
    imax = pick[int(np.nanargmax(sub))] if np.isfinite(sub).any() else pick[0]
    return (float(norms[imax] / mean) if mean > 0 else float("nan")), imax, mean


class ScaledObjective(nn.Cell):
    """(logits, labels, scale) -> (scale * total, outputs): the objective alone, in the user's form."""

    def __init__(self, objective, flat: bool):
        super().__init__(auto_prefix=False)  # keep the user's parameter names
        self.objective = objective
        self.flat = flat

    def construct(self, logits, labels, scale):
        total, outputs = as_outputs(call_on_logits(self.objective, self.flat, logits, labels))
        return total * scale, outputs


class ObjectiveLogitGrad(nn.Cell):
    """(logits [B, T, V], labels [B, T], scale) -> (outputs, d(scale * total) / d logits, the
    gradient's squared norm, its non-finite element count).

    `scale` is a Tensor input, so grad(c * loss) needs no second graph (OBJ709); at 1 the
    gradient is the objective's own, bit for bit. The two reductions (float32, in graph) let
    the long-objective check (OBJ513) read a [1, 32768, V] gradient without copying it to the
    host, on this same graph."""

    def __init__(self, objective, flat: bool):
        super().__init__(auto_prefix=False)
        self.loss = ScaledObjective(objective, flat)
        self.grad_fn = cache_proof.value_and_grad(self, self.loss, 0, None, has_aux=True)

    def proof_gradients(self, out):
        """Where the output holds the gradient value_and_grad returns (engine/cache_proof.py)."""
        return out[1]

    def construct(self, logits, labels, scale):
        (_, outputs), g = self.grad_fn(logits, labels, scale)
        g32 = ops.cast(g, ms.float32)
        return outputs, g, (g32 * g32).sum(), ops.logical_not(ops.isfinite(g32)).astype(ms.float32).sum()


def _logit_grad_call(engine: Any, objective: Any, flat: bool, logits, labels, scale, name: str):
    return dynamic_graph.call(
        engine, name, lambda: ObjectiveLogitGrad(objective, flat),
        (ms.Tensor(shape=[None, None, logits.shape[-1]], dtype=ms.float32),
         ms.Tensor(shape=[None, None], dtype=ms.int32), ms.Tensor(shape=[], dtype=ms.float32)),
        logits, labels, scale)


def objective_logit_grad(engine: Any, objective: Any, flat: bool, logits, labels, scale,
                         name: str = OBJECTIVE_LOGIT_GRAD):
    """`ObjectiveLogitGrad` of `objective` on Tensors (logits, labels, scale) -> (outputs, gradient)
    Tensors, through the dynamic-shape graph `name` (engine/dynamic_graph.py): the grad stage's
    batch, the invariants' micro-batches and cut batches, the stress probes, the long objective
    share one compile. The configured objective's graph is `objective.logit_grad`; a variant
    passes its own name, so a variant that raises never touches it."""
    outputs, g, _, _ = _logit_grad_call(engine, objective, flat, logits, labels, scale, name)
    return outputs, g


def objective_logit_grad_norm(engine: Any, objective: Any, flat: bool, logits, labels,
                              name: str = OBJECTIVE_LOGIT_GRAD):
    """(outputs, squared norm of the logit gradient, its non-finite element count) as Tensors,
    at scale 1, on the same graph as `objective_logit_grad`; the gradient stays where it is."""
    outputs, _, sq, bad = _logit_grad_call(engine, objective, flat, logits, labels, unit_scale(), name)
    return outputs, sq, bad


def squared_norm_per_position(g: np.ndarray) -> np.ndarray:
    """float64[B, T]: sum over the vocabulary of g^2, row by row (no float64 copy of the whole
    [B, T, V] gradient)."""
    return np.stack([np.square(row, dtype=np.float64).sum(-1) for row in g]) if len(g) else \
        np.zeros(g.shape[:-1])


# --------------------------------------------------------------------------- host side
@dataclass
class ParamGradients:
    """Per-parameter gradient statistics of the batch total, reduced in graph."""

    names: list[str]
    sizes: np.ndarray          # int64[P] elements per parameter
    outputs: np.ndarray        # float64[K]: total, then components
    sq_norm: np.ndarray        # float64[P]
    max_abs: np.ndarray        # float64[P]
    zeros: np.ndarray          # int64[P] exact zeros
    nonfinite: np.ndarray      # int64[P] NaN / Inf elements
    grads: tuple = ()          # the gradients as MindSpore Tensors (left on the device until read)
    directions: list[np.ndarray] | None = None  # [n, *shape] per parameter: what `gdot` projects on

    @property
    def loss(self) -> float:
        return float(self.outputs[0])

    @cached_property
    def gdot(self) -> np.ndarray:
        """float64[n_directions]: g . d_k for each direction, on the host in float64 (the
        gradients are read once, when asked: the finite-difference check reads them anyway)."""
        if self.directions is None:
            return np.zeros(0)
        host = [g.asnumpy().astype(np.float64) for g in self.grads]
        n = self.directions[0].shape[0] if self.directions else 0
        return np.array([sum(float((g * d[k].astype(np.float64)).sum())
                             for g, d in zip(host, self.directions)) for k in range(n)])

    @property
    def norms(self) -> np.ndarray:
        return np.sqrt(self.sq_norm)


class GradientProbe:
    """Gradients of one target's objective, through graphs cached on the engine."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.target = engine.target
        # no parameters is legal here: the logit gradients do not need any; the parameter
        # gradients raise (the grad checks that need them skip such a target first)
        self.params = list(self.target.trainable_params())
        self.names = [p.name for p in self.params]
        self.sizes = np.array([int(p.size) for p in self.params], dtype=np.int64)

    # ------------------------------------------------------------------ parameters
    def _need_params(self) -> list:
        if not self.params:
            raise ValueError("For 'GradientProbe', the target must have trainable parameters, "
                             "but got none.")
        return self.params

    def random_directions(self, n: int, seed: int) -> list[np.ndarray]:
        """n directions in parameter space, each of unit L2 norm over all parameters (seeded)."""
        rng = np.random.default_rng(seed)
        dirs = [rng.standard_normal((n, *p.shape)).astype(np.float32) for p in self._need_params()]
        total = np.sqrt(sum((d.astype(np.float64).reshape(n, -1) ** 2).sum(1) for d in dirs))
        return [(d / total.reshape((n,) + (1,) * (d.ndim - 1))).astype(np.float32) for d in dirs]

    def _forward_backward(self, batch: Batch, static: bool | None = None):
        """((total, outputs), grads) of the batch total: the `objective.param_grad` graph, or
        (`static`; by default in the end-to-end form, whose finite differences take their totals
        from it, see `batch_total`) its static twin at the batch's shape."""
        self._need_params()
        return param_grad(self.engine, self.target, ms.Tensor(batch.input_ids, ms.int32),
                          ms.Tensor(batch.labels, ms.int32),
                          static=self.target.model is None if static is None else static)

    def batch_total(self, batch: Batch) -> float:
        """The batch total, the function the parameter gradient differentiates, at the current
        parameters. Split form with float32 logits: `model.forward` + the objective alone,
        forward only, on the whole batch (`objective.forward`, the graph each sample's loss
        goes through: no backward through the model, nor through the objective, whose [B, T, V]
        logit gradient a total does not need; measured on the 32000-token vocabulary at
        [8, 128]: 0.08 s against 0.91 s through `objective.logit_grad`, the same total bit for
        bit; a run that scores no rows, `--stages grad`, compiles that small graph for them,
        objective only); otherwise (end-to-end, or logits of another dtype, which the float32 objective
        graph would not score as the model's own graph does) the parameter-gradient graph's
        static twin at the batch's shape."""
        if self.target.model is not None:
            logits = self.engine.forward(ms.Tensor(batch.input_ids, ms.int32))
            if logits.dtype == ms.float32:
                labels = ms.Tensor(batch.labels, ms.int32)
                if self.target.config.objective.call == "flat":  # as the gradient's graph calls it
                    logits, labels = logits.reshape((-1, logits.shape[-1])), labels.reshape((-1,))
                return float(self.engine.objective_forward(logits, labels).asnumpy()[0])
        (total, _), _ = self._forward_backward(batch, static=True)
        return float(total.asnumpy())

    def parameters(self, batch: Batch, directions: list[np.ndarray] | None = None) -> ParamGradients:
        """One forward + backward of the batch total; per-parameter statistics reduced in graph
        (`Engine.gradient_stats`). `directions`: what `ParamGradients.gdot` projects on."""
        (_, outputs), grads = self._forward_backward(batch)
        stats = self.engine.gradient_stats(grads)
        return ParamGradients(names=self.names, sizes=self.sizes,
                              outputs=outputs.asnumpy().astype(np.float64), sq_norm=stats["sq_norm"],
                              max_abs=stats["max_abs"], zeros=stats["zeros"].astype(np.int64),
                              nonfinite=stats["nonfinite"].astype(np.int64), grads=tuple(grads),
                              directions=directions)

    def gradient_direction(self, g: ParamGradients) -> list[np.ndarray]:
        """The normalized gradient g/|g| as one direction ([1, *shape] per parameter).

        Along it the directional derivative is |g|, the largest of all unit directions, so its
        finite difference stands far above float32 rounding noise (a random direction's g.d is
        |g|/sqrt(P) on average and can be near 0).
        """
        host = [t.asnumpy().astype(np.float64) for t in g.grads]
        norm = float(np.sqrt(sum(float((a * a).sum()) for a in host)))
        if not norm > 0:
            raise ValueError("For 'gradient_direction', the gradient must be non-zero and finite, "
                             f"but got norm {norm}.")
        return [(a / norm).astype(np.float32)[None] for a in host]

    @contextmanager
    def saved_parameters(self) -> Iterator[list[np.ndarray]]:
        """The parameters copied to the host once; restored exactly (bit for bit) on exit."""
        saved = [p.data.asnumpy().copy() for p in self._need_params()]
        try:
            yield saved
        finally:
            for p, theta in zip(self.params, saved):
                p.set_data(ms.Tensor(theta))

    def loss_at(self, batch: Batch, directions: list[np.ndarray], step: float, k: int,
                saved: list[np.ndarray] | None = None) -> float:
        """The batch total at theta + step * d_k (`batch_total`: no graph of its own).

        `saved`: theta from an enclosing `saved_parameters()`, which restores the parameters once
        at its end, so a whole finite-difference measurement copies them to the host once.
        Without it, this call saves and restores them itself.
        """
        if saved is None:
            with self.saved_parameters() as theta:
                return self.loss_at(batch, directions, step, k, theta)
        for p, theta, d in zip(self.params, saved, directions):
            moved = (theta.astype(np.float64) + step * d[k].astype(np.float64)).astype(theta.dtype)
            p.set_data(ms.Tensor(moved))
        return self.batch_total(batch)

    def parameter_norm(self, saved: list[np.ndarray] | None = None) -> float:
        """L2 norm over all parameters (of `saved` when given: no copy from the device)."""
        arrays = saved if saved is not None else [p.data.asnumpy() for p in self.params]
        return float(np.sqrt(sum(float((a.astype(np.float64) ** 2).sum()) for a in arrays)))

    # ------------------------------------------------------------------ logits
    def logits(self, logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(outputs float64[K], squared logit-gradient norm per position float64[B, T],
        the logit gradient float32[B, T, V]), through the configured objective's
        `objective.logit_grad` graph (shared with the invariants stage)."""
        flat = self.target.config.objective.call == "flat"
        outputs, g = objective_logit_grad(self.engine, self.target.objective, flat,
                                          ms.Tensor(logits, ms.float32), ms.Tensor(labels, ms.int32),
                                          ms.Tensor(np.float32(1.0), ms.float32))
        g = g.asnumpy()
        return outputs.asnumpy().astype(np.float64), squared_norm_per_position(g), g


def reference_mean_ce_grad(logits: np.ndarray, labels: np.ndarray, label_pad_id: int) -> np.ndarray:
    """Reference (numpy float64): squared norm per position of d(mean CE)/d(logits), [B, T].

    A standard mean cross-entropy over the n scored positions has gradient (softmax - onehot) / n
    at each scored position and 0 elsewhere.
    """
    x = logits.astype(np.float64)
    scored = labels != label_pad_id
    n = max(int(scored.sum()), 1)
    x = x - x.max(axis=-1, keepdims=True)
    p = np.exp(x)
    p /= p.sum(axis=-1, keepdims=True)
    safe = np.where(scored, labels, 0).astype(np.int64)
    np.put_along_axis(p, safe[..., None], np.take_along_axis(p, safe[..., None], -1) - 1.0, -1)
    sq = (p ** 2).sum(-1) / n ** 2
    return np.where(scored, sq, 0.0)
