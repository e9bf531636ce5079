"""The model's inputs and output, as the user's `construct` declares them.

`[model] inputs` names construct's arguments in order (default `["input_ids"]`); objdebug builds
`attention_mask` (1 on real tokens, 0 on padding, dtype `[model] mask_dtype`) and `position_ids`
(0..n-1 over a row's real tokens, counted from its first real token; 0 on padding) from the
padding it applies itself. `[model] output` picks the logits from what construct returns: a tuple
index or a dict key / attribute name; by default the tensor itself, or a tuple's first element.

How the padding travels: every computation objdebug compiles takes one int32 `input_ids` batch
(engine, gradients, stress cases, preference Cells), so instead of threading a mask through all
of them, `pack_for` writes a padding position as `token - PAD_OFFSET` (far below any id, even the
out-of-range ids the stress stage probes, like -1). `ModelCall`, the one Cell through which the
model is called, decodes it in-graph: mask = id >= -PAD_OFFSET / 2, token = id + PAD_OFFSET on the
padding. The marks are written only when the model takes a mask or positions; otherwise the ids
are exactly what they always were. The objective never sees ids (it gets logits and labels).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.engine.data import Sample, pack

INPUTS = ("input_ids", "attention_mask", "position_ids")
MASK_DTYPES = ("int32", "int64", "bool", "float32", "float16", "bfloat16")
PADDING_SIDES = ("right", "left")
PAD_OFFSET = 1 << 30
PAD_BELOW = -(PAD_OFFSET // 2)  # a marked id is < this; any real (or probed bad) id is above


# --------------------------------------------------------------------------- config
def model_inputs(cfg) -> tuple[str, ...]:
    """construct's arguments, in order."""
    if cfg.model is None or not cfg.model.inputs:
        return ("input_ids",)
    return tuple(cfg.model.inputs)


def marks_padding(cfg) -> bool:
    """Whether packed ids carry padding marks: the model takes a mask or positions."""
    return model_inputs(cfg) != ("input_ids",)


def takes_mask(cfg) -> bool:
    return "attention_mask" in model_inputs(cfg)


def configured(cfg) -> bool:
    """Whether the model is called through ModelCall from the start (a key is set)."""
    return cfg.model is not None and (marks_padding(cfg) or cfg.model.output is not None)


# --------------------------------------------------------------------------- host side
def mark_padding(ids: np.ndarray, real: np.ndarray) -> np.ndarray:
    """ids int32[B, T] with the positions where `real` is False written as padding marks."""
    return np.where(real, ids, ids.astype(np.int64) - PAD_OFFSET).astype(np.int32)


def is_padding(ids: np.ndarray) -> np.ndarray:
    return np.asarray(ids) < PAD_BELOW


def fill_padding(ids: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Marked padding positions re-marked to carry `tokens` (same shape) instead of pad_id: what
    a model that honours its mask must not notice."""
    return np.where(is_padding(ids), np.asarray(tokens, np.int64) - PAD_OFFSET, ids).astype(np.int32)


def pack_for(cfg, samples: list[Sample], length: int, side: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`data.pack` on `[data] padding_side` (or `side`), with padding marks when the model takes a
    mask or positions. Left padding keeps each label on its token; the padding is label_pad_id."""
    d = cfg.data
    side = side or getattr(d, "padding_side", "right")
    ids, labels = pack(samples, length, d.pad_id, d.label_pad_id, d.shift)
    n = np.array([s.length for s in samples], np.int64)
    real = np.arange(length)[None, :] < n[:, None]
    if side == "left":  # move each row's tokens (and labels) to the end
        for i, k in enumerate(n):
            ids[i] = np.roll(ids[i], length - k)
            labels[i] = np.roll(labels[i], length - k)
            real[i] = np.roll(real[i], length - k)
    if marks_padding(cfg):
        ids = mark_padding(ids, real)
    return ids, labels


def padding_batch(cfg, shape: tuple[int, int]) -> np.ndarray:
    """A batch of padding only (pad_id, marked when the model takes a mask: mask all 0)."""
    ids = np.full(shape, cfg.data.pad_id, np.int32)
    return mark_padding(ids, np.zeros(shape, bool)) if marks_padding(cfg) else ids


def reference_inputs(ids: np.ndarray) -> dict[str, np.ndarray]:
    """numpy reference of what ModelCall builds from (marked) ids: tokens, mask, positions."""
    pad = is_padding(ids)
    tokens = np.where(pad, ids.astype(np.int64) + PAD_OFFSET, ids).astype(np.int32)
    real = ~pad
    positions = np.where(real, np.cumsum(real, axis=1) - 1, 0).astype(np.int32)
    return {"input_ids": tokens, "attention_mask": real.astype(np.int32), "position_ids": positions}


# --------------------------------------------------------------------------- calling the model
# (the Cell itself is cells.ModelCall: a graph-mode construct needs MindSpore at import)
FIRST = "<first>"  # default output: the tensor itself, or a tuple's first element
RAW = "<raw>"    # the model's own result (what the contract probe inspects)


def wrap(model, cfg, output: Any = None):
    """The user's model behind ModelCall when a key asks for it (or `output` is given), else
    the model itself: the default path compiles exactly the graphs it always did."""
    if model is None or is_wrapped(model) or (output is None and not configured(cfg)):
        return model
    from objdebug.engine.cells import ModelCall
    from objdebug.engine.signature import check_names

    spec = cfg.model
    check_names(model, model_inputs(cfg), "model.inputs")  # bound by name: each must be construct's
    chosen = output if output is not None else (spec.output if spec.output is not None else FIRST)
    return ModelCall(model, model_inputs(cfg), spec.mask_dtype, chosen)


def wrap_like(target, model):
    """`model` (a fresh copy from the factory) called the way the target's model is."""
    from objdebug.engine.cells import ModelCall

    current = target.model
    if not is_wrapped(current):
        return model
    return ModelCall(model, current.inputs, target.config.model.mask_dtype, current.output)


def is_wrapped(model) -> bool:
    return type(model).__name__ == "ModelCall" and type(model).__module__ == "objdebug.engine.cells"


def unwrap(model):
    """The user's own model Cell (for its name and attributes such as max_position_embeddings)."""
    return model.model if is_wrapped(model) else model
