"""The model's vocabulary, resolved in one place for every input check (rows, pairs, rollouts,
`[chat]` markers given as ids, batches), whatever the model returns.

In order: `[data] vocab_size` (declared); the logits' V the contract probe measures (a model that
returns logits); the rows of the model's input embedding (a reward model returns one reward per
row, an end-to-end Cell only a loss: no logits to measure V from); a declared tokenizer's size
(`[data] tokenizer` a tokenizer.json). Never the built-in byte tokenizer's 256: that says how text
becomes ids, not how many ids the model has, so with none of the above the vocabulary is unknown
and ids are checked only for being >= 0.

The input embedding is found the way `library_logits.find_head_in` finds the output head: one
call of the model in PyNative mode on seeded ids, a forward hook on every sub-Cell; the first
sub-Cell that receives those very ids and returns a float tensor [..., D] holds the table, a 2-D
parameter [V, D] (no number judged comes from this call). Where PyNative cannot run the model, the
first `nn.Embedding` of the Cell tree stands.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

BYTES = "bytes"  # the built-in tokenizer: no statement about the model's vocabulary
_SEED = 0


def declared(cfg: Any) -> tuple[int | None, str]:
    """(vocabulary, where it was declared) from the config alone: `[data] vocab_size`, else a
    declared tokenizer's size (not the byte tokenizer's); (None, "") when the config says none."""
    d = cfg.data
    if d.vocab_size:
        return int(d.vocab_size), "data.vocab_size"
    if d.tokenizer and d.tokenizer != BYTES:
        from objdebug.engine.data import make_tokenizer

        return int(make_tokenizer(d.tokenizer, cfg.base_dir).vocab_size), f"the tokenizer {d.tokenizer}"
    return None, ""


def _matches(value: Any, ids: np.ndarray) -> bool:
    """Whether a Cell's input is the seeded ids (as they are, or reshaped)."""
    import mindspore as ms

    if not isinstance(value, ms.Tensor) or value.dtype not in (ms.int32, ms.int64):
        return False
    if int(np.prod(value.shape)) != ids.size:
        return False
    return bool(np.array_equal(value.asnumpy().reshape(-1), ids.reshape(-1)))


def _table_rows(cell: Any, width: int) -> tuple[int, str] | None:
    """(rows, parameter name) of the cell's first 2-D parameter [V, width]."""
    for p in cell.get_parameters():
        if len(p.shape) == 2 and int(p.shape[1]) == width:
            return int(p.shape[0]), p.name
    return None


def find_embedding(root: Any, call: Callable[[Any], Any], ids: np.ndarray) -> dict[str, Any]:
    """The input embedding of the Cell tree `root` while `call(ids_tensor)` runs it once in PyNative
    mode -> {"vocab", "path", "parameter"} or {"why"}."""
    import mindspore as ms

    from objdebug.engine.pynative import pynative

    found: list[dict[str, Any]] = []
    handles = []
    for name, cell in root.cells_and_names():
        if not name or cell is root:
            continue

        def hook(c, inputs, output, name=name):
            if found or not isinstance(output, ms.Tensor) or output.ndim < 2:
                return
            if output.dtype not in (ms.float32, ms.float16, ms.bfloat16, ms.float64):
                return
            if not any(_matches(x, ids) for x in (inputs if isinstance(inputs, tuple) else (inputs,))):
                return
            table = _table_rows(c, int(output.shape[-1]))
            if table is not None:
                found.append({"vocab": table[0], "path": name, "parameter": table[1]})
        handles.append(cell.register_forward_hook(hook))
    try:
        with pynative():
            call(ms.Tensor(ids, ms.int32))
    except Exception as exc:  # noqa: BLE001 - a kernel PyNative lacks: the Cell tree read instead
        from objdebug.core.crash import summary

        static = _first_embedding(root)
        return static or {"why": f"calling the model to find its input embedding failed: {summary(exc)}"}
    finally:
        for h in handles:
            h.remove()
    if found:
        return found[0]
    return _first_embedding(root) or {"why": "no sub-Cell of the model takes the input ids into a "
                                             "2-D table [V, D]"}


def _first_embedding(root: Any) -> dict[str, Any] | None:
    from mindspore import nn

    for name, cell in root.cells_and_names():
        if isinstance(cell, nn.Embedding):
            return {"vocab": int(cell.embedding_table.shape[0]), "path": name or type(root).__name__,
                    "parameter": cell.embedding_table.name}
    return None


def probe_ids(batch: int, length: int) -> np.ndarray:
    """Seeded ids in [1, 32): inside any vocabulary, distinct enough to be recognised at the
    embedding's input (a position table receives 0..T-1, never these)."""
    return np.random.default_rng(_SEED).integers(1, 32, (batch, length)).astype(np.int32)


def embedding_of_target(target: Any, batch: int, length: int) -> dict[str, Any]:
    """`find_embedding` on the target: the model of the split form (a reward model included),
    the objective's Cell tree in the end-to-end form (called as objective(ids, ids))."""
    ids = probe_ids(batch, length)
    if target.model is not None:
        return find_embedding(target.model, lambda x: target.model(x), ids)
    from objdebug.engine.library_logits import _loss_cell

    objective = _loss_cell(target.objective)  # never a Cell that steps an optimizer when called
    if not hasattr(objective, "cells_and_names"):
        return {"why": "the end-to-end objective is not a Cell"}
    return find_embedding(objective, lambda x: objective(x, x), ids)
