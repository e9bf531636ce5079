"""OBJ904 normalisation: a packed batch weighs tokens as the unpacked batch does.

The same documents, with their own (unpacked) logits, are given to the user's objective twice on
the same scored tokens: packed into rows as the pipeline packs them, and one document per row.
The model plays no part (the logits are the same), so any difference is the objective's
reduction: a per-row mean weighs a row of several documents as one sample. The host's float64
references (token mean, mean of document means, mean of row means over the documents' own
per-token losses from the objective) say which weighting each value matches; they are
cross-checks, reported as such.

Graph: `objective.logit_grad` at the packed and the unpacked batch shapes.
"""

from __future__ import annotations

from typing import Any

from objdebug.core.findings import Condition, Verdict
from objdebug.core.settings import Settings
from objdebug.stages.packing._common import PackingCheck, measurement

NAMES = {"token_mean": "the token mean", "document_mean": "the mean of document means",
         "row_mean": "the mean of packed-row means", "token_sum": "the token sum"}


def _matches(value: float, refs: dict, rtol: float) -> str | None:
    for key in ("token_mean", "token_sum", "document_mean", "row_mean"):
        if abs(value - refs[key]) <= rtol * max(abs(refs[key]), 1e-12):
            return key
    return None


class PackingNormalisation(PackingCheck):
    name = "packing-normalisation"
    stage = "packing"

    def measure(self, ctx, th: Settings) -> dict[str, Any]:
        m = measurement(ctx, th)
        rtol = float(th["normalisation_rtol"])
        refs = m.references
        return {"packed": m.packed_total, "unpacked": m.unpacked_total,
                "rel_diff": abs(m.packed_total - m.unpacked_total) / max(abs(m.unpacked_total), 1e-12),
                "references": refs, "packed_matches": _matches(m.packed_total, refs, 10 * rtol),
                "unpacked_matches": _matches(m.unpacked_total, refs, 10 * rtol)}

    def conditions(self, th: Settings) -> list[Condition]:
        rtol = float(th["normalisation_rtol"])

        def judge(v):
            name = lambda k: NAMES.get(k, "none of the references")  # noqa: E731
            refs = v["references"]
            what = (f"batch loss packed {v['packed']:.6g} vs unpacked {v['unpacked']:.6g} on the "
                    f"same documents, logits and scored tokens (relative difference "
                    f"{v['rel_diff']:.3g}, tolerance {rtol:.0e}); reference token mean "
                    f"{refs['token_mean']:.6g}, document mean {refs['document_mean']:.6g}, row mean "
                    f"{refs['row_mean']:.6g}")
            if v["rel_diff"] <= rtol:
                return Verdict.PASS, what + f"; both are {name(v['unpacked_matches'])}", v["rel_diff"]
            return (Verdict.FAIL, what + f"; packed is {name(v['packed_matches'])}, unpacked "
                    f"{name(v['unpacked_matches'])}: a packed row of several documents weighs as "
                    f"one sample", v["rel_diff"])

        return [Condition("OBJ904", f"packed_weighting_within_{rtol}", judge)]
