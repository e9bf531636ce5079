"""Padding invariance: one sample with 0, 10 and 500 extra padding tokens, loss and gradients.

The sample is `short_length - 10` tokens of real text, so "+10" shares the batch-1 graph of the
other short cases. Padding sits at the end, labelled `label_pad_id`; any change of the loss or
the gradients with the amount of padding proves that the objective (or the model) sees it.
Code OBJ504.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.context import Context
from objdebug.findings import Check, Condition, Verdict
from objdebug.settings import Settings
from objdebug.stages.stress_cases._common import (flat_grads, loss_and_grad, packed, rel_diff,
                                                  short_length, text_sample)


class PaddingInvariance(Check):
    name = "padding-invariance"
    stage = "stress"

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        base = max(short_length(th) - 10, 2)
        extras = [0] + [int(e) for e in th["pad_extra"]]
        sample = text_sample(ctx, base, "pad")
        rows, ref_loss, ref_grad = [], None, None
        for extra in extras:
            ids, labels = packed(ctx, [sample], base + extra)
            out = loss_and_grad(ctx, ids, labels)
            g = flat_grads(out["grads"])
            if ref_grad is None:
                ref_loss, ref_grad = out["loss"], g
            gdiff = float(np.linalg.norm(g - ref_grad) / max(np.linalg.norm(ref_grad), 1e-30)) \
                if np.all(np.isfinite(g)) and np.all(np.isfinite(ref_grad)) else float("nan")
            rows.append({"extra_pad": extra, "length": base + extra, "loss": out["loss"],
                         "grad_norm": out["grad_norm"], "loss_rel_diff": rel_diff(out["loss"], ref_loss),
                         "grad_rel_diff": gdiff})
        # np.max, not max(): a NaN at +500 must not hide behind a finite +10 row
        return {"tokens": base, "rows": rows,
                "max_loss_rel_diff": float(np.max([r["loss_rel_diff"] for r in rows])),
                "max_grad_rel_diff": float(np.max([r["grad_rel_diff"] for r in rows]))}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        ltol, gtol = float(th["pad_loss_rtol"]), float(th["pad_grad_rtol"])

        def judge(v):
            shown = "; ".join(f"+{r['extra_pad']}: loss {r['loss']:.6g} (rel {r['loss_rel_diff']:.2g}),"
                              f" grad rel {r['grad_rel_diff']:.2g}" for r in v["rows"][1:])
            lx, gx = v["max_loss_rel_diff"], v["max_grad_rel_diff"]
            msg = (f"{v['tokens']} tokens, padding +0: loss {v['rows'][0]['loss']:.6g}; {shown}; "
                   f"tolerance loss {ltol:g}, gradients {gtol:g} (relative)")
            if math.isnan(lx) or math.isnan(gx):
                return Verdict.FAIL, msg + "; non-finite loss or gradients", lx
            if lx <= ltol and gx <= gtol:
                return Verdict.PASS, msg, lx
            return Verdict.FAIL, msg + "; the objective or the model sees padding", lx

        return [Condition("OBJ504", f"padding_changes_nothing_rtol_{ltol:g}", judge)]
