"""OBJ012 / OBJ013 / OBJ019: the conventions `[data]` declares against what the batches show.

OBJ012: `label_pad_id`, `pad_id`, `padding_side`, `bos_id`, `eos_id` — a contradiction fails
naming both values. OBJ013: the labels' layout as a measurement, the offset d with
labels[t] == input_ids[t + d] (`layout.py`: 0 unshifted, 1 pre-shifted, 2 shifted twice, ...),
per source and per row, against `[data] shift`; the batches win for the run, so its advice never
makes a declaration match a bug. OBJ019: the total shift, d plus the objective's measured pairing
p (logits[t] scored against labels[t + p], `engine/label_pairing.py`, in every form), must be
exactly 1; a double or missing shift fails with both measured offsets, whichever side did it.
Where the pairing cannot be measured (an end-to-end Cell with no output head found), d alone
fails any layout no pairing of 0 or 1 makes right, and otherwise the verdict rests on the batches
and the declared `[data] shift`, said in the finding.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from objdebug.core.findings import Check, Condition, Verdict
from objdebug.engine.label_pairing import label_at
from objdebug.pipeline.pipeline_batches import offset_words
from objdebug.pipeline.run_data import pairing
from objdebug.stages.batches.audit import audit, has_labels
from objdebug.stages.batches.words import few


def _real_edges(lay) -> tuple[np.ndarray, list[np.ndarray]]:
    """Each row's first real token and its real tokens."""
    ids, pad = lay.batch.input_ids, lay.padding
    firsts, reals = [], []
    for r in range(len(ids)):
        real = ids[r][~pad[r]]
        reals.append(real)
        firsts.append(real[0] if len(real) else -1)
    return np.asarray(firsts), reals


class Conventions(Check):
    """OBJ012: declared pad / label pad / side / BOS / EOS against the batches."""

    name = "batch-conventions"
    stage = "batches"

    def measure(self, ctx: Any, th: Any) -> dict[str, Any]:
        a, d = audit(ctx, th), ctx.config.data
        found: list[dict[str, Any]] = []  # {"key", "declared", "seen", "what": what the batches do}

        def differs(key, declared, seen, what):
            if seen is not None and seen != declared:
                found.append({"key": key, "declared": declared, "seen": seen, "what": what})

        label_pad = (a.on_pad or a.on_real).most_common(1)
        if label_pad:
            seen = int(label_pad[0][0])
            differs("label_pad_id", d.label_pad_id, seen,
                    f"put {seen} on {'padding' if a.on_pad else 'prompt positions'}")
        differs("pad_id", d.pad_id, a.pad_id, f"pad input_ids with {a.pad_id}")
        differs("padding_side", d.padding_side, a.side, f"pad on the {a.side}")
        rows = 0
        firsts, holds_eos = Counter(), 0
        for lay in a.layouts:
            first, reals = _real_edges(lay)
            rows += len(reals)
            firsts.update(first.tolist())
            if d.eos_id is not None:
                holds_eos += sum(int((r == d.eos_id).any()) for r in reals)
        starts = firsts.get(d.bos_id, 0) if d.bos_id is not None else rows
        if starts < rows:
            other = next(v for v, _ in firsts.most_common() if v != d.bos_id)
            found.append({"key": "bos_id", "declared": d.bos_id, "seen": int(other),
                          "what": f"start {rows - starts} of {rows} rows with another id "
                                  f"(most often {other})"})
        if d.eos_id is not None and holds_eos == 0:
            found.append({"key": "eos_id", "declared": d.eos_id, "seen": None,
                          "what": f"hold {d.eos_id} in none of {rows} rows"})
        return {"source": a.source, "contradictions": found, "rows": rows,
                "seen": {"pad_id": a.pad_id, "padding_side": a.side,
                         "label_pad_id": int(label_pad[0][0]) if label_pad else None}}

    def conditions(self, th: Any) -> list[Condition]:
        def judge(v):
            bad = v["contradictions"]
            if bad:
                parts = [f"{c['key']} = {c['declared']!r} declared, the batches {c['what']}"
                         for c in bad]
                return Verdict.FAIL, (f"{'; '.join(parts)} (in {v['rows']} rows of "
                                      f"'{_short(v['source'], 40)}')"), float(len(bad))
            seen = ", ".join(f"{k} {val!r}" for k, val in v["seen"].items() if val is not None)
            return Verdict.PASS, (f"the declared conventions agree with {v['rows']} rows of "
                                  f"'{v['source']}' ({seen or 'no padding, no masked label'})"), 0.0

        return [Condition("OBJ012", "declared_conventions_hold", judge)]


def _reading(a) -> dict[str, Any]:
    """The measured offset as a plain value (JSON): d, its words, the shares, the rows at another
    offset (all of them: the message names the first few)."""
    r = a.reading
    return {"source": a.source, "offset": r.offset, "words": offset_words(r.offset),
            "numbers": r.numbers(), "shares": {str(d): s for d, s in r.shares.items()},
            "counted": r.counted, "rows": r.rows,
            "off_rows": [{"row": name, "offset": d} for name, d in r.off_rows]}


def _off_rows(v) -> str:
    """'; 2 of 16 rows at another offset (batch 1 row 3: +2, batch 2 row 0: none)' or ''."""
    off = v["off_rows"]
    if not off:
        return ""
    named = [f"{o['row']}: {'none' if o['offset'] is None else format(o['offset'], '+d') if o['offset'] else '0'}"
             for o in off]
    return f"; {len(off)} of {v['rows']} rows at another offset ({few(named)})"


def _declared(shift: bool) -> str:
    return (f"data.shift = {str(shift).lower()} says "
            + ("the pipeline shifted them (+1)" if shift else "the model shifts them (0)"))


class LabelLayout(Check):
    """OBJ013: the labels' measured offset (layout.py), per source and per row, against `[data] shift`."""

    name = "batch-label-layout"
    stage = "batches"

    def skip_reason(self, ctx: Any) -> str | None:
        if not has_labels(ctx):
            return "the batches have no labels column: no layout to read"
        return None

    def measure(self, ctx: Any, th: Any) -> dict[str, Any]:
        a = audit(ctx, th)
        return {**_reading(a), "layout": a.layout, "shift": ctx.config.data.shift,
                "min_share": float(th["layout_min_share"])}

    def conditions(self, th: Any) -> list[Condition]:
        def judge(v):
            if not v["counted"]:
                return Verdict.SKIP, "no labelled real token in the batches read: no layout to read", None
            d, where = v["offset"], f"{v['numbers']} of '{_short(v['source'], 40)}'"
            declared = _declared(v["shift"])
            best = max(v["shares"].values())
            if d is None:
                return Verdict.WARN, (f"{v['words']} ({where}; at least {v['min_share']:.0%} "
                                      f"expected): the labels are not the inputs shifted; "
                                      f"{declared}"), best
            if d not in (0, 1):
                return Verdict.FAIL, (f"{v['words']} ({where}): no objective's pairing of "
                                      f"labels[t] or labels[t+1] makes that one shift (OBJ019 "
                                      f"counts them){_off_rows(v)}"), float(d)
            if (d == 1) != v["shift"]:
                return Verdict.FAIL, (f"{v['words']} ({where}), but {declared}: the batches win "
                                      f"for this run; OBJ019 counts the shifts{_off_rows(v)}"), float(d)
            if v["off_rows"]:
                return Verdict.WARN, (f"{v['words']} ({where}), as {declared}, but "
                                      f"{_off_rows(v)[2:]}"), float(len(v["off_rows"]))
            return Verdict.PASS, f"{v['words']} ({where}), as {declared}", float(d)

        return [Condition("OBJ013", "label_layout_matches_shift", judge)]


def _total_words(k: int) -> str:
    if k == 0:
        return "no shift: each position trains toward its own input token (a copy task)"
    if k > 1:
        return f"{k} shifts: each position trains toward the token {k} ahead"
    return f"{k:+d} shifts: each position trains toward a token it has already read"


def _short(text: str, limit: int = 110) -> str:
    return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."


class OneShift(Check):
    """OBJ019: the labels' measured offset d plus the objective's measured pairing p is exactly 1."""

    name = "batch-one-shift"
    stage = "batches"

    def skip_reason(self, ctx: Any) -> str | None:
        if not has_labels(ctx):
            return "the batches have no labels column: no layout to read"
        return None

    def measure(self, ctx: Any, th: Any) -> dict[str, Any]:
        a, p = audit(ctx, th), pairing(ctx)
        return {**_reading(a), "pairing": p.offset, "measured": p.measured,
                "pairing_words": f"logits[t] against {label_at(p.offset)}",
                "pairing_how": p.describe(), "why": p.why, "shift": ctx.config.data.shift,
                "form": "end-to-end" if ctx.target.end_to_end else "split"}

    def conditions(self, th: Any) -> list[Condition]:
        def judge(v):
            d = v["offset"]
            if d is None:
                return Verdict.SKIP, (f"{v['words']} ({v['numbers']}; OBJ013): no shift to "
                                      f"count"), None
            layout = f"{v['words']} ({v['numbers']})"
            if v["measured"]:
                total = d + int(v["pairing"])
                objective = (f"the objective scores {v['pairing_words']} (measured, "
                             f"{v['form']} form)")
                if total == 1:
                    return Verdict.PASS, (f"one shift in all: {layout}, and {objective}: each "
                                          f"position trains toward the next token"), 1.0
                return Verdict.FAIL, f"{_total_words(total)}: {layout}, and {objective}", float(total)
            unknown = f"the objective's pairing is not measured ({_short(v['why'])})"
            if d not in (0, 1):
                return Verdict.FAIL, (f"{d} or {d + 1} shifts, never one, whichever of labels[t] "
                                      f"or labels[t+1] the objective scores: {layout}; "
                                      f"{unknown}"), float(d)
            total = d + (0 if v["shift"] else 1)
            rests = (f"{unknown}: the verdict rests on the batches and "
                     f"{_declared(v['shift'])} (so the objective pairs with {'labels[t]' if v['shift'] else 'labels[t+1]'})")
            if total == 1:
                return Verdict.PASS, f"one shift in all: {layout}; {rests}", 1.0
            return Verdict.FAIL, f"{_total_words(total)}: {layout}; {rests}", float(total)

        return [Condition("OBJ019", "one_shift_in_all", judge)]
