"""Compiled gradient machinery: the user's objective, its parameter and logit gradients.

Two graphs, each built once per engine through `engine.cell` and called through `engine.call`
so every compile is counted. Both call the objective on a whole batch exactly as the user does
(flat / sequence / end-to-end) and return `(total, outputs)`, so
`value_and_grad(..., has_aux=True)` differentiates the total only.

- `grad.param_probe` (input_ids, labels, directions) runs one forward + backward and reduces the
  gradients inside the graph to small tensors per parameter (squared L2 norm, max |g|, exact
  zeros, non-finite count) and to the directional derivatives g.d along the given directions, so
  a large model never copies its gradients to the host unless asked (the gradients themselves are
  returned as Tensors, read only for the finite differences along the gradient direction). The
  same graph gives the loss for the finite-difference evaluations: no extra compile.
- `grad.logit_probe` (logits, labels) differentiates the objective w.r.t. the logits and returns
  the squared gradient norm per position [B, T], for padding leakage and scale sensitivity, and
  the gradient itself [B, T, V] (the size of the logits, which are on the host already) for the
  likelihood-shape comparison (OBJ208): one graph for all three checks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from objdebug.engine.cells import BatchObjective, ObjectiveOnLogits
from objdebug.engine.data import Sample, pack
from objdebug.engine.model_inputs import pack_for
from objdebug.naming import layer_of  # noqa: F401  (re-exported: objdebug.engine.gradients.layer_of)

PARAM_PROBE = "grad.param_probe"
LOGIT_PROBE = "grad.logit_probe"


def _build_param_probe(target, params):
    class ParamProbe(nn.Cell):
        """(input_ids, labels, directions) -> (outputs, sq_norm, max_abs, zeros, nonfinite, g.d, grads)."""

        def __init__(self, loss, weights):
            super().__init__(auto_prefix=False)
            self.loss = loss
            self.weights = ms.ParameterTuple(weights)
            self.grad_fn = ms.value_and_grad(self.loss, None, self.weights, has_aux=True)

        def construct(self, input_ids, labels, *directions):
            (_, outputs), grads = self.grad_fn(input_ids, labels)
            sq, mx, zeros, bad = [], [], [], []
            gdot = ops.zeros((directions[0].shape[0],), ms.float32)
            for g, d in zip(grads, directions):
                g32 = ops.cast(g, ms.float32)
                sq.append((g32 * g32).sum())
                mx.append(ops.abs(g32).max())
                zeros.append(ops.cast(g32 == 0, ms.float32).sum())
                bad.append(ops.cast(ops.logical_not(ops.isfinite(g32)), ms.float32).sum())
                n = d.shape[0]
                gdot = gdot + (d * ops.expand_dims(g32, 0)).reshape((n, -1)).sum(1)
            return outputs, ops.stack(sq), ops.stack(mx), ops.stack(zeros), ops.stack(bad), gdot, grads

    return ParamProbe(BatchObjective(target), params)


def _build_logit_probe(target):
    class LogitProbe(nn.Cell):
        """(logits [B,T,V], labels [B,T]) -> (outputs, squared logit-gradient norm per position, gradient)."""

        def __init__(self):
            super().__init__(auto_prefix=False)
            self.loss = ObjectiveOnLogits(target)
            self.grad_fn = ms.value_and_grad(self.loss, 0, None, has_aux=True)

        def construct(self, logits, labels):
            (_, outputs), g = self.grad_fn(logits, labels)
            g32 = ops.cast(g, ms.float32)
            return outputs, (g32 * g32).sum(-1), g32

    return LogitProbe()


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
    gdot: np.ndarray           # float64[n_directions]: g . d
    grads: tuple = ()          # the gradients as MindSpore Tensors (left on the device until read)

    @property
    def loss(self) -> float:
        return float(self.outputs[0])

    @property
    def norms(self) -> np.ndarray:
        return np.sqrt(self.sq_norm)


@dataclass
class Batch:
    """The packed gradient batch: input_ids / labels int32[B, T] and the data rows in it."""

    input_ids: np.ndarray
    labels: np.ndarray
    samples: list[Sample] = field(default_factory=list)
    filled: int = 0            # rows that are copies, to keep the batch shape


def make_batch(samples: list[Sample], batch_size: int, length: int, pad_id: int, label_pad_id: int,
               shift: bool, config=None) -> Batch:
    """Pack `samples` into [batch_size, length]; a short batch is filled with copies (same shape).
    With the target's `config`, padded on its side and marked for the model's mask."""
    if not samples:
        raise ValueError("For 'make_batch', 'samples' must not be empty.")
    rows = list(samples[:batch_size])
    filled = batch_size - len(rows)
    rows += [rows[i % len(rows)] for i in range(filled)]
    ids, labels = (pack_for(config, rows, length) if config is not None
                   else pack(rows, length, pad_id, label_pad_id, shift))
    return Batch(ids, labels, list(samples[:batch_size]), filled)


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
        self._probe_dirs: list[np.ndarray] | None = None

    # ------------------------------------------------------------------ parameters
    def _need_params(self) -> list:
        if not self.params:
            raise ValueError("For 'GradientProbe', the target must have trainable parameters, "
                             "but got none.")
        return self.params

    def zero_directions(self, n: int = 1) -> list[np.ndarray]:
        return [np.zeros((n, *p.shape), np.float32) for p in self._need_params()]

    def random_directions(self, n: int, seed: int) -> list[np.ndarray]:
        """n directions in parameter space, each of unit L2 norm over all parameters (seeded)."""
        rng = np.random.default_rng(seed)
        dirs = [rng.standard_normal((n, *p.shape)).astype(np.float32) for p in self._need_params()]
        total = np.sqrt(sum((d.astype(np.float64).reshape(n, -1) ** 2).sum(1) for d in dirs))
        return [(d / total.reshape((n,) + (1,) * (d.ndim - 1))).astype(np.float32) for d in dirs]

    def parameters(self, batch: Batch, directions: list[np.ndarray] | None = None) -> ParamGradients:
        """One forward + backward of the batch total; statistics reduced inside the graph."""
        self._need_params()
        directions = directions if directions is not None else self.zero_directions()
        cell = self.engine.cell(PARAM_PROBE, lambda: _build_param_probe(self.target, self.params))
        # one Tensor argument per parameter: a tuple argument would be folded in as a constant
        # and recompile on every call
        dirs = [ms.Tensor(d, ms.float32) for d in directions]

        def probe(input_ids, labels, first):  # the compile log keys on ids, labels, directions[0]
            return cell(input_ids, labels, first, *dirs[1:])

        out = self.engine.call(PARAM_PROBE, probe, ms.Tensor(batch.input_ids, ms.int32),
                               ms.Tensor(batch.labels, ms.int32), dirs[0])
        self._probe_dirs = directions  # the shapes this graph was called with (see loss_at)
        *stats, grads = out
        outputs, sq, mx, zeros, bad, gdot = (o.asnumpy().astype(np.float64) for o in stats)
        return ParamGradients(names=self.names, sizes=self.sizes, outputs=outputs, sq_norm=sq,
                              max_abs=mx, zeros=zeros.astype(np.int64), nonfinite=bad.astype(np.int64),
                              gdot=gdot, grads=tuple(grads))

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
        """The batch total at theta + step * d_k.

        `saved`: theta from an enclosing `saved_parameters()`, which restores the parameters once
        at its end, so a whole finite-difference measurement copies them to the host once.
        Without it, this call saves and restores them itself. `directions` may hold any number of
        directions: the loss comes from the probe graph called with the direction shapes it was
        last called with, so moving along the gradient direction does not recompile it.
        """
        if saved is None:
            with self.saved_parameters() as theta:
                return self.loss_at(batch, directions, step, k, theta)
        for p, theta, d in zip(self.params, saved, directions):
            moved = (theta.astype(np.float64) + step * d[k].astype(np.float64)).astype(theta.dtype)
            p.set_data(ms.Tensor(moved))
        return self.parameters(batch, self._probe_dirs if self._probe_dirs is not None else directions).loss

    def parameter_norm(self, saved: list[np.ndarray] | None = None) -> float:
        """L2 norm over all parameters (of `saved` when given: no copy from the device)."""
        arrays = saved if saved is not None else [p.data.asnumpy() for p in self.params]
        return float(np.sqrt(sum(float((a.astype(np.float64) ** 2).sum()) for a in arrays)))

    # ------------------------------------------------------------------ logits
    def logits(self, logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(outputs float64[K], squared logit-gradient norm per position float64[B, T],
        the logit gradient float32[B, T, V])."""
        cell = self.engine.cell(LOGIT_PROBE, lambda: _build_logit_probe(self.target))
        outputs, sq, g = self.engine.call(LOGIT_PROBE, cell, ms.Tensor(logits, ms.float32),
                                          ms.Tensor(labels, ms.int32))
        return outputs.asnumpy().astype(np.float64), sq.asnumpy().astype(np.float64), g.asnumpy()


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
