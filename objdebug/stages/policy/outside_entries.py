"""OBJ830: prompt and padding entries of old / reference log-probs change nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.core.findings import Condition, Verdict
from objdebug.core.settings import Settings
from objdebug.pipeline.context import Context
from objdebug.stages.policy._common import _base
from objdebug.stages.policy.base import PolicyCheck
from objdebug.stages.policy.session import session


class OutsideEntries(PolicyCheck):
    """Old / reference log-probs at prompt and padding positions change nothing."""

    name = "policy-kl-mask"

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        s = session(ctx)
        b = s.batches[0]
        logits = _base(s, b)["logits"]
        clean = s.point(b, logits, delta=0.5)
        dirty = s.point(b, logits, delta=0.5, outside=float(th["outside_value"]))
        d = float(abs(dirty["loss"] - clean["loss"]))
        dg = float(np.max(np.abs(dirty["dlogits"].astype(np.float64) - clean["dlogits"])))
        return {"loss": clean["loss"], "loss_with_outside": dirty["loss"], "loss_change": d,
                "grad_change": dg, "value": float(th["outside_value"])}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        tol = float(th["zero_loss_tolerance"])

        def judge(v):
            what = (f"old / reference log-probs at prompt and padding positions set to {v['value']:g} instead "
                    f"of 0: loss {v['loss']:.6g} -> {v['loss_with_outside']:.6g}, max logit-gradient change "
                    f"{v['grad_change']:.3g}")
            rel = v["loss_change"] / max(abs(v["loss"]), 1.0)
            if rel <= tol and v["grad_change"] == 0:
                return Verdict.PASS, what + ": they contribute nothing", rel
            return Verdict.FAIL, (what + ": prompt / padding entries enter the loss (a KL or ratio term not "
                                  "masked to completion tokens)"), rel

        return [Condition("OBJ830", "outside_entries_ignored", judge)]
