"""OBJ902 same as unpacked: each document's per-token losses in a packed row equal its losses alone.

Alone means the path every other stage uses (`model.forward`, the document right-padded in its
own row, positions from 0). Packed, the same document sits at an offset after other documents:
with isolated attention and positions reset the two agree to rounding. A model that isolates
documents but does not reset positions (it ignores `position_ids`, or is not given them) fails
here and not in OBJ901: its loss depends on where a document lands. (With rotary embeddings alone
an offset cancels in q·k up to rounding of the larger angles; learned absolute positions do not.)

Graphs: `packing.model`, `model.forward`, `objective.per_sample`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.core.findings import Condition, Verdict, listing
from objdebug.core.settings import Settings
from objdebug.stages.packing._common import PackingCheck, measurement


class PackingUnpacked(PackingCheck):
    name = "packing-unpacked"
    stage = "packing"

    def measure(self, ctx, th: Settings) -> dict[str, Any]:
        m = measurement(ctx, th)
        docs = []
        for i, row in enumerate(m.rows):
            for k, doc in enumerate(row.docs):
                s, e = row.span(k)
                diff = np.abs(m.loss[i, s:e] - m.loss_alone[i][k])
                docs.append({"row": i, "document": doc.id, "offset": int(s),
                             "diff": float(np.nanmax(diff)) if np.isfinite(diff).any() else 0.0,
                             "packed_mean": float(np.nanmean(m.loss[i, s:e])),
                             "alone_mean": float(np.nanmean(m.loss_alone[i][k]))})
        # how far the other documents' changes reach (OBJ901's measurement): tells apart a leak
        # from positions that are not reset
        leak = max(float(np.nanmax(np.abs(m.loss[i, row.span(k)[0]:row.span(k)[1]]
                                          - m.loss_changed[i, row.span(k)[0]:row.span(k)[1]])))
                   for i, row in enumerate(m.rows) for k in range(1, len(row.docs)))
        first = [d["diff"] for d in docs if d["offset"] == 0]
        later = [d["diff"] for d in docs if d["offset"] > 0]
        return {"boundary": m.boundary, "documents": docs, "max_diff": max(d["diff"] for d in docs),
                "first_max_diff": max(first) if first else 0.0,
                "later_max_diff": max(later) if later else 0.0,
                "position_ids": "position_ids" in m.inputs, "leak": leak}

    def conditions(self, th: Settings) -> list[Condition]:
        tol = float(th["unpacked_tolerance"])

        def judge(v):
            what = (f"{len(v['documents'])} documents: per-token losses packed vs alone differ by up "
                    f"to {v['max_diff']:.3g} nats (tolerance {tol:.0e}; first in a row "
                    f"{v['first_max_diff']:.3g}, at an offset {v['later_max_diff']:.3g})")
            bad = [d for d in v["documents"] if d["diff"] > tol]
            if not bad:
                return Verdict.PASS, what + "; packing gives each document its unpacked loss", v["max_diff"]
            named = listing([f"'{d['document']}' (row {d['row']}, offset {d['offset']}: "
                             f"{d['diff']:.3g}, mean {d['packed_mean']:.4g} packed vs "
                             f"{d['alone_mean']:.4g} alone)" for d in bad], 4)
            if v["first_max_diff"] <= tol and v["leak"] <= float(th["isolation_tolerance"]):
                why = ("only documents at an offset differ and no other document reaches them "
                       "(OBJ901): the loss depends on where a document lands - the model does not "
                       "reset positions per document"
                       + (" (it ignores the position_ids it is given)" if v["position_ids"]
                          else " (it is not given position_ids)"))
            elif v["first_max_diff"] <= tol:
                why = (f"only documents at an offset differ: attention crosses the boundary "
                       f"(OBJ901: up to {v['leak']:.3g} nats from the previous document)")
            else:
                why = "even a row's first document differs: the packed call itself changes the model's output"
            return Verdict.FAIL, f"{what}; {named}: {why}", v["max_diff"]

        return [Condition("OBJ902", f"packed_equals_unpacked_within_{tol}", judge)]
