"""A library's model as the end-to-end target: MindFormers' and HF-style `LlamaForCausalLM`.

Such a model computes its own loss from `labels`, but not in the form objdebug's end-to-end call
`objective(input_ids, labels) -> loss` assumes:

- the labels are a keyword (HF-style ports take `attention_mask` second; passed by position the
  labels would land there);
- the loss comes as `out["loss"]` (HF's ModelOutput read as a mapping), `out.loss`, element 0 of a
  tuple `(loss, logits, ...)`, or the model's output itself (a scalar tensor);
- MindFormers computes it only in training mode (in eval mode it returns `(logits, tokens,
  input_mask)`): objdebug then holds the model in training mode with every dropout Cell off, so
  results stay deterministic (OBJ510 measures it);
- the model shifts the labels itself (logits[t] against labels[t+1]), so `[data] shift` must be
  false; with the logits in its output this is measured, and a wrong `shift` is an InputError.

`inspect_library_model` calls the model once or twice in PyNative mode on a [2, 12] batch (no
compile; a setup probe, not a verdict: every number objdebug judges comes from graph mode) to
find where the loss is, whether training mode is needed, whether it shifts, and its output head
(`engine/library_logits.py`: the logit checks run on the library's own loss through it).
Where PyNative mode lacks a kernel the model needs (a missing-kernel error, `core/crash.py`;
mindone's loss on MindSpore 2.10's CPU: ConstantPadND, LogSoftmaxExt) the same probe runs in graph
mode, where the device has it: small compiles of `_GraphLossLogits` read the loss at each place in
turn (the first that compiles and is a scalar), the logits next to it for the shift, and
`library_logits.find_head_graph` finds the head without hooks.
`LibraryModelLoss` is the Cell every objdebug graph then calls: `(input_ids, labels) -> loss`.
It applies to an end-to-end objective whose construct takes `labels` among more than two parameters
(a plain `construct(input_ids, labels)` Cell is called as it always was).
"""

from __future__ import annotations

import math
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn

from objdebug.engine import library_logits
from objdebug.engine.pynative import pynative
from objdebug.engine.signature import parameters
from objdebug.core.errors import InputError

PROBE_SHAPE = (2, 12)
_REL_TOL = 1e-4  # the model's float32 loss vs the float64 reference of the same pairs


def applies(cell) -> bool:
    names = parameters(cell)
    return names is not None and "labels" in names and len(names) > 2


def _dropouts(cell) -> list:
    return [c for _, c in cell.cells_and_names() if "dropout" in type(c).__name__.lower()]


def hold_mode(model, train: bool) -> int:
    """The model in `train` mode with every dropout Cell in eval mode; the number of dropouts."""
    model.set_train(train)
    drops = _dropouts(model) if train else []
    for d in drops:
        d.set_train(False)
    return len(drops)


class LibraryModelLoss(nn.Cell):
    """(input_ids [B, T], labels [B, T]) -> the library model's own loss (see the module docstring)."""

    def __init__(self, model, pick: tuple[str, Any], train: bool):
        super().__init__(auto_prefix=False)  # keep the model's parameter names
        self.model = model
        self.kind, self.key = pick
        self.held_train = train
        hold_mode(model, train)

    def set_train(self, mode=True):
        # the mode the library needs for its loss is held, whatever a caller asks
        super().set_train(self.held_train)
        hold_mode(self.model, self.held_train)
        return self

    def construct(self, input_ids, labels):
        out = self.model(input_ids, labels=labels)
        if self.kind == "key":
            return out[self.key]
        if self.kind == "index":
            return out[self.key]
        if self.kind == "attr":
            return getattr(out, self.key)
        return out


# --------------------------------------------------------------------------- the setup probe
def _is_tensor(x) -> bool:
    return isinstance(x, ms.Tensor)


def _find(out) -> tuple[tuple[str, Any] | None, np.ndarray | None, str]:
    """(where the loss is, the logits as float64 or None, a description of the output)."""
    loss, logits = None, None
    if _is_tensor(out):
        return (("tensor", None) if out.size == 1 else None), None, f"a tensor of shape {tuple(out.shape)}"
    if isinstance(out, dict):
        if "loss" in out and _is_tensor(out["loss"]) and out["loss"].size == 1:
            loss = ("key", "loss")
        if "logits" in out and _is_tensor(out["logits"]) and out["logits"].ndim == 3:
            logits = out["logits"].asnumpy().astype(np.float64)
        return loss, logits, f"a mapping with keys {sorted(out)}"
    if isinstance(out, (tuple, list)):
        parts = [tuple(x.shape) if _is_tensor(x) else type(x).__name__ for x in out]
        if out and _is_tensor(out[0]) and out[0].size == 1:
            loss = ("index", 0)
        big = [x for x in out if _is_tensor(x) and x.ndim == 3]
        if big:
            logits = big[0].asnumpy().astype(np.float64)
        return loss, logits, f"a tuple of {len(out)}: {parts}"
    value = getattr(out, "loss", None)
    if _is_tensor(value) and value.size == 1:
        loss = ("attr", "loss")
    value = getattr(out, "logits", None)
    if _is_tensor(value) and value.ndim == 3:
        logits = value.asnumpy().astype(np.float64)
    return loss, logits, f"a {type(out).__name__}"


def _mean_ce(logits: np.ndarray, targets: np.ndarray) -> float:
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(-np.take_along_axis(logp, targets[..., None], -1).mean())


def _close(a: float, b: float) -> bool:
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= _REL_TOL * max(abs(b), 1e-6)


class _PyNativeGap(Exception):
    """The model needs an operator PyNative mode lacks on this device (the graph has it)."""

    def __init__(self, op: str, exc: BaseException):
        super().__init__(op)
        self.op, self.exc = op, exc


def _call(model, ids, labels):
    try:
        return model(ms.Tensor(ids), labels=ms.Tensor(labels))
    except Exception as exc:
        from objdebug.core.crash import first_line, missing_operator

        missing = missing_operator(str(exc))
        if missing is not None:  # e.g. mindone's loss on CPU: no PyNative kernel, a graph one
            raise _PyNativeGap(missing[0], exc) from None
        raise InputError(f"For 'objective.factory', the model fails when called as "
                         f"construct(input_ids, labels=labels) on a {list(ids.shape)} batch: "
                         f"{type(exc).__name__}: {first_line(exc)}") from None


def _probe_pynative(model, ids, cfg) -> dict[str, Any]:
    """Where the loss is, its mode, the logits and the head, from PyNative calls (module docstring)."""
    hold_mode(model, False)
    pick, logits, seen = _find(_call(model, ids, ids))
    train, drops = False, 0
    if pick is None:  # MindFormers: the loss exists in training mode only
        drops = hold_mode(model, True)
        pick, train_logits, seen_train = _find(_call(model, ids, ids))
        train = True
        if pick is None:
            raise InputError(f"For 'objective.factory', the model takes 'labels' but returns no "
                             f"loss for them: in eval mode {seen}, in training mode "
                             f"{seen_train}; objdebug reads out['loss'], out.loss, element 0 "
                             f"or a scalar tensor")
        logits = logits if logits is not None else train_logits
        seen = f"{seen_train} in training mode (in eval mode {seen})"
    loss = float(np.asarray(_loss_of(model, ids, pick)))
    width = int(logits.shape[-1]) if logits is not None else cfg.data.vocab_size
    try:
        head = library_logits.find_head(model, lambda: ms.Tensor(_loss_of(model, ids, pick)),
                                        PROBE_SHAPE[0], PROBE_SHAPE[1], width)
    except Exception as exc:
        from objdebug.core.crash import missing_operator

        missing = missing_operator(str(exc))
        if missing is None:
            raise
        raise _PyNativeGap(missing[0], exc) from None
    return {"pick": pick, "train": train, "dropouts_off": drops, "loss": loss, "output": seen,
            "logits": logits, "head": head}


# where a graph-mode call reads the loss and the logits: (loss, logits or None), tried in order
_GRAPH_PICKS = ((("key", "loss"), ("key", "logits")), (("attr", "loss"), ("attr", "logits")),
                (("index", 0), ("index", 1)), (("index", 0), None), (("tensor", None), None))
_GRAPH_SEEN = {"key": "a mapping with 'loss' and 'logits'", "attr": "an object with .loss and .logits",
               "index": "a tuple (loss, logits, ...)", "tensor": "a tensor"}


def _read(out, pick):
    kind, key = pick
    if kind == "tensor":
        return out
    if kind == "attr":
        return getattr(out, key)
    return out[key]


class _GraphLossLogits(nn.Cell):
    """(input_ids, labels) -> (the loss, the logits) read from the model's output at fixed places:
    the setup probe's graph-mode call, where PyNative lacks a kernel the model needs."""

    def __init__(self, model, pick, logits_pick):
        super().__init__(auto_prefix=False)  # keep the model's parameter names
        self.model = model
        self.pick, self.logits_pick = pick, logits_pick

    def construct(self, input_ids, labels):
        out = self.model(input_ids, labels=labels)
        loss = _read(out, self.pick)
        if self.logits_pick is None:
            return loss, loss
        return loss, _read(out, self.logits_pick)


def _graph_call(model, ids, pick, logits_pick):
    """One graph compile and call (a fresh Cell: a compiled graph is never reused for a changed
    model) -> (loss float64 or None when not a scalar, logits float64 [B, T, V] or None)."""
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        loss, logits = _GraphLossLogits(model, pick, logits_pick)(ms.Tensor(ids), ms.Tensor(ids))
    finally:
        ms.set_context(mode=mode)
    value = loss.asnumpy().astype(np.float64) if loss.size == 1 else None
    if logits_pick is None or logits.ndim != 3:
        return value, None
    return value, logits.asnumpy().astype(np.float64)


def _probe_graph(model, ids, cfg, gap: _PyNativeGap) -> dict[str, Any]:
    """The setup probe in graph mode (module docstring): where the loss is and its mode by a few
    small compiles, and the head by `library_logits.find_head_graph`."""
    from objdebug.core.crash import summary

    errors = []
    for train in (False, True):
        drops = hold_mode(model, train)
        for pick, logits_pick in _GRAPH_PICKS:
            try:
                loss, logits = _graph_call(model, ids, pick, logits_pick)
            except Exception as exc:  # this place is not in the output: the next one
                errors.append(summary(exc))
                continue
            if loss is None:
                continue
            seen = (f"{_GRAPH_SEEN[pick[0]]}, read in graph mode (PyNative mode has no "
                    f"{gap.op} kernel here)")
            if train:
                seen += " in training mode"
            width = int(logits.shape[-1]) if logits is not None else cfg.data.vocab_size

            def call(pick=pick):
                return ms.Tensor(_graph_call(model, ids, pick, None)[0])
            head = library_logits.find_head_graph(model, call, PROBE_SHAPE[0], PROBE_SHAPE[1], width)
            hold_mode(model, False)
            return {"pick": pick, "train": train, "dropouts_off": drops if train else 0,
                    "loss": float(loss), "output": seen, "logits": logits, "head": head}
    hold_mode(model, False)
    raise InputError(f"For 'objective.factory', the model fails in PyNative mode "
                     f"({summary(gap.exc)}) and returns no loss in graph mode either: "
                     f"{errors[-1] if errors else 'no scalar loss in its output'}")


def inspect_library_model(model, cfg) -> dict[str, Any]:
    """Where the loss is, the mode it needs, whether the model shifts the labels (module docstring)."""
    vocab = int(cfg.data.vocab_size or 32)
    rng = np.random.default_rng(0)
    # real-looking ids away from 0 (a pad id in many libraries) and within any vocabulary
    ids = rng.integers(1, max(2, min(vocab, 64)), PROBE_SHAPE).astype(np.int32)
    try:
        with pynative():
            found = _probe_pynative(model, ids, cfg)
    except _PyNativeGap as gap:
        found = _probe_graph(model, ids, cfg, gap)
    finally:
        hold_mode(model, False)
    logits, loss = found.pop("logits"), found["loss"]
    info: dict[str, Any] = {**found, "shifts_labels": None}
    if logits is not None and logits.shape[:2] == ids.shape:
        same = _mean_ce(logits, ids)                    # logits[t] against labels[t]
        nxt = _mean_ce(logits[:, :-1], ids[:, 1:])       # logits[t] against labels[t+1]
        info.update(ce_same=same, ce_next=nxt)
        if _close(loss, nxt) and not _close(loss, same):
            info["shifts_labels"] = True
        elif _close(loss, same) and not _close(loss, nxt):
            info["shifts_labels"] = False
    return info


def _loss_of(model, ids, pick):
    out = model(ms.Tensor(ids), labels=ms.Tensor(ids))
    return _read(out, pick).asnumpy().astype(np.float64).reshape(())


def check_shift(info: dict[str, Any], shift: bool) -> None:
    """A `[data] shift` that contradicts what the model does is an InputError (exit 2)."""
    s = info.get("shifts_labels")
    if s is None or s != shift:
        return
    want = "false" if s else "true"
    how = ("shifts the labels itself: its loss" if s else "does not shift the labels: its loss")
    raise InputError(f"For 'data.shift', the model {how} {info['loss']:.6g} equals the cross-entropy of "
                     f"logits[t] against labels[{'t+1' if s else 't'}] ({info['ce_next' if s else 'ce_same']:.6g}; "
                     f"against labels[{'t' if s else 't+1'}]: {info['ce_same' if s else 'ce_next']:.6g}), "
                     f"so the value must be {want}, but got {str(shift).lower()}.")


def wrap(objective, cfg, info_out: dict[str, Any]):
    """The end-to-end objective behind LibraryModelLoss when it is a library model (`applies`)."""
    if not applies(objective):
        return objective
    info = inspect_library_model(objective, cfg)
    check_shift(info, cfg.data.shift)
    kind, key = info["pick"]
    where = {"key": f"out[{key!r}]", "index": f"element {key}", "attr": f"out.{key}",
             "tensor": "the model's output itself"}[kind]
    # "the loss is out['loss'] of a mapping ...", "the loss is the model's output itself, a tensor ..."
    of = ", " if kind == "tensor" else " of "
    note = (f"the model is the end-to-end target: construct(input_ids, labels=labels), the loss is "
            f"{where}{of}{info['output']}")
    if info["train"]:
        note += (f"; its loss exists in training mode only: held in training mode with "
                 f"{info['dropouts_off']} dropout Cell(s) off")
    if "path" in info["head"]:
        note += f"; its logits are the output of '{info['head']['path']}', probed for the logit checks"
    note += {True: "; it shifts the labels itself (checked: data.shift = false)",
             False: "; it does not shift the labels (checked: data.shift = true)",
             None: "; whether it shifts the labels is not measured (no logits in its output)"}[info["shifts_labels"]]
    info_out.setdefault("notes", []).append(note)
    info_out["library_model"] = {k: v for k, v in info.items() if k != "pick"} | {"loss_from": where}
    return LibraryModelLoss(objective, info["pick"], info["train"])
