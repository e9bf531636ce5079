"""OBJ902 same as unpacked: each document's per-token losses in a packed row equal its losses alone.

Alone means the path every other stage uses (`model.forward`, the document right-padded in its
own row, positions from 0). Packed, the same document sits at an offset after other documents:
with isolated attention and positions reset the two agree to rounding. A model that isolates
documents but does not reset positions (it ignores `position_ids`, or is not given them) fails
here and not in OBJ901: its loss depends on where a document lands. (With rotary embeddings alone
an offset cancels in q·k up to rounding of the larger angles; learned absolute positions do not.)

The message says what was measured before a cause: which documents differ, at which of their
positions (the model's next-token log-probabilities packed vs alone, scored positions or not),
and where the other documents reach them (`_reach`, OBJ901's change position by position). A
cause is named only where that supports it: no reach at any position and a row's first
documents as alone = positions not reset; a reach into the first position(s) after each boundary
only = a boundary read late; a reach through the next document = attention crossing it.

Graphs: `packing.model`, `model.forward`, `objective.forward`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.core.findings import Condition, Verdict, listing
from objdebug.core.settings import Settings
from objdebug.stages.packing._common import PackingCheck, measurement
from objdebug.stages.packing._reach import (cut, cut_cause, cut_text, late_cause, measured, pattern,
                                            positions_text, reaches)


class PackingUnpacked(PackingCheck):
    name = "packing-unpacked"
    stage = "packing"
    needs_boundary = True

    def measure(self, ctx, th: Settings) -> dict[str, Any]:
        m = measurement(ctx, th)
        docs = []
        for i, row in enumerate(m.rows):
            for k, doc in enumerate(row.docs):
                s, e = row.span(k)
                diff = np.abs(m.loss[i, s:e] - m.loss_alone[i][k])
                where = np.flatnonzero(m.alone_moved[i, s:e] > float(th["unpacked_tolerance"]))
                docs.append({"row": i, "document": doc.id, "offset": int(s), "length": doc.length,
                             "positions": [int(p) for p in where],
                             "diff": float(np.nanmax(diff)) if np.isfinite(diff).any() else 0.0,
                             "packed_mean": float(np.nanmean(m.loss[i, s:e])),
                             "alone_mean": float(np.nanmean(m.loss_alone[i][k]))})
        # where the other documents' changes reach (OBJ901's measurement, position by position):
        # tells apart a leak, a boundary read late and positions that are not reset
        found = reaches(m, float(th["isolation_tolerance"]))
        first = [d for d in docs if d["offset"] == 0]
        later = [d["diff"] for d in docs if d["offset"] > 0]
        return {"boundary": m.boundary, "documents": docs, "max_diff": max(d["diff"] for d in docs),
                "first_max_diff": max(d["diff"] for d in first) if first else 0.0,
                "first_positions": sum(len(d["positions"]) for d in first),
                "later_max_diff": max(later) if later else 0.0,
                "position_ids": "position_ids" in m.inputs, "inputs": list(m.inputs),
                "reaches": found, "pattern": pattern(found, m),
                "cut": cut(m, float(th["isolation_tolerance"])), "origin": m.origin,
                "resets": list(m.resets) if m.resets else None}

    def conditions(self, th: Settings) -> list[Condition]:
        tol = float(th["unpacked_tolerance"])

        def judge(v):
            what = (v.get("origin") and v["origin"] + "; " or "") + (
                    f"{len(v['documents'])} documents: per-token losses packed vs alone differ by up "
                    f"to {v['max_diff']:.3g} nats (tolerance {tol:.0e}; first in a row "
                    f"{v['first_max_diff']:.3g}, at an offset {v['later_max_diff']:.3g})")
            bad = [d for d in v["documents"] if d["diff"] > tol]
            if not bad:
                return Verdict.PASS, what + "; packing gives each document its unpacked loss", v["max_diff"]
            def at(d):
                return positions_text(d["positions"], d["length"]) if d["positions"] else "no position"
            named = listing([f"'{d['document']}' (row {d['row']}, offset {d['offset']}: "
                             f"{d['diff']:.3g}, mean {d['packed_mean']:.4g} packed vs "
                             f"{d['alone_mean']:.4g} alone; its predictions differ at {at(d)})"
                             for d in bad], 4)
            pat, own = v["pattern"], v["cut"]
            reach = measured(v["reaches"], pat)
            if own["kind"] == "cut":
                reach += "; " + cut_text(own)
            late = pat["kind"] == "late" and own.get("positions", pat["positions"]) == pat["positions"]
            resets = v.get("resets")
            if resets and resets[0] < resets[1]:
                why = (f"the pipeline's position_ids restart at only {resets[0]} of the {resets[1]} "
                       f"document boundaries it packs: each later document is positioned after, "
                       f"and {'attends to' if pat['kind'] != 'none' else 'is placed after'} the one "
                       f"before; reset position_ids at every document in the packer")
            elif v["first_max_diff"] > tol:
                why = "even a row's first document differs: the packed call itself changes the model's output"
            elif late:
                why = "only documents at an offset differ: " + late_cause(pat, v["boundary"])
            elif pat["kind"] == "none" and own["kind"] == "cut":
                why = "only documents at an offset differ: " + cut_cause(own, v["inputs"])
            elif pat["kind"] == "none" and not v["first_positions"]:
                why = ("only documents at an offset differ, no other document reaches any of their "
                       "positions, each sees its own first position and a row's first documents are "
                       "as alone at every position: the loss depends on where a document lands - the "
                       "model does not reset positions per document"
                       + (" (it ignores the position_ids it is given)" if v["position_ids"]
                          else " (it is not given position_ids)"))
            elif pat["kind"] == "crosses":
                why = ("only documents at an offset differ: attention crosses the boundary "
                       "(the previous document reaches every position of the next)")
            else:
                why = ("this pattern names no single cause (no reach, a late boundary or a crossing "
                       "leak would): check how the model reads the boundary and its positions")
            return Verdict.FAIL, f"{what}; {named}; {reach}: {why}", v["max_diff"]

        return [Condition("OBJ902", f"packed_equals_unpacked_within_{tol}", judge)]
