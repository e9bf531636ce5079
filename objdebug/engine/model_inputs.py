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

import numpy as np


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


def reference_inputs(ids: np.ndarray) -> dict[str, np.ndarray]:
    """numpy reference of what ModelCall builds from (marked) ids: tokens, mask, positions."""
    pad = is_padding(ids)
    tokens = np.where(pad, ids.astype(np.int64) + PAD_OFFSET, ids).astype(np.int32)
    real = ~pad
    positions = np.where(real, np.cumsum(real, axis=1) - 1, 0).astype(np.int32)
    return {"input_ids": tokens, "attention_mask": real.astype(np.int32), "position_ids": positions}


# --------------------------------------------------------------------------- calling the model
# (the Cell itself is cells.ModelCall, built by cells.wrap: a graph-mode construct needs
# MindSpore at import)
FIRST = "<first>"  # default output: the tensor itself, or a tuple's first element
RAW = "<raw>"    # the model's own result (what the contract probe inspects)


def is_wrapped(model) -> bool:
    return type(model).__name__ == "ModelCall" and type(model).__module__ == "objdebug.engine.cells"


def unwrap(model):
    """The user's own model Cell (for its name and attributes such as max_position_embeddings)."""
    return model.model if is_wrapped(model) else model
