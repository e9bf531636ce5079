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
from objdebug.pipeline.pipeline_batches import find_padding

UNSHIFTED, PRE_SHIFTED, UNCLEAR = "unshifted", "pre-shifted", "unclear"


@dataclass
class BatchLayout:
    batch: RealBatch
    padding: np.ndarray          # bool [B, T]
    pad_id: int | None           # the id the batch pads with (None: no padding)
    side: str | None             # "right" / "left" (None: no padding)
    same: np.ndarray | None      # bool [B, T]: labels[t] == input_ids[t]
    ahead: np.ndarray | None     # bool [B, T]: labels[t] == input_ids[t + 1]


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
