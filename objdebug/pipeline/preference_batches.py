"""Preference pairs as the pipeline made them (`[data] batches` with chosen / rejected columns,
read by `preference_columns.py`): `pair_facts` reads each pair (numpy): each side's real length,
its scored tokens (the loss mask when there is one, else a label the objective does not ignore),
where the two sides part, the first scored token; a packed row (`*_lens` with several entries)
holds one pair per entry, found by its segment columns (MindFormers' slots) or cut by the lens. `real_pairs` gives the preference stage the pipeline's own pairs (the
prompt and both answers as the batches cut them) instead of pairs it builds from
`[data] preference`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from objdebug.pipeline.preference_columns import SIDES


def is_pair_batch(batch: Any) -> bool:
    return "rejected_input_ids" in batch.columns


@dataclass
class Side:
    ids: np.ndarray        # the real tokens
    scored: np.ndarray     # bool [len(ids)]: the token is a scored target
    scored_pad: int        # scored label positions on padding
    lens: np.ndarray | None  # the row's lens column, positive entries (on a packed row's last pair), or None
    row_length: int = 0      # the row's real tokens (what the lens must sum to)
    lens_entry: int | None = None  # a packed row cut by its own segment columns: this pair's lens entry


@dataclass
class PairFacts:
    batch: int
    row: int
    chosen: Side
    rejected: Side
    common: int            # tokens both sides share from the start (where they part)
    part: int | None = None  # a packed row's pair (0-based), None: the row is one pair

    @property
    def where(self) -> str:
        pair = f" pair {self.part + 1}" if self.part is not None else ""
        return f"batch {self.batch} row {self.row}{pair}"

    def start(self, side: str) -> int | None:
        s = getattr(self, side).scored
        hit = np.nonzero(s)[0]
        return int(hit[0]) if len(hit) else None

    @property
    def response_start(self) -> int | None:
        """The first response token: where the sides part, or earlier where both mask says so."""
        starts = [self.start(s) for s in SIDES]
        if any(s is None for s in starts):
            return None
        return min([self.common] + starts)


def _scored_positions(batch: Any, side: str, r: int, ignored: set[int]) -> np.ndarray:
    """bool [T]: label position scored (loss_mask, else a label the objective does not ignore)."""
    mask = batch.columns.get(f"{side}_loss_mask")
    if mask is not None:
        return mask[r] != 0
    labels = batch.columns.get(f"{side}_labels")
    if labels is None:
        return np.zeros(batch.columns[f"{side}_input_ids"].shape[1], bool)
    return ~np.isin(labels[r], list(ignored))


def pair_layout(batches: list[Any], ignored: set[int]) -> str:
    """"pre-shifted" (labels[t] = ids[t+1]) or "unshifted" (labels[t] = ids[t]) over every scored
    label of both sides: which token a scored label predicts."""
    same = ahead = 0
    for b in batches:
        for side in SIDES:
            ids, labels = b.columns[f"{side}_input_ids"], b.columns.get(f"{side}_labels")
            if labels is None:
                continue
            for r in range(len(ids)):
                s = _scored_positions(b, side, r, ignored)
                same += int((s & (labels[r] == ids[r])).sum())
                s2 = s[:-1]
                ahead += int((s2 & (labels[r][:-1] == ids[r][1:])).sum())
    return "pre-shifted" if ahead > same else "unshifted"


def _real_length(batch: Any, side: str, r: int, pad_id: int) -> int:
    mask = batch.columns.get(f"{side}_attention_mask")
    ids = batch.columns[f"{side}_input_ids"][r]
    if mask is not None:
        return int((mask[r] != 0).sum())
    n = len(ids)
    while n and ids[n - 1] == pad_id:
        n -= 1
    return n


def _segments(batch: Any, side: str, r: int, real: np.ndarray, count: int) -> list[np.ndarray] | None:
    """The positions of each pair of a packed row, from the row's own segment columns, or None
    (no such column, or it does not hold `count` pairs: the lens cut the row).

    MindFormers' packing (dpo_preprocess.py `_process_data_group`, r1.5.0) pads each pair to a
    fixed slot and writes the slot into the attention mask (slot + 1 on real tokens) and into
    `index_packed` (0-based, the row's tail padding the last slot); a packer without slots numbers
    the pairs in `index_packed` (1-based) and joins them. Either way a pair is the real tokens of
    one segment value, in the row's order, so the lens are checked against them (OBJ035) and never
    used to cut them."""
    mask = batch.columns.get(f"{side}_attention_mask")
    packed = batch.columns.get(f"{side}_index_packed")
    for seg in ((mask[r] if mask is not None and int(mask[r].max(initial=0)) > 1 else None),
                (packed[r] if packed is not None and packed[r].shape == real.shape else None)):
        if seg is None:
            continue
        values = list(dict.fromkeys(seg[real].tolist()))  # in the row's order
        if len(values) == count:
            return [np.nonzero(real & (seg == v))[0] for v in values]
    return None


def pair_facts(batches: list[Any], ignored: set[int], pad_id: int) -> list[PairFacts]:
    """Every pair read, each side's real tokens and scored tokens (numpy only). A packed row
    (`*_lens` with several entries on both sides) holds one pair per entry, found by the row's
    segment columns (`_segments`), else cut by the lens."""
    layout = pair_layout(batches, ignored)
    out = []
    for b in batches:
        if not is_pair_batch(b):
            continue
        for r in range(len(b.columns["chosen_input_ids"])):
            sides = []
            for side in SIDES:
                ids = b.columns[f"{side}_input_ids"][r]
                n = _real_length(b, side, r, pad_id)
                mask = b.columns.get(f"{side}_attention_mask")
                real = mask[r] != 0 if mask is not None else np.arange(len(ids)) < n
                pos = _scored_positions(b, side, r, ignored)
                tok = np.zeros(len(ids), bool)
                if layout == "pre-shifted":
                    tok[1:] = pos[:-1]
                else:
                    tok[1:] = pos[1:]  # nothing predicts the first token
                lens = b.columns.get(f"{side}_lens")
                lens = lens[r][lens[r] > 0] if lens is not None else None
                sides.append((ids, real, n, tok, lens))
            cuts = [None]
            if sides[0][4] is not None and sides[1][4] is not None and len(sides[0][4]) == len(sides[1][4]) > 1:
                cuts = list(range(len(sides[0][4])))
            segs = [_segments(b, side, r, real, len(cuts)) if cuts != [None] else None
                    for side, (_, real, _, _, _) in zip(SIDES, sides)]
            for j in cuts:
                made = []
                for (ids, real, n, tok, lens), seg in zip(sides, segs):
                    if j is None:
                        made.append(Side(ids[:n], tok[:n], int(tok[n:].sum()), lens, n))
                        continue
                    last = j == len(lens) - 1
                    if seg is not None:  # the row's own segments: each pair's real tokens
                        at = seg[j]
                        made.append(Side(ids[at], tok[at], int(tok[~real].sum()) if last else 0,
                                         None, len(at), int(lens[j])))
                        continue
                    a = int(np.sum(lens[:j]))
                    e = min(a + int(lens[j]), n)
                    made.append(Side(ids[a:e], tok[a:e], int(tok[n:].sum()) if last else 0,
                                     lens if last else None, n))
                c, k = made[0].ids, made[1].ids
                m = min(len(c), len(k))
                differ = np.nonzero(c[:m] != k[:m])[0]
                facts = PairFacts(b.number, r, made[0], made[1], int(differ[0]) if len(differ) else m)
                facts.part = j
                out.append(facts)
    return out


def real_pairs(ctx: Any) -> list[dict[str, Any]] | None:
    """The pipeline's own pairs as the preference stage's rows ({id, line, prompt, chosen,
    rejected, strength}: the shared prompt and each answer's real tokens as the batches cut them),
    or None when `[data] batches` holds no preference columns."""
    def build() -> list[dict[str, Any]] | None:
        from objdebug.pipeline.pipeline_batches import real_batches

        d = ctx.config.data
        if d.batches is None:
            return None
        got = real_batches(ctx).batches
        if not any(is_pair_batch(b) for b in got):
            return None
        rows = []
        for f in pair_facts(got, {d.label_pad_id, -100}, d.pad_id):
            start = f.response_start if f.response_start is not None else f.common
            rows.append({"id": f.where, "line": 0, "prompt": f.chosen.ids[:start].tolist(),
                         "chosen": f.chosen.ids[start:].tolist(),
                         "rejected": f.rejected.ids[start:].tolist(), "strength": None})
        return rows
    return ctx.provide(real_pairs, build)
