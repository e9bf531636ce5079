"""What a real batch holds, read from the batch alone (numpy, no MindSpore): where its padding is,
which id pads and on which side, the labels' layout as a measurement (the offset d with
labels[t] == input_ids[t + d], d in -2..+3: 0 unshifted, the model shifts; 1 pre-shifted, the
pipeline shifted; 2 shifted twice, a handler and a packer that both shift; or none), its share per
source and per row, and which label values mask a position. Whether the objective ignores a value
is measured on the objective (`audit.py`); this module only says where each value sits.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from objdebug.pipeline.batches_source import RealBatch
from objdebug.pipeline.pipeline_batches import (OFFSETS, best_offset, find_padding, offset_matches,
                                                offset_words, past_real_inputs)

UNSHIFTED, PRE_SHIFTED, UNCLEAR = "unshifted", "pre-shifted", "unclear"
NAMES = {0: UNSHIFTED, 1: PRE_SHIFTED}  # other offsets are named by `layout_name`


def layout_name(d: int | None) -> str:
    """'unshifted' (0), 'pre-shifted' (1), 'shifted +2' ..., 'unclear' (None)."""
    return UNCLEAR if d is None else NAMES.get(d, f"shifted {d:+d}")


@dataclass
class BatchLayout:
    batch: RealBatch
    padding: np.ndarray          # bool [B, T]
    pad_id: int | None           # the id the batch pads with (None: no padding)
    side: str | None             # "right" / "left" (None: no padding)
    matches: dict[int, np.ndarray] = field(default_factory=dict)  # d -> labels[t] == input_ids[t+d]

    @property
    def same(self) -> np.ndarray | None:
        return self.matches.get(0)

    @property
    def ahead(self) -> np.ndarray | None:
        return self.matches.get(1)

    def counted(self) -> np.ndarray:
        """bool [B, T]: real tokens whose label is a token id (>= 0): what the offset is read from."""
        return ~self.padding & (self.batch.labels >= 0)


@dataclass
class Reading:
    """The labels' offset over the batches read: d (None: none explains `min_share`), the share of
    each offset, the labelled positions counted, and the rows whose own offset differs."""

    offset: int | None
    shares: dict[int, float]
    counted: int
    rows: int = 0                                      # labelled rows read
    off_rows: list[tuple[str, int | None]] = field(default_factory=list)  # (row, its own d)

    def words(self) -> str:
        return offset_words(self.offset)

    def numbers(self, top: int = 3) -> str:
        """'+2 at 100% of 605 labelled positions' (the offset read), or the largest shares when
        none is clear: '+1 40%, 0 30%, +2 5% of 605 labelled positions'."""
        sign = lambda d: f"{d:+d}" if d else "0"  # noqa: E731
        if self.offset is not None:
            return f"{sign(self.offset)} at {self.shares[self.offset]:.0%} of {self.counted} labelled positions"
        best = sorted(self.shares.items(), key=lambda kv: -kv[1])[:top]
        return ", ".join(f"{sign(d)} {s:.0%}" for d, s in best) + f" of {self.counted} labelled positions"


def layout_of(batch: RealBatch, pad_id: int, eos_id: int | None) -> BatchLayout:
    padding, held, side = find_padding(batch, pad_id, eos_id)
    matches = offset_matches(batch.input_ids, batch.labels) if batch.labels is not None else {}
    return BatchLayout(batch, padding, held, side, matches)


def read_offset(layouts: list[BatchLayout], min_share: float) -> Reading:
    """The offset over all rows (per source) and each row's own (per row)."""
    counts, checkable, n, rows = Counter(), Counter(), 0, 0
    per_row = []  # (row, {d: positions it explains}, positions)
    for lay in layouts:
        if not lay.matches:
            continue
        counted = lay.counted()
        # offset d is judged where the input t + d is a real token (the pre-shifted layout's last
        # label, the row's final token, has none: it neither confirms nor refutes d = 1)
        at = {d: counted & ~past_the_inputs(lay, d) for d in OFFSETS}
        for d in OFFSETS:
            counts[d] += int((lay.matches[d] & at[d]).sum())
            checkable[d] += int(at[d].sum())
        n += int(counted.sum())
        for r in range(len(counted)):
            k = int(counted[r].sum())
            if k:
                rows += 1
                per_row.append((f"batch {lay.batch.number} row {r}",
                                {d: int((lay.matches[d][r] & at[d][r]).sum()) for d in OFFSETS},
                                {d: int(at[d][r].sum()) for d in OFFSETS}))
    offset, shares = best_offset(counts, dict(checkable), min_share)
    # a row is at another offset when the source's offset does not explain it (a short answer of
    # repeated tokens that several offsets explain is not): named with its own reading
    off = [(name, best_offset(c, k, min_share)[0]) for name, c, k in per_row
           if offset is not None and c[offset] < min_share * k[offset]]
    return Reading(offset, shares, n, rows, off)


def label_layout(layouts: list[BatchLayout], min_share: float) -> tuple[str | None, dict[str, float], int]:
    """(layout name, {"unshifted": share, "pre-shifted": share}, positions counted): `read_offset`
    in the two usual names (None without labelled positions)."""
    r = read_offset(layouts, min_share)
    if r.counted == 0:
        return None, {}, 0
    return layout_name(r.offset), {UNSHIFTED: r.shares[0], PRE_SHIFTED: r.shares[1]}, r.counted


def follows(lay: BatchLayout, offset: int | None) -> np.ndarray:
    """bool [B, T]: the label is the input token at the measured offset (a target, not a mask);
    with no clear offset, the input at the same position or one ahead."""
    if not lay.matches:
        return np.ones(lay.padding.shape, bool)
    if offset is None:
        return lay.matches[0] | lay.matches[1]
    return consistent(lay, offset)


def consistent(lay: BatchLayout, offset: int) -> np.ndarray:
    """bool [B, T]: the label agrees with offset d: it is the input at t + d, or t + d is no real
    input to compare with (`past_the_inputs`)."""
    return lay.matches[offset] | past_the_inputs(lay, offset)


def past_the_inputs(lay: BatchLayout, offset: int) -> np.ndarray:
    """bool [B, T]: real positions t whose input t + offset is no real token (padding, or past the
    row's end): a label there has no input to follow. In the pre-shifted layout (`input_ids =
    full[:-1]`, `labels = full[1:]`) the last real position's label is the row's final token, the
    target of that position, not a masking value: it is judged as following (OBJ021 judges what
    the last real token is trained toward)."""
    return past_real_inputs(lay.padding, offset)


def masking_values(layouts: list[BatchLayout], offset: int | None) -> tuple[Counter, Counter]:
    """(label values on padding, label values on real tokens that do not follow the inputs),
    each with its count of positions."""
    on_pad, on_real = Counter(), Counter()
    for lay in layouts:
        labels = lay.batch.labels
        if labels is None:
            continue
        on_pad.update(labels[lay.padding].tolist())
        on_real.update(labels[~lay.padding & ~follows(lay, offset)].tolist())
    return on_pad, on_real
