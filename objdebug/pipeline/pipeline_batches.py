"""The pipeline's real batches (`[data] batches`) as the run uses them beyond the batches stage.

- `real_batches(ctx)`: the batches, read once per run (`batches_source.read_batches`);
- `find_padding`: where a batch pads, from its mask or its pad run (numpy, no MindSpore);
- `adopt_conventions(ctx)`: "the batches win" — where the batches contradict a declared
  convention (the label on padding vs `label_pad_id`, the pad id, the padding side), the measured
  value replaces the declared one in the run's config and the engine's `Padding` for every stage
  after the batches stage, with a target note naming both values (the batches stage's OBJ012
  judges the declared values before this runs);
- `label_offsets` / `offset_words`: the labels' layout as a measurement, the offset d with
  labels[t] == input_ids[t + d] (d in `OFFSETS`, -2..+3), numpy, said in words ("labels are the
  inputs 2 positions ahead: shifted twice"); `measured_offset(ctx)`: d over every batch read;
- `first_batch(ctx)`: the first batch read, at the shape the pipeline made it (no re-padding), as
  the engine's `Batch`: the gradient batch of grad, invariants and stress (`run_data.grad_batch`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import numpy as np

from objdebug.engine.data import Batch, Padding, Sample
from objdebug.engine.model_inputs import mark_padding, marks_padding
from objdebug.pipeline.batches_source import Batches, read_batches

# what the report says about which rows each stage reads when `[data] batches` is set
SOURCES_NOTE = ("[data] batches: grad, invariants and stress use the pipeline's first batch as it "
                "is ({shape}, from '{source}'); align, decompose, correlate, preference, the long "
                "inputs and padding invariance use rows objdebug builds from the JSONL")


def real_batches(ctx: Any) -> Batches:
    """The pipeline's batches, read once per run. The factory runs in the config file's folder:
    a relative path in `[data] batches_kwargs` is relative to the config, like every other path
    of the file (before: the working directory, where users tripped over it)."""
    return ctx.provide(real_batches, lambda: read_batches(ctx.config.data, ctx.config.base_dir,
                                                          ctx.config.base_dir))


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


OFFSETS = (0, 1, 2, -1, 3, -2)  # the offsets read, ties broken in this order (the usual first)
OFFSET_MIN_SHARE = 0.9           # adopt_conventions: the share one offset must explain


def offset_matches(ids: np.ndarray, labels: np.ndarray) -> dict[int, np.ndarray]:
    """{d: bool [B, T]: labels[t] == input_ids[t + d]} for each d in OFFSETS (False where t + d is
    outside the row)."""
    out = {}
    t = ids.shape[1]
    for d in OFFSETS:
        hit = np.zeros(ids.shape, bool)
        if d >= 0 and d < t:
            hit[:, :t - d] = labels[:, :t - d] == ids[:, d:]
        elif d < 0 and -d < t:
            hit[:, -d:] = labels[:, -d:] == ids[:, :t + d]
        out[d] = hit
    return out


def best_offset(counts: dict[int, int], n: int | dict[int, int],
                min_share: float) -> tuple[int | None, dict[int, float]]:
    """(the offset that explains at least `min_share` of `n` labelled positions, or None; the share
    of each offset) from {d: positions it explains}. `n` per offset ({d: positions}): the positions
    that offset can be checked at (a label whose input t + d is no real token is not)."""
    total = max(n.values(), default=0) if isinstance(n, dict) else n
    if total <= 0:
        return None, {}
    of = n if isinstance(n, dict) else {d: n for d in OFFSETS}
    shares = {d: counts.get(d, 0) / of[d] if of.get(d) else 0.0 for d in OFFSETS}
    top = max(OFFSETS, key=lambda d: (shares[d], -OFFSETS.index(d)))
    tied = any(d != top and shares[d] >= shares[top] for d in OFFSETS)  # repeated text: ambiguous
    return (top if shares[top] >= min_share and not tied else None), shares


def offset_words(d: int | None) -> str:
    """The layout offset d in words: 'labels are the inputs 2 positions ahead: shifted twice'."""
    if d is None:
        return "labels are the inputs at no single offset (-2..+3)"
    if d == 0:
        return "labels are the inputs at the same positions: unshifted"
    n = abs(d)
    where = f"{n} position{'s' if n > 1 else ''} {'ahead' if d > 0 else 'behind'}"
    times = {1: "once", 2: "twice", 3: "three times"}[n]
    what = (f"shifted {times} (pre-shifted)" if d == 1 else f"shifted {times}" if d > 0
            else f"shifted backwards {times}")
    return f"labels are the inputs {where}: {what}"


def past_real_inputs(padding: np.ndarray, d: int) -> np.ndarray:
    """bool [B, T]: real positions t whose input t + d (d > 0) is no real token (padding, or past
    the row's end): a label there has no input to be compared with at offset d (the pre-shifted
    layout's last label, `labels = full[1:]`, is the row's final token)."""
    real = ~padding
    out = np.zeros(real.shape, bool)
    if d <= 0:
        return out
    ahead = np.zeros(real.shape, bool)  # real[t + d], False past the end
    if d < real.shape[1]:
        ahead[:, :real.shape[1] - d] = real[:, d:]
    return real & ~ahead


def batch_offsets(b: Any, pad_id: int, eos_id: int | None) -> tuple[dict[int, int], dict[int, int]]:
    """({d: labelled real positions with labels[t] == input_ids[t + d]}, {d: labelled real
    positions offset d can be checked at}) of one batch (a label >= 0 on a real token counts)."""
    padding, _, _ = find_padding(b, pad_id, eos_id)
    counted = ~padding & (b.labels >= 0)
    at = {d: counted & ~past_real_inputs(padding, d) for d in OFFSETS}
    return ({d: int((m & at[d]).sum()) for d, m in offset_matches(b.input_ids, b.labels).items()},
            {d: int(at[d].sum()) for d in OFFSETS})


def measured_offset(ctx: Any) -> int | None:
    """The labels' offset over every batch read (None: no labels, or no offset explains
    OFFSET_MIN_SHARE of them)."""
    d = ctx.config.data
    counts, n = Counter(), Counter()
    for b in real_batches(ctx).batches:
        if b.labels is None:
            continue
        c, k = batch_offsets(b, d.pad_id, d.eos_id)
        counts.update(c)
        n.update(k)
    return best_offset(counts, dict(n), OFFSET_MIN_SHARE)[0]


def measured_conventions(ctx: Any) -> dict[str, Any]:
    """{"pad_id", "padding_side", "label_pad_id"} as the batches show them (None: not seen): the
    id and side most batches pad with, the label most padding positions hold."""
    d = ctx.config.data
    pads, sides, labels = Counter(), Counter(), Counter()
    for b in real_batches(ctx).batches:
        padding, pad, side = find_padding(b, d.pad_id, d.eos_id)
        if pad is not None:
            pads[pad] += 1
            sides[side] += 1
        if b.labels is not None:
            labels.update(b.labels[padding].tolist())
    top = lambda c: c.most_common(1)[0][0] if c else None  # noqa: E731
    return {"pad_id": top(pads), "padding_side": top(sides), "label_pad_id": top(labels)}


def adopt_conventions(ctx: Any) -> list[str]:
    """The batches win: measured conventions replace contradicted declared ones for the rest of
    the run (config, target, engine padding). Once per run; the notes it added (none without
    `[data] batches`)."""
    def build() -> list[str]:
        d = ctx.config.data
        if d.batches is None:
            return []
        seen = measured_conventions(ctx)
        changed = {k: v for k, v in seen.items() if v is not None and v != getattr(d, k)}
        offset = measured_offset(ctx)
        if offset in (0, 1) and (offset == 1) != d.shift:  # the labels' layout: the batches win too
            changed["shift"] = offset == 1
        notes = []
        if changed:
            cfg = replace(ctx.config, data=replace(d, **changed))
            ctx.config = cfg
            ctx.target.config = cfg
            ctx.engine.padding = Padding.of(cfg)
            said = "; ".join(f"data.{k} = {getattr(d, k)!r} declared, {v!r} in the batches"
                             for k, v in changed.items())
            notes.append(f"the batches win (OBJ012): {said}: every stage after the batches stage "
                         f"uses the batches' values")
        first, source = real_batches(ctx).batches[0], real_batches(ctx).source
        notes.append(SOURCES_NOTE.format(shape="x".join(map(str, first.input_ids.shape)),
                                         source=source) if first.labels is not None else
                     f"[data] batches: '{source}' has no labels column: grad, invariants and "
                     f"stress use rows objdebug builds from the JSONL, as every other stage")
        if "rejected_input_ids" in first.columns:  # preference batches: their pairs are the preference stage's
            notes[-1] = (notes[-1].replace("correlate, preference,", "correlate,")
                         + "; the preference stage scores the batches' own chosen / rejected pairs")
        ctx.target.info.setdefault("notes", []).extend(notes)
        return notes
    return ctx.provide(adopt_conventions, build)


def first_batch(ctx: Any) -> Batch | None:
    """The first batch read as the engine's `Batch` (int32, marked for the model's mask when it
    takes one), its rows as Samples named "batch 1 row r" holding the real tokens; None without
    `[data] batches` or without a labels column (the objective needs labels: objdebug's rows)."""
    if ctx.config.data.batches is None:
        return None
    adopt_conventions(ctx)
    b = real_batches(ctx).batches[0]
    if b.labels is None:
        return None
    d = ctx.config.data
    padding, _, _ = find_padding(b, d.pad_id, d.eos_id)
    ids = b.input_ids.astype(np.int32)
    if marks_padding(ctx.config):
        ids = mark_padding(ids, ~padding)
    samples = [Sample(f"batch {b.number} row {r}", [], b.input_ids[r][~padding[r]].tolist(),
                      kind="batch") for r in range(len(ids))]
    return Batch(ids, b.labels.astype(np.int32), samples, 0, list(range(len(ids))))
