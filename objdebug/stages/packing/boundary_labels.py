"""OBJ903 boundary labels: which positions train at each document boundary.

On `[packing]` rows or, without that section, on the pipeline's own packed rows (`[data] batches`)
with its own labels: a packer that labels a document's last token with the next document's first
token fails here.

The logit gradient of the user's objective on the packed batch (labels built as `[packing] labels`
says) shows what trains, whatever the label convention (shifted labels, or an objective that
shifts itself): a position trains when its logit gradient is non-zero, toward the token whose
logit the gradient pushes up most. The position whose logits predict the next document's first
token (the previous document's last position: its separator when there is one) must not train;
with a separator the position before it trains toward the separator (the document's end).

Graph: `objective.logit_grad` (see `_common.py`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.core.findings import Condition, Verdict, listing
from objdebug.core.settings import Settings
from objdebug.stages.packing._common import PackingCheck, measurement


class PackingBoundaryLabels(PackingCheck):
    name = "packing-boundary-labels"
    stage = "packing"

    def measure(self, ctx, th: Settings) -> dict[str, Any]:
        m = measurement(ctx, th)
        sep = m.separator
        ids = m.arrays["input_ids"]
        bounds = []
        for i, row in enumerate(m.rows):
            for k in range(1, len(row.docs)):
                start = row.span(k)[0]
                trained = []
                for t in range(max(start - 2, 0), start + 1):
                    if m.grad_sq[i, t] > 0:
                        target = int(np.argmin(m.grad[i, t]))
                        trained.append({"position": t, "token": int(ids[i, t]), "target": target})
                last = start - 1
                crossing = [p for p in trained if p["position"] == last]
                bounds.append({"row": i, "from": row.docs[k - 1].id, "to": row.docs[k].id,
                               "last_position": last, "next_first_token": int(ids[i, start]),
                               "trained": trained, "crosses": bool(crossing),
                               "crossing_target": crossing[0]["target"] if crossing else None})
        return {"separator": sep, "labels": m.labels, "boundaries": bounds,
                "crossing": sum(b["crosses"] for b in bounds), "origin": m.origin}

    def conditions(self, th: Settings) -> list[Condition]:
        def judge(v):
            b0 = v["boundaries"][0]
            shown = ", ".join(f"{p['position']}->{p['target']}" for p in b0["trained"]) or "none"
            sep = "no separator" if v["separator"] is None else f"separator {v['separator']}"
            labels = ("the pipeline's labels" if v["labels"] == "the pipeline's"
                      else f"labels = \"{v['labels']}\"")
            what = (v.get("origin") and v["origin"] + ": " or "") + (
                    f"{len(v['boundaries'])} boundaries ({sep}, {labels}); at "
                    f"'{b0['from']}' -> '{b0['to']}' (row {b0['row']}) the positions that train "
                    f"around the boundary: {shown} (position->target)")
            if not v["crossing"]:
                return (Verdict.PASS, what + f"; the last position of a document (e.g. "
                        f"{b0['last_position']}) predicts nothing", 0.0)
            bad = [b for b in v["boundaries"] if b["crosses"]]
            named = listing([f"'{b['from']}' -> '{b['to']}' (row {b['row']}, position "
                             f"{b['last_position']} trains toward {b['crossing_target']}"
                             + (", the next document's first token" if b["crossing_target"]
                                == b["next_first_token"] else "") + ")" for b in bad], 3)
            return (Verdict.FAIL, f"{what}; {len(bad)} boundaries train a document's first token "
                    f"as the continuation of the previous one: {named}", float(len(bad)))

        return [Condition("OBJ903", "boundary_not_trained", judge)]
