"""The packing stage's one measurement, shared by its four checks (built once per run).

Real rows (`datasets.text_samples`: align good answers, scored responses, the corpus) become
documents (`engine.packing.document`), `documents` of them per packed row, `rows` rows measured;
the forward batch is the engine's batch size (short batches filled with copies, as everywhere).
Every number comes from MindSpore graphs:

- `packing.model` (the user's model through `PackedModelCall`) on the packed rows, and again with
  each row's first document's tokens replaced;
- `model.forward` (the unpacked path every other stage uses) on each document alone;
- `objective.forward` (the engine's per-row objective graph) for per-token losses: the
  user's objective on rows where exactly one position is labelled, so each value is what the
  objective itself charges for that token (its own masking and reduction; no loss re-implemented,
  no `reduction='none'` needed);
- `objective.logit_grad` (the grad stage's objective gradient w.r.t. the logits) for the logit
  gradients of a whole packed batch and the batch losses the normalisation check compares.

Position by position (what a diagnosis reads before it names a cause, issue 35): the model's
next-token log-probabilities (its logits, normalised on the host in float64) at every document
position, scored or not, with each document but the last of each row changed in turn
(`moved`: which positions of which other documents the change reaches), with every document's
first token changed (`own_moved`: which positions of its own document see its first position)
and packed vs alone (`alone_moved`). A leak into a position the objective does not score is invisible in the losses
and still tells where the model puts the boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from objdebug.core.config import packed_inputs, separator_id
from objdebug.core.errors import InputError
from objdebug.core.findings import Check
from objdebug.engine import position_limit
from objdebug.engine.data import Sample
from objdebug.engine.packing import PackedRow, changed_document, document, pack_rows, row_arrays


@dataclass
class PackedMeasurement:
    boundary: str
    inputs: tuple[str, ...]
    rows: list[PackedRow]              # the measured rows (data rows, no filler)
    length: int
    arrays: dict                       # row_arrays of the whole forward batch (filler included)
    changed_arrays: dict
    loss: np.ndarray                   # float64[R, T] per-token loss packed (NaN: not scored)
    loss_changed: np.ndarray           # float64[R, T] with each first document changed
    loss_alone: list[np.ndarray]       # per document of each row: float64[n] alone, unpacked
    grad: np.ndarray                   # float32[R, T, V] logit gradient of the packed batch
    grad_changed: np.ndarray
    grad_sq: np.ndarray                # float64[R, T] its squared norm per position
    packed_total: float                # the objective on packed rows of the documents' own logits
    unpacked_total: float              # ... and on the same documents one per row
    references: dict = field(default_factory=dict)
    # moved[c]: float64[R, T], max |change| of the next-token log-probabilities at each position
    # when document c of each row is changed (c = 0 .. documents - 2); alone_moved: float64[R, T],
    # max |packed - alone| of them at each document position (NaN on padding)
    moved: list = field(default_factory=list)
    alone_moved: np.ndarray | None = None
    own_moved: np.ndarray | None = None  # float64[R, T] with every document's first token changed
    labels: str = "document"           # how the rows are labelled: [packing] labels, or "the pipeline's"
    separator: int | None = None       # the id closing each document (None: none)
    origin: str = ""                   # where the rows come from, when not objdebug's own packing
    resets: tuple[int, int] | None = None  # the pipeline's rows: (boundaries whose position_ids restart, boundaries)


def log_probs(logits: np.ndarray) -> np.ndarray:
    """float64 log-softmax over the last axis (the model's next-token log-probabilities)."""
    x = logits.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _moved(a: np.ndarray, b: np.ndarray, chunk: int = 256) -> np.ndarray:
    """float64[R, T]: max over the vocabulary of |log p(a) - log p(b)|, `chunk` positions at a
    time (float64 copies of a large vocabulary stay small)."""
    out = np.zeros(a.shape[:2])
    for i in range(a.shape[0]):
        for t in range(0, a.shape[1], chunk):
            x, y = a[i, t:t + chunk], b[i, t:t + chunk]
            out[i, t:t + chunk] = np.abs(log_probs(x) - log_probs(y)).max(-1)
    return out


def _filled(rows: list[PackedRow], size: int) -> list[PackedRow]:
    return list(rows) + [rows[i % len(rows)] for i in range(size - len(rows))]


def per_token(engine, logits: np.ndarray, labels: np.ndarray, label_pad_id: int) -> np.ndarray:
    """float64[N, T]: the objective on (logits[i], labels with only position t scored) at every
    scored (i, t), NaN elsewhere; through the engine's per-sample graph, batch_size rows a call."""
    import mindspore as ms

    out = np.full(labels.shape, np.nan)
    where = np.argwhere(labels != label_pad_id)
    size = engine.batch_size
    for k in range(0, len(where), size):
        chunk = where[k:k + size]  # rows of any count: the per-row objective graph is dynamic
        x = logits[chunk[:, 0]]
        single = np.full((len(chunk), labels.shape[1]), label_pad_id, np.int32)
        single[np.arange(len(chunk)), chunk[:, 1]] = labels[chunk[:, 0], chunk[:, 1]]
        vals = engine.per_sample_of(ms.Tensor(x, ms.float32), ms.Tensor(single, ms.int32)).asnumpy()
        out[chunk[:, 0], chunk[:, 1]] = vals[:len(chunk), 0]
    return out


def measurement(ctx, th) -> PackedMeasurement:
    return ctx.provide(measurement, lambda: _measure(ctx, th))


def documents(ctx) -> list:
    """The documents the stage packs: the data's rows with at least one scored token."""
    def build():
        from objdebug.pipeline.datasets import text_samples

        pad = ctx.config.data.label_pad_id
        docs = [document(s, ctx.config) for s in text_samples(ctx)]
        return [d for d in docs if (d.labels != pad).any()]
    return ctx.provide(documents, build)


def preflight(ctx) -> None:
    """`[packing]` values that only the model's vocabulary and the data can judge, checked once
    the contract probe knows the vocabulary and before the stage's work (from `PackingCheck.prepare`,
    which the runner calls before any stage, and again from the measurement): an InputError (exit 2)
    naming the key, where the checks would otherwise crash one by one (4 ERRORs from Gather)."""
    cfg = ctx.config
    if cfg.packing is None:  # the pipeline's own packed rows: nothing declared to check
        return
    sep = separator_id(cfg)
    if sep is not None:
        vocab = ctx.engine.vocab_size()
        if sep >= vocab:
            how = f"[data] eos_id {sep}" if cfg.packing.separator == "eos" else str(sep)
            raise InputError(f"For 'packing.separator', the value must be a token id below the "
                             f"model's vocabulary of {vocab}, but got {how}.", source=cfg.source)
    per_row, found = cfg.packing.documents, len(documents(ctx))
    if found < per_row:
        raise InputError(f"For 'packing.documents', the value must be at most the {found} data rows "
                         f"with a scored token (one document each), but got {per_row}.",
                         source=cfg.source)
    # the packed rows within the model's positions (issue 46): exit 2 here, before any stage,
    # not four ERRORs after the work
    top = position_limit.limit(ctx)
    if top:
        rows = int(ctx.profile.section("packing")["rows"])
        packed = pack_rows(documents(ctx)[:rows * per_row], per_row)
        longest = max(r.used for r in packed)
        if longest > top:
            raise InputError(f"For 'packing.documents' = {per_row} and the model's positions = "
                             f"{top} ({position_limit.source(ctx)}), {per_row} documents per row "
                             f"make rows of up to {longest} tokens, more than the model takes; lower "
                             f"[packing] documents or use shorter rows.", source=cfg.source)


class PackingCheck(Check):
    """A packing check: its `prepare` runs the stage's `preflight` before any stage starts.
    Without `[packing]` (the stage runs for `[data] batches`) it measures the pipeline's own
    packed rows, and skips, saying why, where the batches hold none."""

    # a check that reads what the model makes of the boundaries (OBJ901, OBJ902): it skips where
    # the model cannot be given the pipeline's boundaries
    needs_boundary = False

    def prepare(self, ctx, th) -> None:
        if ctx.config.packing is not None:
            preflight(ctx)

    def skip_reason(self, ctx) -> str | None:
        if ctx.config.packing is not None:
            return None
        from objdebug.pipeline import packed_batches as pb

        if ctx.config.end_to_end:
            return ("the end-to-end form has no logits: the packing checks need the model's logits "
                    "on the pipeline's packed rows")
        found = pb.pipeline_packing(ctx, int(ctx.profile.section("packing")["rows"]))
        if not found.rows:
            eos = ctx.config.data.eos_id
            return (f"the pipeline's batches ('{found.source}') hold no packed rows: no row of the "
                    f"{found.rows_read} read has a position_ids restart, an actual_seq_len end, a "
                    f"block-mask boundary or "
                    + (f"an EOS ({eos}) before its last real token" if eos is not None else
                       "an EOS inside it (data.eos_id is not set)"))
        if any(r.labels is None for r in found.rows):
            return (f"the pipeline's batches ('{found.source}') have no labels column: nothing "
                    f"trained to measure on its packed rows")
        if self.needs_boundary and found.no_boundary:
            return found.no_boundary
        return None


def _measure(ctx, th) -> PackedMeasurement:
    """Rows objdebug packs as `[packing]` declares, else the pipeline's own packed rows."""
    if ctx.config.packing is None:
        return _measure_pipeline(ctx, th)
    cfg, engine = ctx.config, ctx.engine
    per_row = cfg.packing.documents
    preflight(ctx)  # a run without prepare (a check called alone) meets the same input errors
    docs = documents(ctx)[:int(th["rows"]) * per_row]
    rows = pack_rows(docs, per_row)
    longest = max(r.used for r in rows)
    if engine.max_length and longest > engine.max_length:
        raise ValueError(f"For '[packing] documents', {per_row} documents per row make rows of up to "
                         f"{longest} tokens, more than the model's {engine.max_length} positions; "
                         f"lower [packing] documents or use shorter rows.")
    length = engine.bucket(longest)
    rows = [PackedRow(r.docs, length) for r in rows]
    batch = _filled(rows, engine.batch_size)
    vocab, seed = engine.vocab_size(), int(th["seed"])
    return _measure_rows(ctx, rows, batch, row_arrays(batch, cfg), packed_inputs(cfg),
                         cfg.packing.boundary,
                         lambda c: row_arrays(changed_document(batch, cfg, vocab, seed + c, c), cfg))


def _measure_pipeline(ctx, th) -> PackedMeasurement:
    """The pipeline's own packed rows (`[data] batches`, `pipeline.packed_batches`): its ids,
    labels and boundary inputs as it made them, at its own length."""
    from objdebug.pipeline import packed_batches as pb

    cfg, engine = ctx.config, ctx.engine
    found = pb.pipeline_packing(ctx, int(th["rows"]))
    batch = _filled(found.rows, engine.batch_size)
    d = cfg.data
    vocab, seed = engine.vocab_size(), int(th["seed"])
    m = _measure_rows(ctx, found.rows, batch, pb.row_arrays(batch, d.pad_id, d.label_pad_id),
                      found.inputs, found.boundary,
                      lambda c: pb.row_arrays(pb.changed_document(batch, vocab, seed + c, c, d.eos_id),
                                              d.pad_id, d.label_pad_id))
    m.labels = "the pipeline's"
    m.separator = d.eos_id if all(r.docs[0].ids[-1] == d.eos_id for r in found.rows) else None
    m.origin = found.describe()
    m.resets = found.resets if found.boundary == "position_ids" else None
    return m


def _measure_rows(ctx, rows, batch, arrays, inputs, boundary, changed_of) -> PackedMeasurement:
    """The measurement on packed `rows` (`batch`: them filled to the engine's batch size, as
    `arrays`); `changed_of(c)`: the batch's arrays with document c of every row changed."""
    from objdebug.engine.gradients import GradientProbe
    from objdebug.engine.packed_call import packed_logits

    engine = ctx.engine
    pad = ctx.config.data.label_pad_id
    per_row = len(rows[0].docs)
    length = rows[0].length
    vocab = engine.vocab_size()
    changed = changed_of(0)
    logits = packed_logits(engine, inputs, arrays)
    logits_changed = packed_logits(engine, inputs, changed)
    n = len(rows)
    # each document but the last changed in turn (the first is OBJ901's change): which positions
    # of which other documents each change reaches
    moved = [_moved(logits[:n], logits_changed[:n])]
    for c in range(1, per_row - 1):
        moved.append(_moved(logits[:n], packed_logits(engine, inputs, changed_of(c))[:n]))
    # every document's first token changed (nothing else): which positions of a document see its
    # first position, the side of a boundary a leak into the other documents does not show
    firsts = dict(arrays, input_ids=arrays["input_ids"].copy())
    for i, row in enumerate(batch):
        for s in row.starts:
            firsts["input_ids"][i, s] = (firsts["input_ids"][i, s] + vocab // 2) % vocab
    own_moved = _moved(logits[:n], packed_logits(engine, inputs, firsts)[:n])

    # each document alone, through the unpacked path every other stage uses
    flat = [d for r in batch for d in r.docs]
    alone = np.zeros((len(flat), length, logits.shape[-1]), np.float32)
    alone_labels = np.full((len(flat), length), pad, np.int32)
    size = engine.batch_size
    for k in range(0, len(flat), size):
        part = flat[k:k + size]
        samples = [Sample(d.id, [], d.ids) for d in part]
        # right-padded whatever [data] padding_side says: position t of the document is column t
        ids, _ = engine.padding.pack(samples + samples[:1] * (size - len(part)), length, side="right")
        alone[k:k + len(part)] = engine.logits(ids)[:len(part)]
    for i, d in enumerate(flat):
        alone_labels[i, :d.length] = d.labels
    real = sum(len(r.docs) for r in rows)
    alone_moved = np.full((n, length), np.nan)
    for i, r in enumerate(rows):
        for k, d in enumerate(r.docs):
            s, e = r.span(k)
            own = alone[_index(batch, i, k)][None, :d.length]
            alone_moved[i, s:e] = _moved(logits[i:i + 1, s:e], own)[0]
    loss_alone_rows = per_token(engine, alone[:real], alone_labels[:real], pad)
    loss_alone, i = [], 0
    for r in rows:
        loss_alone.append([loss_alone_rows[i + k, :d.length] for k, d in enumerate(r.docs)])
        i += len(r.docs)

    loss = per_token(engine, logits[:n], arrays["doc_labels"][:n], pad)
    loss_changed = per_token(engine, logits_changed[:n], changed["doc_labels"][:n], pad)
    probe = GradientProbe(engine)
    _, sq, grad = probe.logits(logits, arrays["labels"])
    _, _, grad_changed = probe.logits(logits_changed, changed["labels"])

    # normalisation: the same documents' own logits, packed into rows vs one per row, the same
    # tokens scored: any difference is the objective's weighting, not the model's
    packed_from_alone = np.zeros_like(logits)
    for i, row in enumerate(batch):
        for k, d in enumerate(row.docs):
            s, e = row.span(k)
            packed_from_alone[i, s:e] = alone[_index(batch, i, k), :d.length]
    packed_out, _, _ = probe.logits(packed_from_alone, arrays["doc_labels"])
    unpacked = alone.copy()  # zero logits on the padding here too: only the packing differs
    for i, d in enumerate(flat):
        unpacked[i, d.length:] = 0.0
    unpacked_out, _, _ = probe.logits(unpacked, alone_labels)
    # filler row i is a copy of data row i % n: its documents' losses are those rows'
    starts = np.cumsum([0] + [len(r.docs) for r in rows])
    tok = [loss_alone_rows[starts[i % n] + k] for i, r in enumerate(batch) for k in range(len(r.docs))]
    refs = _references(tok, batch)
    cfg = ctx.config
    return PackedMeasurement(boundary, tuple(inputs), rows, length, arrays, changed, loss,
                             loss_changed, loss_alone, grad[:n], grad_changed[:n], sq[:n],
                             float(packed_out[0]), float(unpacked_out[0]), refs, moved, alone_moved,
                             own_moved, labels=cfg.packing.labels if cfg.packing else "",
                             separator=separator_id(cfg) if cfg.packing else None)


def _index(batch: list[PackedRow], i: int, k: int) -> int:
    return sum(len(r.docs) for r in batch[:i]) + k


def _references(tok: list[np.ndarray], batch: list[PackedRow]) -> dict:
    """What each weighting gives on the documents' own per-token losses (float64, on the host;
    a cross-check of which reduction the objective's batch value matches, reported as such)."""
    doc_means, row_means, all_tok = [], [], []
    i = 0
    for row in batch:
        vals = []
        for _ in row.docs:
            v = tok[i][np.isfinite(tok[i])]
            doc_means.append(float(v.mean()) if len(v) else 0.0)
            vals.append(v)
            i += 1
        joined = np.concatenate(vals)
        row_means.append(float(joined.mean()) if len(joined) else 0.0)
        all_tok.append(joined)
    everything = np.concatenate(all_tok)
    return {"token_mean": float(everything.mean()), "token_sum": float(everything.sum()),
            "document_mean": float(np.mean(doc_means)), "row_mean": float(np.mean(row_means))}
