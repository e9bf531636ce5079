"""OBJ703 ignored positions: loss and gradient with ignored positions equal those without them.

The batch (rows right-padded; prompt, last position and padding labelled label_pad_id) is compared
with the same rows cut after their last scored position, so the trailing ignored positions are
removed and the scored ones keep their places (an objective that pairs position t with label t+1
sees the same pairs). The loss must agree and the gradient must agree on the kept positions and be
zero on the removed ones. The check runs the configured objective and, when its constructor has
them, variants with the other of reduction "mean"/"sum", with label smoothing and with class
weights: pytorch 73205 counted ignored targets only when smoothing was on.

Graphs: `invariants.logit_grad[<variant>]`, one per variant, called at the batch shape and at the
cut shape (dynamic shapes: one compile each; the configured one is shared with every rule, a
variant with OBJ705 when it perturbs the same setting).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.pipeline.context import Context
from objdebug.core.findings import Check, Condition, Verdict, listing
from objdebug.core.settings import Settings
from objdebug.stages.invariants._common import (batch, fmt, grad_rel, logits, probe, rel, scored,
    settings, skip_end_to_end)


def variants(ctx: Context) -> list[dict[str, Any]]:
    """Changes to the objective's kwargs worth testing: reduction, smoothing, class weights."""
    pr = probe(ctx)
    have = pr.settings
    out: list[dict[str, Any]] = [{}]
    red = have.get("reduction")
    if red in ("mean", "sum"):
        out.append({"reduction": "sum" if red == "mean" else "mean"})
    smooth = settings(ctx)["label_smoothing"]
    if "label_smoothing" in have and not have.get("label_smoothing"):
        out.append({"label_smoothing": float(smooth)})
    if "weight" in have and have.get("weight") is None:
        vocab = logits(ctx).shape[-1]
        rng = np.random.default_rng(int(settings(ctx)["seed"]))
        out.append({"weight": rng.uniform(0.5, 1.5, vocab).astype(np.float32)})
    return out


class IgnoredPositions(Check):
    """Loss and gradient with the trailing ignored positions vs with them removed."""

    name = "ignored-positions"
    stage = "invariants"

    def skip_reason(self, ctx: Context) -> str | None:
        return skip_end_to_end(ctx, (
            "the batch cut after its last scored position (another shape) and variants of the"
            " objective"))

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        b, x = batch(ctx), logits(ctx)
        keep = scored(ctx, b.labels)
        last = int(np.nonzero(keep.any(0))[0].max()) if keep.any() else 0
        cut = last + 1
        total = b.labels.shape[1]
        rows = []
        if cut >= total:
            return {"length": total, "cut": cut, "removed": 0, "rows": rows}
        tol = float(th["ignored_rtol"])
        for changes in variants(ctx):
            name = ", ".join(f"{k}={v if not isinstance(v, np.ndarray) else 'random[V]'}"
                             for k, v in changes.items()) or "configured"
            try:
                full = probe(ctx).run(x, b.labels, changes=changes)
                short = probe(ctx).run(x[:, :cut], b.labels[:, :cut], changes=changes)
            except Exception as exc:  # a variant the objective rejects is reported, not fatal
                rows.append({"variant": name, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"})
                continue
            loss_rel = rel(short.loss, full.loss)
            kept = grad_rel(full.grad[:, :cut], short.grad)
            scale = float(np.abs(short.grad).max()) if np.isfinite(short.grad).all() else float("nan")
            leak = float(np.abs(full.grad[:, cut:]).max()) / scale if scale > 0 else 0.0
            rows.append({"variant": name, "loss": full.loss, "loss_removed": short.loss,
                         "loss_rel": loss_rel, "grad_rel": kept, "removed_grad_rel": leak,
                         "ok": bool(loss_rel <= tol and kept <= tol and leak <= tol)})
        return {"length": total, "cut": cut, "removed": int(b.labels.shape[0] * (total - cut)),
                "scored": int(keep.sum()), "tolerance": tol, "rows": rows}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        def judge(v):
            if not v["removed"]:
                return Verdict.SKIP, (f"not judged: every row is scored up to the batch length "
                                      f"{v['length']}, there are no trailing ignored positions to "
                                      "remove"), None
            ran = [r for r in v["rows"] if "error" not in r]
            shown = "; ".join(f"{r['variant']}: loss {fmt(r['loss'])} vs {fmt(r['loss_removed'])} "
                              f"(rel {fmt(r['loss_rel'])}), gradient rel {fmt(r['grad_rel'])}, at "
                              f"removed positions {fmt(r['removed_grad_rel'])}" for r in ran)
            failed = [r for r in v["rows"] if "error" in r]
            what = (f"{v['removed']} trailing ignored positions removed (length {v['length']} -> "
                    f"{v['cut']}, {v['scored']} scored kept): {shown}"
                    + (f"; not run: {listing([r['variant'] + ' (' + r['error'] + ')' for r in failed], 3)}"
                       if failed else ""))
            bad = [r for r in ran if not r["ok"]]
            if bad:
                return Verdict.FAIL, what + (f"; tolerance {v['tolerance']:.0e}: the ignored positions "
                                             f"count in the loss with {listing([r['variant'] for r in bad])}"
                                             ), float(max(r["loss_rel"] for r in bad))
            return Verdict.PASS, what + f"; equal within {v['tolerance']:.0e}", \
                float(max((r["loss_rel"] for r in ran), default=0.0))

        return [Condition("OBJ703", "ignored_positions_change_nothing", judge)]
