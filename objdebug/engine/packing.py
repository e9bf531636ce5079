"""Packed sequences, host side: `[packing]` validated, documents packed into rows the way the
user's pipeline describes, and the boundary inputs the model takes (no MindSpore here: the config
validates these keys before MindSpore starts; the Cell that calls the model is
`objdebug.engine.packed_call.PackedModelCall`).

A packed row holds `documents` documents back to back, then padding to the row length. What the
model is given about their boundaries (`[packing] boundary`):

- `position_ids`: positions reset to 0 at each document's first token (HF style: only an attention
  that reads the resets, such as flash-attention's varlen path, keeps documents apart);
- `attention_mask`: a block-diagonal causal mask (a position sees the earlier positions of its own
  document only), `[B, T, T]` or `[B, 1, T, T]` (`mask_shape`), 1 meaning attend or masked
  (`mask_ones`), in `[model] mask_dtype`;
- `actual_seq_len`: int32 `[B, D + 1]`, each document's end offset in its row (cumulative
  lengths, MindFormers' convention), then T: the padding after the last document is a segment of
  its own;
- `none`: the model takes no boundary at all (the stage measures how much packing leaks); position
  ids, if the model takes them, run on over the row.

Position ids, when the model takes them, are reset per document in the other forms; padding gets
position 0 (as `model_inputs` gives it) and its own segment.

Labels: each document is labelled on its own (`data.build_labels`: prompt masked, the last
position predicts nothing), so nothing is trained across a boundary (`labels = "document"`), or
as a pipeline that shifts the whole packed row (`labels = "row"`): the position before a boundary
is then trained on the next document's first token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from objdebug.engine.data import Sample, build_labels

from objdebug.core.config import separator_id  # [packing]'s vocabulary lives with the config that validates it


# --------------------------------------------------------------------------- documents and rows
@dataclass
class Document:
    """One document as packed: its ids (separator included) and its own labels."""

    id: str
    ids: list[int]
    labels: np.ndarray  # int32[n]: what the document alone is trained on

    @property
    def length(self) -> int:
        return len(self.ids)


def document(sample: Sample, cfg) -> Document:
    """A data row as one packed document: prompt + response (+ the separator), labelled alone.

    With a separator, the position before it predicts it (the document's end) and the separator
    itself predicts nothing. Without label shift (the objective shifts), a document's first label
    is masked (`build_labels`): it would be scored on the previous document's last logits."""
    d = cfg.data
    prompt, response = list(sample.prompt), list(sample.response)
    sep = separator_id(cfg)
    if sep is not None and (prompt + response)[-1:] != [sep]:
        response = response + [sep]
    labels = build_labels(prompt, response, d.label_pad_id, d.shift).astype(np.int32)
    return Document(sample.id, prompt + response, labels)


@dataclass
class PackedRow:
    """Documents back to back in one row of `length` tokens (then padding)."""

    docs: list[Document]
    length: int
    starts: list[int] = field(default_factory=list)

    def __post_init__(self):
        self.starts = list(np.cumsum([0] + [d.length for d in self.docs[:-1]]))

    @property
    def used(self) -> int:
        return sum(d.length for d in self.docs)

    def span(self, k: int) -> tuple[int, int]:
        return self.starts[k], self.starts[k] + self.docs[k].length


def pack_rows(docs: list[Document], per_row: int, length: int | None = None) -> list[PackedRow]:
    """`per_row` documents per row, in order; the rows share one length (the longest, unless given)."""
    groups = [docs[k:k + per_row] for k in range(0, len(docs) - per_row + 1, per_row)]
    longest = max(sum(d.length for d in g) for g in groups)
    return [PackedRow(g, length or longest) for g in groups]


def row_arrays(rows: list[PackedRow], cfg) -> dict[str, np.ndarray]:
    """The packed batch: input_ids, labels (as `[packing] labels` builds them), the documents'
    own labels (`doc_labels`), segments (document index, -1 on padding) and every boundary input."""
    d, p = cfg.data, cfg.packing
    b, t = len(rows), rows[0].length
    ids = np.full((b, t), d.pad_id, np.int32)
    own = np.full((b, t), d.label_pad_id, np.int32)
    seg = np.full((b, t), -1, np.int32)
    pos = np.zeros((b, t), np.int32)
    ends = np.full((b, len(rows[0].docs) + 1), t, np.int32)
    for i, row in enumerate(rows):
        for k, doc in enumerate(row.docs):
            s, e = row.span(k)
            ids[i, s:e] = doc.ids
            own[i, s:e] = doc.labels
            seg[i, s:e] = k
            # reset per document; with no boundary at all they run on over the row, as a
            # pipeline that tells the model nothing gives them
            pos[i, s:e] = np.arange(e - s) if p.boundary != "none" else np.arange(s, e)
            ends[i, k] = e
    labels = own.copy()
    if p.labels == "row":  # a pipeline that shifts the packed row: the boundary is trained
        for i, row in enumerate(rows):
            for k in range(1, len(row.docs)):
                s = row.span(k)[0]
                if d.shift:
                    labels[i, s - 1] = ids[i, s]
                else:
                    labels[i, s] = ids[i, s]
    # the block mask is the boundary only in that form; else a model that takes a mask gets the
    # padding mask it gets unpacked (1 on every document token)
    mask = block_mask(seg, p.mask_shape, p.mask_ones) if p.boundary == "attention_mask" \
        else (seg >= 0).astype(np.int32)
    return {"input_ids": ids, "labels": labels, "doc_labels": own, "segments": seg,
            "position_ids": pos, "actual_seq_len": ends, "attention_mask": mask}


def block_mask(segments: np.ndarray, shape: str, ones: str) -> np.ndarray:
    """int32 block-diagonal causal mask from segment ids ([B, T, T] or [B, 1, T, T]): query t sees
    key s <= t of its own document; padding (segment -1) sees only itself."""
    t = segments.shape[1]
    same = segments[:, :, None] == segments[:, None, :]
    pad = segments < 0
    same &= ~(pad[:, :, None] | pad[:, None, :]) | np.eye(t, dtype=bool)[None]
    allowed = same & np.tril(np.ones((t, t), bool))[None]
    mask = allowed if ones == "attend" else ~allowed
    mask = mask.astype(np.int32)
    return mask[:, None] if shape == "B1TT" else mask


def changed_first(rows: list[PackedRow], cfg, vocab: int, seed: int) -> list[PackedRow]:
    """The rows with the first document's tokens replaced (seeded, same length, the separator
    kept): what must not reach any later document of the row."""
    return changed_document(rows, cfg, vocab, seed, 0)


def changed_document(rows: list[PackedRow], cfg, vocab: int, seed: int, index: int) -> list[PackedRow]:
    """The rows with document `index`'s tokens replaced (seeded, same length, the separator kept,
    the same positions scored): what must not reach any other document of the row."""
    rng = np.random.default_rng(seed)
    sep = separator_id(cfg)
    out = []
    for row in rows:
        old = row.docs[index]
        ids = [int(x) for x in rng.integers(0, vocab, old.length)]
        if sep is not None and old.ids[-1:] == [sep]:
            ids[-1] = sep
        labels = old.labels.copy()
        scored = old.labels != cfg.data.label_pad_id
        if cfg.data.shift:  # same positions scored, on the new next tokens
            nxt = np.array(ids[1:] + [cfg.data.label_pad_id], np.int32)
            labels = np.where(scored, nxt, labels).astype(np.int32)
        else:
            labels = np.where(scored, np.array(ids, np.int32), labels).astype(np.int32)
        docs = list(row.docs)
        docs[index] = Document(old.id + "~", ids, labels)
        out.append(PackedRow(docs, row.length))
    return out
