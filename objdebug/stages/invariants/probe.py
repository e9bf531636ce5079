"""Compiled probes for the invariants stage: the user's objective on given logits, its value and
its whole logit gradient, for the configured objective or a variant of it.

One kind of graph, `ObjectiveLogitGrad` (engine/gradients.py): (logits [B, T, V], labels [B, T],
scale) -> (outputs, d(scale * total) / d logits), compiled once with dynamic B and T
(engine/dynamic_graph.py), so the batch, its micro-batches and the cut batch of OBJ703 share one
compile; an objective that cannot compile with dynamic shapes falls back to one static graph per
shape. The configured objective runs on the engine's `objective.logit_grad`, the graph the grad
stage's logit checks use too. The objective is called on the batch exactly as the user calls it
(flat or sequence, through `objdebug.engine.cells.call_on_logits`); `scale` is a Tensor input, so
`grad(c * loss)` needs no second graph, and `value_and_grad(..., has_aux=True)` differentiates the
total only. A variant is the objective rebuilt from the same factory with some keyword arguments
changed (reduction "sum", label smoothing, a perturbed setting); it gets its own graph,
`invariants.logit_grad[<variant>]`, so a variant that raises never touches the configured one.

Every graph is built once per engine through `engine.cell` and called through `engine.call`, so
each compile is counted (one per dynamic graph). Inputs are fresh Tensors on every call, and the
caller gets back whether the objective changed its labels in place (`labels_changed`; forward
probes also the logits, `logits_changed`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import mindspore as ms
import numpy as np

from objdebug.engine import precision
from objdebug.engine.cells import ModelForward, ObjectiveForward
from objdebug.engine.gradients import OBJECTIVE_LOGIT_GRAD, objective_logit_grad

LOGIT_GRAD = "invariants.logit_grad"
TRAIN_MODE = "invariants.train_mode"
FORWARD = "objective.forward"  # the engine's (Engine.objective_forward)
MODEL_TRAIN = "invariants.model_train"
CONFIGURED = "configured"


@dataclass
class Probe:
    """One evaluation: the objective's outputs (float64, total first) and its logit gradient.

    The gradient stays float32 (what the graph returns) and the logits are not copied again: a
    [8, 512, 32000] batch is 0.5 GB per array, and the stage keeps a few probes."""

    outputs: np.ndarray
    grad: np.ndarray
    labels_in: np.ndarray | None = None     # what the objective was given ...
    labels_out: np.ndarray | None = None    # ... and what the Tensor holds after the call
    logits_in: np.ndarray | None = None     # forward probes only: the input ...
    logits_out: np.ndarray | None = None    # ... and the Tensor after the call

    @property
    def labels_changed(self) -> bool:
        return not np.array_equal(self.labels_in, self.labels_out)

    @property
    def logits_changed(self) -> bool:
        if self.logits_in is None or self.logits_out is None:
            return False
        return not np.array_equal(self.logits_in, self.logits_out, equal_nan=True)

    @property
    def loss(self) -> float:
        return float(self.outputs[0])


def variant_key(changes: dict[str, Any] | None) -> str:
    """'configured', or 'reduction=sum,label_smoothing=0.1' (stable: the graph's name)."""
    if not changes:
        return CONFIGURED
    return ",".join(f"{k}={_short(v)}" for k, v in sorted(changes.items()))


def _short(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"array{list(value.shape)}"
    return repr(value) if isinstance(value, str) else str(value)


def constructor_settings(factory: Any) -> dict[str, Any]:
    """The objective factory's keyword parameters and their defaults ({} when not introspectable)."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return {}
    return {name: p.default for name, p in sig.parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name != "self"}


class InvarianceProbe:
    """The configured objective and its variants on given logits, through cached graphs."""

    def __init__(self, engine: Any):
        from objdebug.engine.target import import_factory

        self.engine = engine
        self.target = engine.target
        cfg = self.target.config
        self.flat = cfg.objective.call == "flat"
        self.kwargs = dict(cfg.objective.kwargs)
        self.factory = import_factory(cfg.objective.factory, "objective", cfg.base_dir)
        self.settings = {**constructor_settings(self.factory), **self.kwargs}
        self._objectives: dict[str, Any] = {CONFIGURED: self.target.objective}

    def objective(self, changes: dict[str, Any] | None = None) -> Any:
        """The configured objective, or a new one from the factory with `changes` to its kwargs."""
        key = variant_key(changes)
        if key not in self._objectives:
            kwargs = dict(self.kwargs)
            for k, v in (changes or {}).items():
                kwargs[k] = ms.Tensor(v, ms.float32) if isinstance(v, np.ndarray) else v
            obj = self.factory(**kwargs)
            obj.set_train(False)
            # [run] amp_objective: a variant runs at the precision the configured objective runs at
            obj = precision.as_trained(obj, self.target.config, "objective", objective=True)
            self._objectives[key] = obj
        return self._objectives[key]

    def run(self, logits: np.ndarray, labels: np.ndarray, scale: float = 1.0,
            changes: dict[str, Any] | None = None) -> Probe:
        # the configured objective: the engine's `objective.logit_grad`, shared with the grad stage
        name = OBJECTIVE_LOGIT_GRAD if not changes else f"{LOGIT_GRAD}[{variant_key(changes)}]"
        # a Tensor made from an array copies it (measured: a write inside the graph never reached
        # the array), so the logits are not copied again here; the labels are, being small
        x = np.ascontiguousarray(logits, np.float32)
        y = np.ascontiguousarray(labels, np.int32)
        tx, ty = ms.Tensor(x, ms.float32), ms.Tensor(y.copy(), ms.int32)
        ts = ms.Tensor(np.float32(scale), ms.float32)
        outputs, g = self._call(name, changes, tx, ty, ts)
        return Probe(outputs=outputs.asnumpy().astype(np.float64), grad=g.asnumpy(),
                     labels_in=y, labels_out=ty.asnumpy())

    def _call(self, name: str, changes: dict[str, Any] | None, tx, ty, ts):
        return objective_logit_grad(self.engine, self.objective(changes), self.flat, tx, ty, ts, name)

    def forward(self, logits: np.ndarray, labels: np.ndarray, train: bool = False) -> Probe:
        """The configured objective forward only (no autodiff), in evaluation or training mode.

        Forward only and on the inputs exactly as the objective receives them (flat: [N, V] and
        [N]) on purpose: in MindSpore 2.10 graph mode an objective that writes into its labels
        (`ops.assign`) changes the caller's Tensor only then; inside `value_and_grad`, or after a
        reshape in the graph, it writes into a copy. Graphs `objective.forward` (the engine's)
        and `invariants.train_mode` (dynamic B and T); the training-mode graph puts the objective
        back into evaluation mode afterwards, as every other graph expects it.
        """
        x = np.ascontiguousarray(logits, np.float32)
        y = np.ascontiguousarray(labels, np.int32)
        if self.flat:  # [N, V] / [N], as the objective receives them
            x, y = x.reshape(-1, x.shape[-1]), y.reshape(-1)
        tx, ty = ms.Tensor(x.copy(), ms.float32), ms.Tensor(y.copy(), ms.int32)
        if not train:  # the engine's own forward graph (each sample's loss runs on it too)
            out = self.engine.objective_forward(tx, ty)
        else:
            def build():
                cell = ObjectiveForward(self.target.objective)
                lead = [None] if self.flat else [None, None]
                cell.set_inputs(ms.Tensor(shape=lead + [x.shape[-1]], dtype=ms.float32),
                                ms.Tensor(shape=lead, dtype=ms.int32))
                return cell
            cell = self.engine.cell(TRAIN_MODE, build)
            cell.set_train(True)
            try:
                out = self.engine.call(TRAIN_MODE, lambda: cell(tx, ty))
            finally:
                cell.set_train(False)
        return Probe(outputs=out.asnumpy().astype(np.float64), grad=np.zeros(0), labels_in=y,
                     labels_out=ty.asnumpy(), logits_in=x, logits_out=tx.asnumpy())


def model_logits_in_train_mode(engine: Any, input_ids: np.ndarray) -> np.ndarray:
    """The model's logits with the model in training mode (dropout on); evaluation mode restored."""
    cell = engine.cell(MODEL_TRAIN, lambda: ModelForward(engine.target.model))
    cell.set_train(True)
    try:
        out = engine.call(MODEL_TRAIN, cell, ms.Tensor(np.asarray(input_ids, np.int32)))
    finally:
        cell.set_train(False)
    return out.asnumpy().astype(np.float32)


def dropout_cells(*cells: Any) -> list[str]:
    """Names of dropout Cells (drop probability > 0) inside `cells`: they make training mode random."""
    out = []
    for root in cells:
        if root is None:
            continue
        for name, cell in root.cells_and_names():
            if "dropout" not in type(cell).__name__.lower():
                continue
            p = getattr(cell, "p", None)
            if p is None and getattr(cell, "keep_prob", None) is not None:
                p = 1.0 - float(cell.keep_prob)
            if p is not None and float(p) > 0:  # a dropout Cell that drops (not a wrapper named so)
                out.append(f"{name or type(cell).__name__} (p={float(p):g})")
    return out


class LibraryInvarianceProbe:
    """`InvarianceProbe.run` for a library model as the end-to-end target (engine/library_logits.py).

    The library's own loss in its own graph on the grad stage's batch, its output head's logits
    replaced by the logits asked for (the head's output + (logits - head's output): a shift c or
    all-zero logits come out exactly) and its labels by the labels asked for, mapped back to the
    input labels the library takes (labels[t] of the head's position t is the input label t + 1 of
    a model that shifts them itself; a label moved onto a position the library does not score, the
    last one, is dropped). Only the configured objective at scale 1 on that batch: the checks that
    need another batch shape, a variant or an upstream scale skip the end-to-end form.
    """

    def __init__(self, handle: Any, input_ids: np.ndarray, input_labels: np.ndarray):
        self.handle = handle
        self.ids = input_ids
        self.input_labels = input_labels
        self.head = handle.run(input_ids, input_labels)  # the logits the library computes here

    def input_labels_for(self, labels: np.ndarray) -> np.ndarray:
        """Loss-position labels [B, T'] -> the input labels [B, T] the library takes."""
        pad = self.handle.target.config.data.label_pad_id
        out = np.full_like(self.input_labels, pad)
        start = 1 if self.handle.shifts else 0
        n = min(labels.shape[1], out.shape[1] - start)
        out[:, start:start + n] = labels[:, :n]
        return out

    def run(self, logits: np.ndarray, labels: np.ndarray, scale: float = 1.0,
            changes: dict[str, Any] | None = None) -> Probe:
        if changes or scale != 1.0 or logits.shape != self.head["logits"].shape:
            raise ValueError("For 'LibraryInvarianceProbe.run', the end-to-end form runs the configured "
                             f"objective at scale 1 on logits of shape {list(self.head['logits'].shape)}, "
                             f"but got changes {changes}, scale {scale}, shape {list(logits.shape)}.")
        seen = self.head["logits"]
        delta = None if logits is seen else (np.asarray(logits, np.float32) - seen).astype(np.float32)
        y = self.input_labels_for(np.asarray(labels))
        out = self.handle.run(self.ids, y, delta)
        return Probe(outputs=out["outputs"], grad=out["grad"], labels_in=y, labels_out=y)
