"""What a real batch holds, read from the batch alone (numpy, no MindSpore): where its padding is,
which id pads and on which side, whether its labels are the inputs at the same positions
(unshifted: the model shifts) or one position ahead (pre-shifted: the pipeline shifted), and
which label values mask a position. Whether the objective ignores a value is measured on the
objective (`audit.py`); this module only says where each value sits.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from objdebug.pipeline.batches_source import RealBatch

UNSHIFTED, PRE_SHIFTED, UNCLEAR = "unshifted", "pre-shifted", "unclear"


@dataclass
class BatchLayout:
    batch: RealBatch
    padding: np.ndarray          # bool [B, T]
    pad_id: int | None           # the id the batch pads with (None: no padding)
    side: str | None             # "right" / "left" (None: no padding)
    same: np.ndarray | None      # bool [B, T]: labels[t] == input_ids[t]
    ahead: np.ndarray | None     # bool [B, T]: labels[t] == input_ids[t + 1]


def edge_runs(ids: np.ndarray, value: int, side: str) -> np.ndarray:
    """Length of each row's run of `value` at its right (trailing) or left (leading) edge."""
    hit = ids == value
    if side == "right":
        hit = hit[:, ::-1]
    # the leading run of True: the index of the first False (argmin), or the whole row
    return np.where(hit.all(axis=1), ids.shape[1], np.argmin(hit, axis=1))


def run_mask(shape: tuple[int, int], runs: np.ndarray, side: str) -> np.ndarray:
    cols = np.arange(shape[1])[None, :]
    return cols >= shape[1] - runs[:, None] if side == "right" else cols < runs[:, None]


def find_padding(batch: RealBatch, pad_id: int, eos_id: int | None) -> tuple[np.ndarray, int | None, str | None]:
    """(padding bool [B, T], the pad id, the side) of one batch.

    From the attention mask when there is one (its zeros; the id most of them hold); else from
    the run of one id at the rows' edges: the declared pad id, or an id whose run covers two or
    more positions of some row and that occurs nowhere else in the rows ("!!" ending a sentence
    is not padding), whichever side and id cover the most. When the pad id is also
    the EOS id, the first of a trailing run is the row's real EOS."""
    ids, mask = batch.input_ids, batch.attention_mask
    if mask is not None:
        padding = mask == 0
        if not padding.any():
            return padding, None, None
        held = Counter(ids[padding].tolist()).most_common(1)[0][0]
        rows = padding.any(axis=1)
        side = "left" if (padding[rows, 0]).sum() > (padding[rows, -1]).sum() else "right"
        return padding, int(held), side
    best = (0, None, None, None)
    candidates = {pad_id} | set(ids[:, 0].tolist()) | set(ids[:, -1].tolist())
    for value in candidates:
        for side in ("right", "left"):
            runs = edge_runs(ids, value, side)
            if side == "right" and eos_id is not None and value == eos_id:
                runs = np.maximum(runs - 1, 0)  # pad == eos: the last EOS of a row is real
            if value != pad_id and (runs.max(initial=0) < 2
                                    or (ids == value)[~run_mask(ids.shape, runs, side)].any()):
                continue  # an undeclared id pads only as a run of 2+ and nowhere else in the rows
            if runs.sum() > best[0]:
                best = (int(runs.sum()), int(value), side, runs)
    if best[1] is None:
        return np.zeros(ids.shape, bool), None, None
    _, value, side, runs = best
    return run_mask(ids.shape, runs, side), value, side


def layout_of(batch: RealBatch, pad_id: int, eos_id: int | None) -> BatchLayout:
    padding, held, side = find_padding(batch, pad_id, eos_id)
    same = ahead = None
    if batch.labels is not None:
        ids, labels = batch.input_ids, batch.labels
        same = labels == ids
        ahead = np.zeros_like(same)
        ahead[:, :-1] = labels[:, :-1] == ids[:, 1:]
    return BatchLayout(batch, padding, held, side, same, ahead)


def label_layout(layouts: list[BatchLayout], min_share: float) -> tuple[str | None, dict[str, float], int]:
    """(layout, {"unshifted": share, "pre-shifted": share}, positions counted) over the
    real-token positions whose label is a token id (>= 0): which way the labels follow the inputs."""
    same = ahead = n = 0
    for lay in layouts:
        if lay.same is None:
            continue
        counted = ~lay.padding & (lay.batch.labels >= 0)
        n += int(counted.sum())
        same += int((lay.same & counted).sum())
        ahead += int((lay.ahead & counted).sum())
    if n == 0:
        return None, {}, 0
    shares = {UNSHIFTED: same / n, PRE_SHIFTED: ahead / n}
    top = max(shares, key=shares.get)
    return (top if shares[top] >= min_share else UNCLEAR), shares, n


def follows(lay: BatchLayout, layout: str | None) -> np.ndarray:
    """bool [B, T]: the label is the input token the layout pairs it with (a target, not a mask)."""
    if lay.same is None:
        return np.ones(lay.padding.shape, bool)
    if layout == UNSHIFTED:
        return lay.same
    if layout == PRE_SHIFTED:
        return lay.ahead
    return lay.same | lay.ahead


def masking_values(layouts: list[BatchLayout], layout: str | None) -> tuple[Counter, Counter]:
    """(label values on padding, label values on real tokens that do not follow the inputs),
    each with its count of positions."""
    on_pad, on_real = Counter(), Counter()
    for lay in layouts:
        labels = lay.batch.labels
        if labels is None:
            continue
        on_pad.update(labels[lay.padding].tolist())
        on_real.update(labels[~lay.padding & ~follows(lay, layout)].tolist())
    return on_pad, on_real
