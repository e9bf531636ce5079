"""Preference batches' columns (`[data] batches` with chosen / rejected columns), as read.

Two layouts are read by column name:
- TRL-style: `chosen_input_ids`, `chosen_labels` (`chosen_attention_mask`), and the `rejected_`
  twins; the labels say what is scored (a value the objective ignores masks a position);
- MindFormers' DPO MindRecord (`toolkit/data_preprocess/dpo_preprocess.py` on its release
  branches): `chosen_input_ids`, `chosen_labels`, `chosen_attention_mask`, `chosen_loss_mask`
  and the `rejected_` four; packed adds `chosen_lens`, `chosen_position_id`,
  `chosen_index_packed` and twins. Its labels are padded with the pad id, so `loss_mask` is the
  authority: a position it masks is not scored, whatever its label.

`preference_columns` turns one such element into the batch's columns: every pair column under
its own name, and the chosen side under the names the batches stage reads (`input_ids`,
`labels`, `attention_mask`; with a loss_mask, a label it masks reads as `[data] label_pad_id`),
so the stage's single-sequence checks audit the chosen answers as they audit SFT rows. A chosen
column without its rejected twin (or the reverse): InputError, one line. Imports nothing of the
pipeline (batches_source imports it).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from objdebug.core.errors import InputError

SIDES = ("chosen", "rejected")
PAIR_FIELDS = ("input_ids", "labels", "attention_mask", "loss_mask", "lens", "position_id",
               "index_packed")
ROW_FIELDS = ("lens", "index_packed")  # any width per row (a packed row's documents)


def is_preference(element: Any) -> bool:
    """Whether a batch element holds chosen / rejected columns (and no plain input_ids)."""
    try:
        names = [str(k) for k in element]
    except TypeError:
        return False
    return "input_ids" not in names and any(n.startswith(("chosen_", "rejected_")) for n in names)


def preference_columns(element: Any, k: int, data: Any, source: str,
                       column: Callable[[Any, str, str, str], np.ndarray]) -> dict[str, np.ndarray]:
    """One element with chosen / rejected columns -> the batch's columns (InputError naming the
    source, batch and column on a missing twin or a bad column)."""
    where = f"batch {k} of '{source}'"
    names = {str(n) for n in element}
    for field in PAIR_FIELDS:
        have = [s for s in SIDES if f"{s}_{field}" in names]
        if len(have) == 1:
            other = "rejected" if have[0] == "chosen" else "chosen"
            raise InputError(f"For 'data.batches', {where} has the column '{have[0]}_{field}' but not "
                             f"its twin '{other}_{field}': a preference batch holds both answers "
                             f"(its columns are {sorted(names)}).")
    if "chosen_input_ids" not in names:
        raise InputError(f"For 'data.batches', {where} has preference columns but no "
                         f"'chosen_input_ids' / 'rejected_input_ids'; its columns are {sorted(names)}.")
    cols: dict[str, np.ndarray] = {}
    for side in SIDES:
        for field in PAIR_FIELDS:
            name = f"{side}_{field}"
            if name in names:
                ours = field if field in ("attention_mask", "loss_mask") else "input_ids"
                cols[name] = column(element[name], ours, name, where)
        rows, length = cols[f"{side}_input_ids"].shape
        for field in PAIR_FIELDS:
            name = f"{side}_{field}"
            if name in cols and field not in ROW_FIELDS and cols[name].shape != (rows, length):
                raise InputError(f"For 'data.batches', {where}, column '{name}' has shape "
                                 f"{list(cols[name].shape)}, but '{side}_input_ids' has {[rows, length]}.")
    if len(cols["chosen_input_ids"]) != len(cols["rejected_input_ids"]):
        raise InputError(f"For 'data.batches', {where} must hold as many rejected rows as chosen "
                         f"ones, but has {len(cols['chosen_input_ids'])} and "
                         f"{len(cols['rejected_input_ids'])}.")
    cols["input_ids"] = cols["chosen_input_ids"]
    if "chosen_attention_mask" in cols:
        cols["attention_mask"] = cols["chosen_attention_mask"]
    if "chosen_labels" in cols:
        labels = cols["chosen_labels"]
        if "chosen_loss_mask" in cols:  # MindFormers: the loss mask is the authority
            labels = np.where(cols["chosen_loss_mask"] != 0, labels, data.label_pad_id)
        cols["labels"] = labels
    return cols
