"""OBJ901 isolation: changing one packed document must not move any other document of the row.

Each measured row's first document has its tokens replaced (same length, seeded); the later
documents' per-token losses (the user's objective, one position scored) and logit gradients (the
objective's gradient w.r.t. the logits of the packed batch) are compared with the original row's.
A model that keeps documents apart gives the same numbers to float32 rounding; one whose attention
crosses the boundary gives a leak the size of what the changed document told the next one.

The verdict reads the scored tokens; the message then says where the leak is, position by
position (`_reach`: each document but the last changed in turn, the model's next-token
log-probabilities at every position, scored or not), and names a cause only when that pattern
supports one: a leak into the first position(s) after each boundary and nowhere else is a
boundary read late (whatever its form), a leak through the whole next document is an attention
that does not apply the boundary (the advice by boundary form below).

Graphs: `packing.model`, `objective.forward`, `objective.logit_grad` (see `_common.py`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.core.findings import Condition, Verdict, listing
from objdebug.core.settings import Settings
from objdebug.stages.packing._common import PackingCheck, measurement
from objdebug.stages.packing._reach import cut, cut_text, late_cause, measured, pattern, reaches

# the fix for a leak that crosses the whole boundary, by what the model was given about it
ADVICE = {
    "position_ids": ("this attention ignores the position-id resets (only a varlen / flash path reads "
                     "them): give the model a block-diagonal attention_mask or actual_seq_len, or do "
                     "not pack with this attention implementation"),
    "attention_mask": ("the model does not apply the block-diagonal mask it is given (check its "
                       "shape [packing] mask_shape and meaning mask_ones, and that it is not "
                       "replaced by a causal mask); or do not pack with it"),
    "actual_seq_len": ("the model does not cut attention at actual_seq_len (an attention path that "
                       "ignores it, e.g. without flash attention): use one that reads it, a block "
                       "mask, or do not pack"),
    "none": ("the model takes no document boundary at all: packing with it leaks; pass a block "
             "mask, actual_seq_len or reset position ids to an attention that reads them, or do "
             "not pack"),
}


class PackingIsolation(PackingCheck):
    name = "packing-isolation"
    stage = "packing"
    needs_boundary = True

    def measure(self, ctx, th: Settings) -> dict[str, Any]:
        m = measurement(ctx, th)
        docs, changed = [], []
        for i, row in enumerate(m.rows):
            s0, e0 = row.span(0)
            moved = np.abs(m.loss[i, s0:e0] - m.loss_changed[i, s0:e0])
            changed.append(float(np.nanmax(moved)) if np.isfinite(moved).any() else 0.0)
            for k in range(1, len(row.docs)):
                s, e = row.span(k)
                dl = np.abs(m.loss[i, s:e] - m.loss_changed[i, s:e])
                g, gc = m.grad[i, s:e].astype(np.float64), m.grad_changed[i, s:e].astype(np.float64)
                scale = float(np.abs(g).max())
                dg = float(np.abs(g - gc).max()) / scale if scale > 0 else 0.0
                docs.append({"row": i, "document": row.docs[k].id, "changed": row.docs[0].id,
                             "loss_diff": float(np.nanmax(dl)) if np.isfinite(dl).any() else 0.0,
                             "grad_rel_diff": dg})
        found = reaches(m, float(th["isolation_tolerance"]))
        return {"boundary": m.boundary, "inputs": list(m.inputs), "length": m.length,
                "reaches": found, "pattern": pattern(found, m),
                "cut": cut(m, float(th["isolation_tolerance"])),
                "rows": len(m.rows), "documents_per_row": len(m.rows[0].docs), "documents": docs,
                "max_loss_diff": max(d["loss_diff"] for d in docs),
                "max_grad_rel_diff": max(d["grad_rel_diff"] for d in docs),
                "first_document_change": max(changed), "origin": m.origin,
                "resets": list(m.resets) if m.resets else None}

    def conditions(self, th: Settings) -> list[Condition]:
        tol, gtol = float(th["isolation_tolerance"]), float(th["gradient_rtol"])

        def judge(v):
            what = (v.get("origin") and v["origin"] + "; " or "") + (
                    f"{v['rows']} packed row(s) of {v['documents_per_row']} documents ({v['length']} "
                    f"tokens, boundary = \"{v['boundary']}\"): changing each row's first document "
                    f"(its own per-token losses moved by up to {v['first_document_change']:.3g}) moves "
                    f"the later documents' per-token losses by up to {v['max_loss_diff']:.3g} nats "
                    f"(tolerance {tol:.0e}) and their logit gradients by {v['max_grad_rel_diff']:.3g} "
                    f"of their largest entry (tolerance {gtol:.0e})")
            leaks = [d for d in v["documents"] if d["loss_diff"] > tol or d["grad_rel_diff"] > gtol]
            pat = v["pattern"]
            where = measured(v["reaches"], pat)
            if v["cut"]["kind"] == "cut":
                where += "; " + cut_text(v["cut"])
            if not leaks:
                if pat["kind"] == "none":
                    inside = ("" if v["cut"]["kind"] != "cut" else
                              "; within a document, " + cut_text(v["cut"]) + " (OBJ902)")
                    return Verdict.PASS, what + "; the documents are isolated" + inside, v["max_loss_diff"]
                # a leak into positions the objective does not score: it trains nothing here,
                # and still says where the model puts the boundary (OBJ902 reads it too)
                return (Verdict.PASS, what + "; the scored tokens of the later documents do not "
                        f"move, their predictions at unscored positions do - {where}"
                        + _cause(pat, v["boundary"], v.get("resets")), v["max_loss_diff"])
            worst = max(leaks, key=lambda d: d["loss_diff"])
            named = listing([f"'{d['document']}' (row {d['row']}, after '{d['changed']}': "
                             f"{d['loss_diff']:.3g})" for d in leaks], 4)
            return (Verdict.FAIL, what + f"; packing leaks into {len(leaks)} of "
                    f"{len(v['documents'])} documents: {named}, worst '{worst['document']}'; "
                    f"{where}" + _cause(pat, v["boundary"], v.get("resets")), v["max_loss_diff"])

        return [Condition("OBJ901", f"packed_documents_isolated_within_{tol}", judge)]


def _cause(pat: dict, boundary: str, resets: list[int] | None = None) -> str:
    """The cause the position-by-position pattern supports, or none named."""
    if resets and resets[0] < resets[1] and pat["kind"] != "none":
        # the pipeline's own positions: what it gives the model is no boundary at all
        return (f"; the pipeline's position_ids restart at only {resets[0]} of the {resets[1]} "
                f"document boundaries it packs (they run on across the others): the model is given "
                f"no boundary there; reset position_ids at every document in the packer (or pass a "
                f"block mask / actual_seq_len)")
    if pat["kind"] == "late":
        return "; so " + late_cause(pat, boundary)
    if pat["kind"] == "crosses":
        return "; the leak runs through the whole next document: " + ADVICE[boundary]
    return ("; this pattern (neither confined to the first positions after each boundary nor "
            "running through the next document) names no single cause: check how the model reads "
            f"the boundary input ({boundary})")
