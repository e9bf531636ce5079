"""OBJ012 / OBJ013: the conventions `[data]` declares against what the batches show.

OBJ012: `label_pad_id`, `pad_id`, `padding_side`, `bos_id`, `eos_id` — a contradiction fails
naming both values. OBJ013: the labels' layout (the input ids at the same positions: unshifted,
the model shifts; one position ahead: the pipeline shifted) against `[data] shift`. OBJ019: that
layout against the objective's measured pairing (logits[t] scored against labels[t] or
labels[t+1], `engine/label_pairing.py`): in all, exactly one shift (pre-shifted labels and an
objective that pairs at t, or unshifted labels and one that shifts inside).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from objdebug.core.findings import Check, Condition, Verdict
from objdebug.pipeline.run_data import pairing, pairing_skip
from objdebug.stages.batches.audit import audit, has_labels
from objdebug.stages.batches.layout import PRE_SHIFTED, UNCLEAR, UNSHIFTED


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
                parts = [f"{c['key']} = {c['declared']!r} declared, but the batches {c['what']}"
                         for c in bad]
                return Verdict.FAIL, (f"{'; '.join(parts)} (in {v['rows']} rows of "
                                      f"'{v['source']}')"), float(len(bad))
            seen = ", ".join(f"{k} {val!r}" for k, val in v["seen"].items() if val is not None)
            return Verdict.PASS, (f"the declared conventions agree with {v['rows']} rows of "
                                  f"'{v['source']}' ({seen or 'no padding, no masked label'})"), 0.0

        return [Condition("OBJ012", "declared_conventions_hold", judge)]


class LabelLayout(Check):
    """OBJ013: labels unshifted or pre-shifted, as read from the batch, against `[data] shift`."""

    name = "batch-label-layout"
    stage = "batches"

    def skip_reason(self, ctx: Any) -> str | None:
        if not has_labels(ctx):
            return "the batches have no labels column: no layout to read"
        return None

    def measure(self, ctx: Any, th: Any) -> dict[str, Any]:
        a = audit(ctx, th)
        return {"source": a.source, "layout": a.layout, "shares": a.shares, "counted": a.counted,
                "shift": ctx.config.data.shift, "min_share": float(th["layout_min_share"])}

    def conditions(self, th: Any) -> list[Condition]:
        def judge(v):
            if v["layout"] is None:
                return Verdict.SKIP, "no labelled real token in the batches read: no layout to read", None
            sh, n = v["shares"], v["counted"]
            numbers = (f"same positions {sh[UNSHIFTED]:.0%}, one ahead {sh[PRE_SHIFTED]:.0%} of "
                       f"{n} labelled positions")
            expected = PRE_SHIFTED if v["shift"] else UNSHIFTED
            declared = (f"data.shift = {str(v['shift']).lower()} says "
                        + ("the pipeline shifted them (labels[t] = input_ids[t+1])" if v["shift"]
                           else "the model shifts them (labels[t] = input_ids[t])"))
            if v["layout"] == UNCLEAR:
                return Verdict.WARN, (f"the labels follow the inputs in neither layout ({numbers}; "
                                      f"at least {v['min_share']:.0%} expected); {declared}"), sh[expected]
            if v["layout"] == expected:
                return Verdict.PASS, f"labels are {v['layout']} ({numbers}), as {declared}", sh[expected]
            seen = ("equal the input ids at the same positions (unshifted: the model must shift)"
                    if v["layout"] == UNSHIFTED else
                    "are the next input ids (pre-shifted: the pipeline shifted them)")
            return Verdict.FAIL, (f"the labels {seen} ({numbers}), but {declared}: one of them is "
                                  f"wrong, and every position trains toward the wrong token"), sh[expected]

        return [Condition("OBJ013", "label_layout_matches_shift", judge)]


class OneShift(Check):
    """OBJ019: the labels' layout plus the objective's measured pairing make exactly one shift."""

    name = "batch-one-shift"
    stage = "batches"

    def skip_reason(self, ctx: Any) -> str | None:
        if not has_labels(ctx):
            return "the batches have no labels column: no layout to read"
        why = pairing_skip(ctx)
        if why is None and not pairing(ctx).measured:
            why = f"the objective's pairing was not measured ({pairing(ctx).why})"
        return why

    def measure(self, ctx: Any, th: Any) -> dict[str, Any]:
        a, p = audit(ctx, th), pairing(ctx)
        return {"source": a.source, "layout": a.layout, "shares": a.shares, "counted": a.counted,
                "offset": p.offset, "pairing": p.describe()}

    def conditions(self, th: Any) -> list[Condition]:
        def judge(v):
            if v["layout"] in (None, UNCLEAR):
                return Verdict.SKIP, ("the labels' layout is not clear (OBJ013): no shift to count"
                                      ), None
            sh = v["shares"]
            layout = (f"the labels are {v['layout']} (same positions {sh[UNSHIFTED]:.0%}, one "
                      f"ahead {sh[PRE_SHIFTED]:.0%} of {v['counted']} labelled positions of "
                      f"'{v['source']}')")
            objective = f"the objective scores {v['pairing']}"
            shifts = int(v["layout"] == PRE_SHIFTED) + int(v["offset"])
            if shifts == 1:
                return Verdict.PASS, (f"one shift in all: {layout} and {objective}: each position "
                                      f"trains toward the next token"), 1.0
            what = ("no shift: each position trains toward its own input token (the model learns "
                    "to copy)" if shifts == 0 else
                    f"{shifts} shifts: each position trains toward the token {shifts} ahead (the "
                    "model learns to skip a token)")
            return Verdict.FAIL, f"{what}: {layout}, and {objective}", float(shifts)

        return [Condition("OBJ019", "one_shift_in_all", judge)]
