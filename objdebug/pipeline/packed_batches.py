"""Packed rows as the pipeline packs them (`[data] batches`): the documents of each real row found
from the batch's own boundaries, as `engine.packing.PackedRow`s the packing stage measures (OBJ901-
OBJ904) when the target has no `[packing]` section (numpy only; the measurement is the stage's).

A document starts at a row's first real token and wherever the batch says one starts:
- `position_ids` restart (a position that is not the one before it + 1: HF / varlen packing);
- an `actual_seq_len` column (cumulative document ends, MindFormers' convention);
- a block mask (an `attention_mask` of `[B, (1,) T, T]`): a position that cannot see the one
  before it;
- after an EOS (`[data] eos_id`) followed by a real token.
The union of what these say is the row's documents: a pipeline whose positions never reset still
shows its documents by EOS, and the measurement then gives the model the positions it made.

The rows keep the pipeline's own labels (a label at a document's last token pointing at the next
document's first token stays there: OBJ903 reads it) and the boundary inputs it made, passed to
the model as they are; only the documents' tokens are changed for OBJ901, each label that followed
a changed token following the new one. Right-padded (or unpadded) rows only: the documents must
start at column 0.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from objdebug.engine.packing import Document, PackedRow
from objdebug.pipeline.pipeline_batches import adopt_conventions, find_padding, real_batches

FOUND_BY = ("position resets", "actual_seq_len", "block mask", "EOS")


@dataclass
class RealPackedRow(PackedRow):
    """A packed row of the pipeline's batches: its documents and its own columns ([T] each)."""

    ids: np.ndarray = None             # int64 [T]
    labels: np.ndarray = None          # the pipeline's labels as they are
    positions: np.ndarray = None       # its position_ids (None: it has none)
    mask: np.ndarray = None            # its 2-D attention mask (None: it has none)
    seq_len: np.ndarray = None         # its actual_seq_len (None: it has none)
    block: np.ndarray = None           # its block mask, [(1,) T, T], 1 = attend (None: it has none)
    name: str = ""                     # "batch b row r"


@dataclass
class PipelinePacking:
    """What the batches show about packing, and what the model can be given."""

    source: str
    rows: list[RealPackedRow]          # the rows measured (same length, same document count)
    packed_rows: int                   # rows of more than one document in the batches read
    rows_read: int
    found_by: Counter                  # boundary source -> documents starts it found
    boundary: str                      # the boundary form the model is given: a column it takes, or "none"
    inputs: tuple[str, ...]            # construct's arguments when called on the rows
    no_boundary: str | None            # why the model cannot be given the boundaries (None: it can)
    eos_id: int | None
    resets: tuple[int, int] = (0, 0)   # (boundaries where position_ids restart, boundaries) when it has them
    skipped: list[str] = field(default_factory=list)  # rows not measured and why

    def describe(self) -> str:
        how = ", ".join(f"{k} ({n})" for k, n in self.found_by.items() if n) or "none"
        docs = len(self.rows[0].docs) if self.rows else 0
        return (f"the pipeline's batches ('{self.source}'): {self.packed_rows} of {self.rows_read} "
                f"rows packed, documents found from {how}; {len(self.rows)} row(s) of {docs} "
                f"documents measured with the pipeline's own labels")


def _starts(row: dict[str, np.ndarray | None], used: int, eos_id: int | None) -> dict[str, set[int]]:
    """Document starts (column > 0, < used) by what shows them."""
    out: dict[str, set[int]] = {k: set() for k in FOUND_BY}
    pos = row.get("position_ids")
    if pos is not None:
        out["position resets"] = {t for t in range(1, used) if pos[t] != pos[t - 1] + 1}
    ends = row.get("actual_seq_len")
    if ends is not None:
        out["actual_seq_len"] = {int(e) for e in ends if 0 < int(e) < used}
    block = row.get("block_mask")
    if block is not None:  # a position that cannot see the one before it starts a document
        sees = block.reshape(block.shape[-2:])
        out["block mask"] = {t for t in range(1, used) if not sees[t, t - 1]}
    if eos_id is not None:
        ids = row["input_ids"]
        out["EOS"] = {t + 1 for t in range(used - 1) if ids[t] == eos_id}
    return out


def _row(batch, r: int, padding: np.ndarray, eos_id: int | None, pad_label: int):
    """(RealPackedRow or None, {source: starts} or None, why not measured)."""
    real = ~padding[r]
    used = int(real.sum())
    if used == 0 or not real[:used].all():
        return None, None, "its real tokens do not start at column 0 (left padding)"
    cols = {k: (v[r] if v.ndim >= 2 and v.shape[0] > r else None) for k, v in batch.columns.items()}
    found = _starts(cols, used, eos_id)
    starts = sorted(set().union(*found.values()))
    if not starts:
        return None, found, None
    bounds = [0] + starts + [used]
    ids, labels = cols["input_ids"], cols.get("labels")
    own = np.where(labels < 0, pad_label, labels) if labels is not None else None
    docs = [Document(f"batch {batch.number} row {r} doc {k}", [int(x) for x in ids[s:e]],
                     own[s:e].astype(np.int32) if own is not None else None)
            for k, (s, e) in enumerate(zip(bounds, bounds[1:]))]
    row = RealPackedRow(docs, len(ids), ids=ids, labels=labels, positions=cols.get("position_ids"),
                        mask=cols.get("attention_mask"), seq_len=cols.get("actual_seq_len"),
                        block=cols.get("block_mask"), name=f"batch {batch.number} row {r}")
    return row, found, None


def _boundary(ctx: Any, rows: list[RealPackedRow]) -> tuple[str, tuple[str, ...], str | None]:
    """(boundary form, construct's arguments, why the boundaries cannot be given or None)."""
    from objdebug.engine.model_inputs import unwrap
    from objdebug.engine.signature import parameters

    cfg = ctx.config
    taken = tuple(cfg.model.inputs) if cfg.model is not None and cfg.model.inputs else ("input_ids",)
    has = {k for k in _ATTR if all(getattr(r, _ATTR[k]) is not None for r in rows)}
    if "actual_seq_len" in has:
        params = parameters(unwrap(ctx.target.model)) or []
        if "actual_seq_len" in params:
            return "actual_seq_len", taken + ("actual_seq_len",), None
    if "block_mask" in has and "attention_mask" in taken:
        return "attention_mask", taken, None
    if "position_ids" in has and "position_ids" in taken:
        return "position_ids", taken, None
    given = ", ".join(sorted(has)) or "no position_ids, actual_seq_len or block mask column"
    return "none", taken, (f"the model config gives no way to pass the pipeline's boundaries "
                           f"(the batches have {given}; [model] inputs = {list(taken)} and construct "
                           f"takes no actual_seq_len): whether the documents leak into each other "
                           f"depends on what training passes; declare the input in [model] inputs "
                           f"to measure it")


_ATTR = {"position_ids": "positions", "actual_seq_len": "seq_len", "block_mask": "block"}


def pipeline_packing(ctx: Any, most_rows: int) -> PipelinePacking:
    """The packed rows of the pipeline's batches (read once per run), at most `most_rows` measured."""
    def build() -> PipelinePacking:
        adopt_conventions(ctx)  # the batches win (label_pad_id, pad_id) here too, as in every stage after theirs
        d = ctx.config.data
        got = real_batches(ctx)
        found_by: Counter = Counter({k: 0 for k in FOUND_BY})
        packed, skipped, read = [], [], 0
        for b in got.batches:
            padding, _, _ = find_padding(b, d.pad_id, d.eos_id)
            for r in range(len(b.input_ids)):
                read += 1
                # [chat]: an EOS closes a turn inside one conversation, not a packed document
                eos = None if getattr(ctx.config, "chat", None) is not None else d.eos_id
                row, found, why = _row(b, r, padding, eos, d.label_pad_id)
                if why:
                    skipped.append(f"batch {b.number} row {r}: {why}")
                if row is None:
                    continue
                for k, starts in found.items():
                    found_by[k] += len(starts)
                packed.append(row)
        chosen: list[RealPackedRow] = []
        if packed:
            # one length and one document count (the measurement changes document c of every row)
            shape = Counter((r.length, len(r.docs)) for r in packed).most_common(1)[0][0]
            chosen = [r for r in packed if (r.length, len(r.docs)) == shape][:most_rows]
        boundary, inputs, why = _boundary(ctx, chosen) if chosen else ("none", ("input_ids",), None)
        resets = _resets(chosen)
        return PipelinePacking(got.source, chosen, len(packed), read, found_by, boundary, inputs,
                               why, d.eos_id, resets, skipped)
    return ctx.provide(pipeline_packing, build)


def _resets(rows: list[RealPackedRow]) -> tuple[int, int]:
    """(document boundaries whose position_ids restart, boundaries) over rows with position_ids."""
    reset = total = 0
    for row in rows:
        if row.positions is None:
            continue
        for s in row.starts[1:]:
            total += 1
            reset += int(row.positions[s] != row.positions[s - 1] + 1)
    return reset, total


def row_arrays(rows: list[RealPackedRow], pad_id: int, label_pad_id: int) -> dict[str, np.ndarray]:
    """The measurement's batch (`engine.packing.row_arrays`' keys) from the pipeline's own columns:
    its ids and labels, the documents' labels (every masking value as `label_pad_id`), segments,
    and the boundary inputs as it made them (positions run on, and ends at the documents' ends,
    where it has none)."""
    b, t = len(rows), rows[0].length
    width = max((len(r.seq_len) for r in rows if r.seq_len is not None), default=len(rows[0].docs) + 1)
    out = {"input_ids": np.full((b, t), pad_id, np.int32),
           "labels": np.full((b, t), label_pad_id, np.int32),
           "doc_labels": np.full((b, t), label_pad_id, np.int32),
           "segments": np.full((b, t), -1, np.int32),
           "position_ids": np.tile(np.arange(t, dtype=np.int32), (b, 1)),
           "actual_seq_len": np.full((b, width), t, np.int32),
           "attention_mask": np.zeros((b, t), np.int32)}
    for i, row in enumerate(rows):
        out["input_ids"][i] = row.ids
        if row.labels is not None:
            out["labels"][i] = row.labels
        for k, doc in enumerate(row.docs):
            s, e = row.span(k)
            out["segments"][i, s:e] = k
            if doc.labels is not None:
                out["doc_labels"][i, s:e] = doc.labels
            if row.seq_len is None:
                out["actual_seq_len"][i, k] = e
        if row.positions is not None:
            out["position_ids"][i] = row.positions
        if row.seq_len is not None:
            out["actual_seq_len"][i, :len(row.seq_len)] = row.seq_len
        out["attention_mask"][i] = row.mask if row.mask is not None else out["segments"][i] >= 0
    if all(r.block is not None for r in rows):  # the block mask is what the model is given
        out["attention_mask"] = np.stack([r.block for r in rows]).astype(np.int32)
    return out


def changed_document(rows: list[RealPackedRow], vocab: int, seed: int, index: int,
                     eos_id: int | None) -> list[RealPackedRow]:
    """The rows with document `index`'s tokens replaced (seeded, same length, a closing EOS kept):
    each label of the document that followed a token (the same position's, or the next one's
    inside the document) follows the new token; every other label, and every boundary input,
    stays the pipeline's."""
    rng = np.random.default_rng(seed)
    out = []
    for row in rows:
        s, e = row.span(index)
        old = row.docs[index]
        new = rng.integers(0, vocab, e - s)
        if eos_id is not None and old.ids[-1] == eos_id:
            new[-1] = eos_id
        ids = row.ids.copy()
        ids[s:e] = new
        labels = row.labels.copy() if row.labels is not None else None
        doc_labels = old.labels.copy() if old.labels is not None else None
        if labels is not None:
            for t in range(s, e):
                if row.labels[t] == row.ids[t]:
                    labels[t] = ids[t]
                elif t + 1 < e and row.labels[t] == row.ids[t + 1]:
                    labels[t] = ids[t + 1]
                if doc_labels is not None and doc_labels[t - s] == row.labels[t]:
                    doc_labels[t - s] = labels[t]
        docs = list(row.docs)
        docs[index] = Document(old.id + "~", [int(x) for x in new], doc_labels)
        out.append(RealPackedRow(docs, row.length, ids=ids, labels=labels, positions=row.positions,
                                 mask=row.mask, seq_len=row.seq_len, block=row.block, name=row.name))
    return out
