"""OBJ205, padding leakage: positions labelled label_pad_id get exactly zero gradient (the
end-to-end form without a probed head: each row's loss is padding-invariant)."""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.core.findings import Check, Condition, Verdict
from objdebug.core.settings import Settings
from objdebug.pipeline.context import Context
from objdebug.pipeline.run_data import grad_batch, logit_checks_skip, logit_gradients, pairing_skip
from objdebug.stages.grad._common import _batch_info


class PaddingLeakage(Check):
    """Positions labelled label_pad_id must get exactly zero gradient (end-to-end: padding-invariant loss)."""

    name = "padding-leakage"
    stage = "grad"

    def skip_reason(self, ctx: Context) -> str | None:
        # the end-to-end form without a probed head is measured by padding more (below)
        return None if ctx.target.end_to_end else pairing_skip(ctx)

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        if logit_checks_skip(ctx):  # an end-to-end Cell whose logits objdebug cannot reach
            return self._measure_end_to_end(ctx, th)
        tol = float(th["leak_tolerance"])
        batch = grad_batch(ctx)
        lg = logit_gradients(ctx)
        sq = lg["sq"]
        masked = lg["labels"] == ctx.engine.padding.label_pad_id
        leaking = masked & ~(sq <= tol * tol)  # NaN counts as a leak
        total = float(np.nansum(sq))
        return {"form": "logits", "label_pad_id": ctx.engine.padding.label_pad_id, "tolerance": tol,
                "batch": _batch_info(ctx, batch), "masked": int(masked.sum()),
                "leaking": int(leaking.sum()),
                "leak_share": float(np.nansum(sq[leaking]) / total) if total > 0 else 0.0,
                "max_masked_norm": float(np.sqrt(np.nanmax(sq[masked]))) if masked.any() else 0.0,
                "leaking_rows": sorted({int(b) for b in np.nonzero(leaking)[0]})}

    def _measure_end_to_end(self, ctx: Context, th: Settings) -> dict[str, Any]:
        """No logits to probe: pad every row further (next length bucket); each row's loss must not move."""
        batch = grad_batch(ctx)
        samples = batch.samples[:ctx.engine.batch_size]
        short = ctx.engine.bucket(max(s.length for s in samples))
        long = ctx.engine.bucket(short + 1)
        a, b = (ctx.engine.batches(samples, n)[0] for n in (short, long))
        la = ctx.engine.per_sample_raw(a.input_ids, a.labels)[:len(samples), 0]
        lb = ctx.engine.per_sample_raw(b.input_ids, b.labels)[:len(samples), 0]
        tol = float(th["pad_rel_tolerance"])
        with np.errstate(invalid="ignore", divide="ignore"):
            rel = np.abs(lb - la) / np.maximum(np.abs(la), 1e-12)
        changed = ~(rel <= tol)
        return {"form": "end-to-end", "label_pad_id": ctx.engine.padding.label_pad_id, "tolerance": tol,
                "rows": len(samples), "length": short, "padded_length": long,
                "changed": int(changed.sum()), "max_rel_change": float(np.nanmax(rel)),
                "mean_loss": float(np.mean(la)), "mean_loss_padded": float(np.mean(lb)),
                "changed_ids": [s.id for s, c in zip(samples, changed) if c]}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        def judge(v):
            pid = v["label_pad_id"]
            if v["form"] == "end-to-end":
                n, rows = v["changed"], v["rows"]
                what = (f"{n} of {rows} samples change their loss when padded from {v['length']} to "
                        f"{v['padded_length']} positions (label_pad_id={pid}; mean "
                        f"{v['mean_loss']:.4g} -> {v['mean_loss_padded']:.4g}, max relative change "
                        f"{v['max_rel_change']:.2%}; tolerance {v['tolerance']:.0e})")
                if n:
                    return Verdict.FAIL, (what + ": the objective trains on padding; set its "
                                          f"ignore_index to {pid} or pad labels with its ignore_index"
                                          ), float(n)
                return Verdict.PASS, what, 0.0
            n, m, share = v["leaking"], v["masked"], v["leak_share"]
            what = (f"{n} of {m} masked positions (label_pad_id={pid}) receive gradient "
                    f"({share:.0%} of the squared logit-gradient norm, max norm "
                    f"{v['max_masked_norm']:.3g} at a masked position)")
            if n:
                return Verdict.FAIL, (what + ": the objective trains on prompt/padding; set "
                                      f"ignore_index to {pid} or pad labels with the objective's "
                                      "ignore_index (usually -100)"), float(n)
            return Verdict.PASS, what, 0.0

        return [Condition("OBJ205", "masked_positions_get_no_gradient", judge)]
