"""The logits a library model's own loss saw, and that loss's gradient w.r.t. them, from its real graph.

A library model as the end-to-end target (`engine/library_model.py`) computes its logits inside
its construct and its loss right after, so the logit checks (OBJ205-OBJ209, OBJ701/OBJ702,
OBJ508/OBJ509, OBJ512) cannot call "the objective on logits". They are measured on the real library graph
instead, through its output head:

- `find_head` (one PyNative call of the setup probe, forward hooks on every sub-Cell; no number
  judged comes from it) finds the head: the first sub-Cell to return a tensor of the vocabulary's
  width, [B, T', V] or [B*T', V] with T' = T or T - 1 (MindFormers drops the last token before
  its head), whose output the loss reads: the loss must move when a hook adds a seeded random
  direction over the whole vocabulary to that output, so a vocabulary-wide tensor the loss does
  not read (a softmax for a metric) is passed over;
- `HeadProbe` wraps that Cell: its output plus `probe`, a [B, T', V] Parameter (0: the logits
  exactly, x + 0 = x), and a copy of the head's output written into `seen` in the graph
  (`ops.assign`). The gradient w.r.t. the probe at 0 IS dLoss/dlogits, exactly, for whatever loss
  the library computes (masking, shift, reduction, temperature included); a probe set to delta
  gives the library's loss on logits + delta (a logit shift c, logits z - x), still run in graph
  mode through the library's own code;
- the probe is put in place of the head only for the calls of its own graphs (`installed`) and
  through the parent's Cell table, so no parameter is renamed, `trainable_params()` never lists
  the probe, and every other graph is compiled from the model as the user built it;
- `loss_labels` aligns the batch's labels with the head's positions: logits[t] is scored against
  labels[t + 1] when the model shifts them itself (measured by the setup probe when its loss is a
  cross-entropy of the logits in its output; else as `[data] shift = false` declares), and a
  position without a label (the last one) reads label_pad_id.

Graph `library.logit_grad` (static shapes: one per batch shape, `.float16` / `.bfloat16` for
low precision): (input_ids, labels) -> (outputs, d total / d probe), then `seen` read back.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Parameter, nn, ops

from objdebug.engine.cells import as_outputs
from objdebug.engine import label_pairing
from objdebug.engine.label_pairing import paired_labels

LOGIT_GRAD = "library.logit_grad"
PROBE_NAME = "objdebug_head_probe"
SEEN_NAME = "objdebug_head_seen"
# the setup check that the loss reads the head adds a seeded random direction over the whole
# vocabulary (standard normal x _PERTURB) to the head's output: every class moves, the labels' own
# included. Moving one class only (class 0, as before) missed a trained head that gives that class
# ~no probability: exp(z0 + 3) stays far below float32 resolution and the loss is bit-identical.
_PERTURB = 3.0
_PERTURB_SEED = 0
_MAX_CANDIDATES = 8  # vocabulary-wide outputs tried, in the order they were computed


# --------------------------------------------------------------------------- the setup probe (PyNative)
def _vocab_shaped(out, batch: int, length: int, vocab: int | None) -> tuple[int, int] | None:
    """(ndim, positions dropped) when `out` is logits of a [batch, length] input, else None
    (a tuple a Cell returns, an integer tensor: not logits)."""
    if not isinstance(out, ms.Tensor) or out.dtype not in (
            ms.float32, ms.float16, ms.bfloat16, ms.float64):
        return None
    return _shape_fits(tuple(int(d) for d in out.shape), batch, length, vocab)


def _shape_fits(shape: tuple[int, ...], batch: int, length: int,
                vocab: int | None) -> tuple[int, int] | None:
    """`_vocab_shaped` on a shape (the one a graph recorded)."""
    if len(shape) not in (2, 3) or (vocab is not None and shape[-1] != vocab):
        return None
    for drop in (0, 1):
        want = (batch, length - drop) if len(shape) == 3 else (batch * (length - drop),)
        if shape[:-1] == want:
            return len(shape), drop
    return None


def _cell_at(root, path: str):
    cell = root
    for part in path.split("."):
        cell = cell._cells[part]  # noqa: SLF001 - the Cell table, as MindSpore keeps it
    return cell


def find_head(model, call, batch: int, length: int, vocab: int | None) -> dict[str, Any]:
    """The output head of `model` (module docstring), found while `call()` runs the model once in
    PyNative mode in the mode its loss needs, and `call()`'s loss. -> {"path", "ndim", "drop",
    "vocab"} or {"why": the reason there is none}."""
    order: list[tuple[str, int, int, int]] = []
    handles = []
    for name, cell in model.cells_and_names():
        if cell is model or not name:
            continue

        def hook(c, inputs, output, name=name):
            shape = _vocab_shaped(output, batch, length, vocab)
            if shape is not None:
                order.append((name, *shape, int(output.shape[-1])))
        handles.append(cell.register_forward_hook(hook))
    try:
        base = _scalar(call())
    finally:
        for h in handles:
            h.remove()
    if not order:
        return {"why": "no sub-Cell of the model returns logits of the vocabulary's width "
                       "([B, T, V] or [B*T, V]), so there is no output head to probe"}
    if vocab is None:  # the vocabulary unknown: the widest per-position output is the head's
        widest = max(width for *_, width in order)
        order = [o for o in order if o[-1] == widest]
    def perturb(c, inputs, output):  # every logit moves (see _PERTURB): the loss must follow
        direction = np.random.default_rng(_PERTURB_SEED).standard_normal(tuple(output.shape))
        return output + ms.Tensor((direction * _PERTURB).astype(np.float32), output.dtype)
    tried = []
    for path, ndim, drop, width in order[:_MAX_CANDIDATES]:
        if path in tried:  # a Cell called more than once: one candidate
            continue
        tried.append(path)
        handle = _cell_at(model, path).register_forward_hook(perturb)
        try:
            moved = _scalar(call())
        finally:
            handle.remove()
        if np.isfinite(base) and np.isfinite(moved) and moved != base:
            return {"path": path, "ndim": ndim, "drop": drop, "vocab": width,
                    "class": type(_cell_at(model, path)).__name__}
    more = f", nor of the {len(tried) - 1} after it" if len(tried) > 1 else ""
    return {"why": f"the loss does not change when the output of '{tried[0]}' (the first sub-Cell "
                   f"returning vocabulary-wide values) changes{more}: no output head the loss reads"}


class _Tap(nn.Cell):
    """A leaf sub-Cell as it is, plus the shape of its output written into `seen` when that output
    is a tensor of the vocabulary's width: (ndim, d0, d1, d2), zeros when it never is. The test is
    on static shapes, so it is decided when the graph compiles."""

    def __init__(self, inner, vocab: int, index: int):
        super().__init__(auto_prefix=False)  # keep the inner Cell's parameter names
        self.inner = inner
        self.vocab = vocab
        self.seen = Parameter(ms.Tensor(np.zeros(4, np.int32)), name=f"objdebug_tap_{index}",
                              requires_grad=False)

    def __getattr__(self, name):
        # the model may read an attribute of the Cell tapped (its embedding table, a weight)
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = self.__dict__.get("_cells", {}).get("inner")
            if inner is None:
                raise
            return getattr(inner, name)

    def construct(self, *args, **kwargs):
        out = self.inner(*args, **kwargs)
        if isinstance(out, ms.Tensor):
            if out.ndim in (2, 3) and out.shape[-1] == self.vocab:
                ops.assign(self.seen, ops.tuple_to_array(((out.ndim,) + out.shape + (0,))[:4]))
        return out


@contextmanager
def _in_place(model, cells: dict):
    """Each path's Cell replaced by cells[path] through its parent's Cell table (no parameter is
    renamed), the model's own Cells again after."""
    saved = []
    try:
        for path, cell in cells.items():
            parent_path, _, attr = path.rpartition(".")
            parent = _cell_at(model, parent_path) if parent_path else model
            saved.append((parent, attr, parent._cells[attr]))  # noqa: SLF001
            parent._cells[attr] = cell  # noqa: SLF001
        yield
    finally:
        for parent, attr, cell in reversed(saved):
            parent._cells[attr] = cell  # noqa: SLF001


def find_head_graph(model, call, batch: int, length: int, vocab: int | None) -> dict[str, Any]:
    """`find_head` for a model PyNative mode cannot run (a kernel it lacks), without hooks: `call()`
    compiles a fresh graph of the model's loss and returns it. One compile with every leaf sub-Cell
    tapped (`_Tap`) finds the Cells whose output has the vocabulary's width and its shape; then
    each of them in turn, in the model's order, is wrapped by a `HeadProbe` holding the seeded
    random direction: the first whose perturbation moves the loss is the head."""
    if vocab is None:
        return {"why": "the vocabulary's width is unknown (no logits in the model's output and no "
                       "data.vocab_size), so there is no output head to look for in graph mode"}
    try:
        base = _scalar(call())
        leaves = [(name, cell) for name, cell in model.cells_and_names()
                  if name and cell is not model and not cell._cells]  # noqa: SLF001
        taps = {name: _Tap(cell, vocab, i) for i, (name, cell) in enumerate(leaves)}
        with _in_place(model, taps):
            call()
        order = []
        for name, tap in taps.items():
            ndim, *dims = (int(d) for d in tap.seen.asnumpy())
            shape = _shape_fits(tuple(dims[:ndim]), batch, length, vocab)
            if ndim and shape is not None:
                order.append((name, tuple(dims[:ndim]), *shape))
        if not order:
            return {"why": "no sub-Cell of the model returns logits of the vocabulary's width "
                           "([B, T, V] or [B*T, V]), so there is no output head to probe"}
        tried = []
        for path, shape, ndim, drop in order[:_MAX_CANDIDATES]:
            tried.append(path)
            probe = HeadProbe(_cell_at(model, path), shape)
            direction = np.random.default_rng(_PERTURB_SEED).standard_normal(shape) * _PERTURB
            probe.probe.set_data(ms.Tensor(direction.astype(np.float32)))
            with _in_place(model, {path: probe}):
                moved = _scalar(call())
            if np.isfinite(base) and np.isfinite(moved) and moved != base:
                return {"path": path, "ndim": ndim, "drop": drop, "vocab": vocab,
                        "class": type(_cell_at(model, path)).__name__}
    except Exception as exc:  # the lost checks are named by OBJ006, never skipped in silence
        from objdebug.core.crash import summary

        return {"why": f"looking for the output head in graph mode (PyNative mode cannot run the "
                       f"model here) failed: {summary(exc)}"}
    more = f", nor of the {len(tried) - 1} after it" if len(tried) > 1 else ""
    return {"why": f"the loss does not change when the output of '{tried[0]}' (the first sub-Cell "
                   f"returning vocabulary-wide values) changes{more}: no output head the loss reads"}


# --------------------------------------------------------------------------- the pairing at the head
def probe_gradient(objective, root, head: dict[str, Any], input_ids: np.ndarray,
                   labels: np.ndarray) -> np.ndarray:
    """dLoss/dlogits [B, T', V] of `objective(input_ids, labels)` at the output head `head` (a
    `find_head` record, its path under `root`), through a `HeadProbe` put in the head's place for
    this call only, in graph mode."""
    b, t = input_ids.shape
    positions = t - int(head["drop"])
    shape = (b, positions, int(head["vocab"])) if head["ndim"] == 3 else (b * positions, int(head["vocab"]))
    probe = HeadProbe(_cell_at(root, head["path"]), shape)
    args = (ms.Tensor(input_ids, ms.int32), ms.Tensor(labels, ms.int32))
    with _in_place(root, {head["path"]: probe}):
        # graph mode only: a PyNative gradient here left MindSpore's bprop state broken for the
        # process (later graph-mode gradients of GatherD raised "Bprop GatherDGradV2 ... pointer
        # [value] is null", measured in the suite), so the probe pays one small compile instead
        _, g = _ProbeGrad(objective, probe.probe)(*args)
    return g.asnumpy().reshape(b, positions, -1)


def find_head_in(cell, call, batch: int, length: int, vocab: int | None) -> dict[str, Any]:
    """`find_head` on any end-to-end Cell (a wrapper that owns a model, a loss that owns it): the
    Cell tree walked, in PyNative mode, where `call()` runs it; graph mode where PyNative cannot."""
    from objdebug.engine.pynative import pynative

    try:
        with pynative():
            return find_head(cell, call, batch, length, vocab)
    except Exception as exc:  # noqa: BLE001 - e.g. a kernel PyNative mode lacks
        from objdebug.core.crash import missing_operator, summary

        if missing_operator(str(exc)) is None:
            return {"why": f"calling the Cell to find its output head failed: {summary(exc)}"}
    return find_head_graph(cell, call, batch, length, vocab)


class _Call(nn.Cell):
    """objective(input_ids, labels) in a fresh Cell: a graph-mode call of a changed Cell tree
    compiles again (find_head_graph)."""

    def __init__(self, objective):
        super().__init__(auto_prefix=False)
        self.objective = objective

    def construct(self, input_ids, labels):
        out = self.objective(input_ids, labels)
        return out[0] if isinstance(out, tuple) else out


def _loss_cell(objective):
    """The Cell whose loss the pairing is measured on: a train-one-step Cell's `network` (a Cell
    that holds an optimizer would step it on every probe call), else the objective itself."""
    inner = getattr(objective, "network", None)
    if isinstance(inner, nn.Cell) and any(isinstance(c, nn.Optimizer)
                                          for _, c in objective.cells_and_names()):
        return inner
    return objective


def head_of_cell(target) -> tuple[Any, dict[str, Any]]:
    """(the Cell the head's path starts from, the head record) of an end-to-end target: a library
    model's from its setup probe; else found by walking the user's Cell tree (kept in the info)."""
    info = (target.info or {}).get("library_model")
    if info is not None:
        return target.objective.model, info.get("head") or {"why": "the output head was not looked for"}
    objective = _loss_cell(target.objective)
    found = target.info.get("e2e_head")
    if found is None:
        cfg = target.config
        rng = np.random.default_rng(label_pairing._SEED)
        ids = rng.integers(1, max(2, min(int(cfg.data.vocab_size or 32), 64)), label_pairing.SHAPE).astype(np.int32)

        def call():
            ms_ids = ms.Tensor(ids, ms.int32)
            if ms.get_context("mode") == ms.GRAPH_MODE:
                return _Call(objective)(ms_ids, ms_ids)
            out = objective(ms_ids, ms_ids)
            return out[0] if isinstance(out, tuple) else out
        found = find_head_in(objective, call, label_pairing.SHAPE[0], label_pairing.SHAPE[1], cfg.data.vocab_size)
        target.info["e2e_head"] = found
    return objective, found


def measure_end_to_end(target) -> label_pairing.Pairing:
    """The end-to-end objective's pairing, measured at its output head (module docstring)."""
    cfg = target.config
    root, head = head_of_cell(target)
    if "path" not in head:
        return label_pairing.declared(cfg.data.shift, f"no output head found in the end-to-end Cell: {head['why']}")
    vocab = int(head["vocab"])
    avoid = {int(cfg.data.pad_id), int(cfg.data.label_pad_id)}
    if vocab - len(avoid & set(range(vocab))) < 4:
        return label_pairing.declared(cfg.data.shift, f"a vocabulary of {vocab} classes is too small to tell")
    _, labels = label_pairing.measurement_batch(vocab, avoid)
    rng = np.random.default_rng(label_pairing._SEED + 1)
    pool = np.array([v for v in range(1, min(vocab, 64)) if v not in avoid])
    ids = rng.choice(pool, label_pairing.SHAPE).astype(np.int32)
    try:
        grad = probe_gradient(root if "library_model" not in target.info else target.objective,
                              root, head, ids, labels)
    except Exception as exc:  # noqa: BLE001 - the stages meet the same error and report it
        from objdebug.core.crash import first_line

        return label_pairing.declared(cfg.data.shift, f"the logit gradient at the head '{head['path']}' failed: "
                                        f"{type(exc).__name__}: {first_line(exc)}")
    if not np.isfinite(grad).all():
        return label_pairing.declared(cfg.data.shift, "the logit gradient at the output head is not finite")
    positions, matches = label_pairing.pairing_of_gradient(grad, labels)
    found = label_pairing.decide(positions, matches, cfg.data.shift)
    return found if not found.measured else label_pairing.Pairing(
        found.offset, True, found.positions, found.matches,
        f"at the output head '{head['path']}' ({head.get('class', 'a Cell')})")


def of_end_to_end(target) -> label_pairing.Pairing:
    """The end-to-end pairing, measured once per run (kept in the target's info, with a note)."""
    found = target.info.get(label_pairing.INFO_KEY)
    if found is None:
        found = measure_end_to_end(target)
        target.info[label_pairing.INFO_KEY] = found
        note = label_pairing.note_of(found, target.config.data.shift)
        if note:
            target.info.setdefault("notes", []).append(note)
    return found


def _scalar(value) -> float:
    return float(np.asarray(value.asnumpy(), np.float64).reshape(-1)[0])


# --------------------------------------------------------------------------- the probe in the graph
class HeadProbe(nn.Cell):
    """The head's output + `probe` on inputs of its shape, a copy into `seen` (module docstring).
    Another shape (another batch) passes through unchanged: the check is static in the graph."""

    def __init__(self, head, shape: tuple[int, ...], dtype: str | None = None):
        super().__init__(auto_prefix=False)  # keep the head's parameter names
        self.head = head
        self.shape = tuple(int(d) for d in shape)
        self.cast = dtype is not None  # the logits handed on in this dtype (low precision, OBJ509)
        self.dtype = getattr(ms, dtype) if dtype is not None else ms.float32
        self.probe = Parameter(ms.Tensor(np.zeros(self.shape, np.float32)), name=PROBE_NAME)
        self.seen = Parameter(ms.Tensor(np.zeros(self.shape, np.float32)), name=SEEN_NAME,
                              requires_grad=False)

    def construct(self, *args):
        out = self.head(*args)
        if out.shape != self.shape:
            return out
        ops.assign(self.seen, ops.stop_gradient(ops.cast(out, ms.float32)))
        if self.cast:
            return ops.cast(ops.cast(out, ms.float32) + self.probe, self.dtype)
        return out + ops.cast(self.probe, out.dtype)


class _ProbeGrad(nn.Cell):
    """(input_ids, labels) -> (outputs float32[K], d total / d probe): the library's loss, its
    gradient w.r.t. the head probe only (the model's parameters are not differentiated)."""

    def __init__(self, objective, probe: Parameter):
        super().__init__(auto_prefix=False)
        self.objective = objective
        self.weights = ms.ParameterTuple([probe])
        self.grad_fn = ms.value_and_grad(self._loss, None, self.weights, has_aux=True)

    def _loss(self, input_ids, labels):
        return as_outputs(self.objective(input_ids, labels))

    def construct(self, input_ids, labels):
        (_, outputs), grads = self.grad_fn(input_ids, labels)
        return outputs, ops.cast(grads[0], ms.float32)


def loss_labels(labels: np.ndarray, positions: int, shifts: bool, label_pad_id: int) -> np.ndarray:
    """The batch's labels [B, T] aligned with the head's positions [B, T'] (module docstring)."""
    return paired_labels(labels, 1 if shifts else 0, label_pad_id, positions)


def head_of(target) -> dict[str, Any]:
    """The setup probe's head record for an end-to-end target ({"why": ...} when there is none)."""
    info = (target.info or {}).get("library_model")
    if info is None:
        return {"why": "the end-to-end objective is a plain construct(input_ids, labels) Cell, not a "
                       "library model whose output head objdebug probes"}
    return info.get("head") or {"why": "the output head was not looked for"}


def model_shifts(target) -> bool:
    """Whether logits[t] is scored against labels[t + 1]: as the setup probe measured it, else as
    `[data] shift` declares it (false: the labels carry token t at t, the model shifts them)."""
    measured = ((target.info or {}).get("library_model") or {}).get("shifts_labels")
    return bool(measured) if measured is not None else not target.config.data.shift


def unavailable(target) -> str | None:
    """Why the logit checks cannot run on this end-to-end target (None: they can)."""
    head = head_of(target)
    return None if "path" in head else f"end-to-end form: {head['why']}"


class LibraryLogits:
    """The library loss on its own logits (plus a delta) and its logit gradient, through the engine."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.target = engine.target
        self.head = head_of(self.target)
        if "path" not in self.head:
            raise ValueError(f"For 'LibraryLogits', the target must be a library model with an output "
                             f"head, but got none: {self.head['why']}.")
        self.shifts = model_shifts(self.target)
        self.root = self.target.objective.model  # LibraryModelLoss holds the user's model
        parent_path, _, self.attr = self.head["path"].rpartition(".")
        self.parent = _cell_at(self.root, parent_path) if parent_path else self.root
        self.original = self.parent._cells[self.attr]  # noqa: SLF001
        self._probes: dict[tuple, HeadProbe] = {}

    def shape(self, batch: int, length: int) -> tuple[int, ...]:
        t = length - int(self.head["drop"])
        v = int(self.head["vocab"])
        return (batch, t, v) if self.head["ndim"] == 3 else (batch * t, v)

    @contextmanager
    def installed(self, probe: HeadProbe):
        """The probe in the head's place for the calls inside, the user's head again after."""
        cells = self.parent._cells  # noqa: SLF001 - no __setattr__: it would rename parameters
        cells[self.attr] = probe
        try:
            yield
        finally:
            cells[self.attr] = self.original

    def run(self, input_ids: np.ndarray, labels: np.ndarray, delta: np.ndarray | None = None,
            dtype: str | None = None) -> dict[str, Any]:
        """The library loss with the head's output + delta (0 by default; in `dtype` when given)
        on this batch -> {"outputs" float64[K], "grad" float32[B, T', V] (dLoss/dlogits), "sq"
        float64[B, T'], "logits" float32[B, T', V] (what the head returned, before the delta),
        "labels" int[B, T']}. A graph per batch shape and dtype (one that raised refuses later calls)."""
        b, t = input_ids.shape
        shape = self.shape(b, t)
        key = shape + ((dtype,) if dtype else ())
        probe = self._probes.get(key)
        if probe is None:
            probe = self._probes[key] = HeadProbe(self.original, shape, dtype)
        probe.probe.set_data(ms.Tensor(np.zeros(shape, np.float32) if delta is None
                                       else np.ascontiguousarray(delta, np.float32).reshape(shape)))
        graph = LOGIT_GRAD + (f".{dtype}" if dtype else "")
        name = f"{graph}[{'x'.join(map(str, shape))}]"
        cell = self.engine.cell(name, lambda: _ProbeGrad(self.target.objective, probe.probe))
        with self.installed(probe):
            outputs, g = self.engine.call(graph, cell, ms.Tensor(input_ids, ms.int32),
                                          ms.Tensor(labels, ms.int32))
        positions = t - int(self.head["drop"])
        grad = g.asnumpy().reshape(b, positions, -1)
        seen = probe.seen.asnumpy().reshape(b, positions, -1)
        g64 = grad.astype(np.float64)
        return {"outputs": outputs.asnumpy().astype(np.float64), "grad": grad,
                "sq": (g64 * g64).sum(-1), "logits": seen,
                "labels": loss_labels(labels, positions, self.shifts,
                                      self.target.config.data.label_pad_id)}
