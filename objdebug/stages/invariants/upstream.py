"""OBJ704 upstream gradient: d(c·loss) = c·d(loss), and a weighted sum of per-sample losses has
the weighted sum of their gradients.

Autodiff hands the objective an incoming gradient (the "sens": the scale a training loop, a loss
weight, a mixed-precision loss scale or gradient accumulation puts on the loss). A custom bprop
that returns its own gradient without multiplying by it is exact at scale 1 (so finite
differences agree, OBJ206) and wrong everywhere else (Liger-Kernel 968, 678, PR 1298). Measured:
the gradient of `c * loss` (c = `upstream_scale`, default 3) on the batch against c times the
gradient of the loss, and each micro-batch's loss weighted by w_k (seeded, in [0.5, 2]) against w_k
times its unit gradient.

Graphs: `objective.logit_grad` at the batch shape and at the micro-batch shape
(one dynamic-shape graph shared with the other rules; the scale is a Tensor input, so no new graph).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.pipeline.context import Context
from objdebug.core.findings import Check, Condition, Verdict
from objdebug.core.settings import Settings
from objdebug.stages.invariants._common import (base, batch, fmt, logits, micro_batches,
    micro_probes, probe, rel, skip_end_to_end)


def l2_rel(g: np.ndarray, ref: np.ndarray) -> float:
    """||g - ref|| / ||ref||. An L2 ratio, not an element-wise one: at a confident position the
    gradient softmax - onehot is a float32 cancellation (p_y - 1) whose rounding depends on where
    the scale enters, so single tiny elements carry large relative noise; a backward that drops
    its incoming gradient is off by |1 - c| / c in every element, which the L2 ratio shows."""
    if not (np.isfinite(g).all() and np.isfinite(ref).all()):
        return float("nan")
    g, ref = g.astype(np.float64), ref.astype(np.float64)
    n = float(np.linalg.norm(ref))
    d = float(np.linalg.norm(g - ref))
    return d / n if n > 0 else (0.0 if d == 0 else float("inf"))


class UpstreamGradient(Check):
    """grad(c·L) vs c·grad(L); grad(Σ w_k L_k) vs Σ w_k grad(L_k) over micro-batches."""

    name = "upstream-gradient"
    stage = "invariants"

    def skip_reason(self, ctx: Context) -> str | None:
        return skip_end_to_end(ctx, "an upstream gradient scale and micro-batches (other batch shapes)")

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        c = float(th["upstream_scale"])
        b, x, ref = batch(ctx), logits(ctx), base(ctx)
        scaled = probe(ctx).run(x, b.labels, scale=c)
        g_rel = l2_rel(scaled.grad, c * ref.grad)
        norm = float(np.linalg.norm(ref.grad))
        ratio = float(np.linalg.norm(scaled.grad) / norm) if norm > 0 else float("nan")
        rng = np.random.default_rng(int(th["seed"]))
        ranges = micro_batches(ctx)
        weights = rng.uniform(0.5, 2.0, len(ranges))
        errs = []
        for (start, end), w, unit in zip(ranges, weights, micro_probes(ctx)):
            p = probe(ctx).run(x[start:end], b.labels[start:end], scale=float(w))
            errs.append(l2_rel(p.grad, w * unit.grad) if np.abs(unit.grad).max() > 0 else 0.0)
        return {"scale": c, "loss": ref.loss, "loss_scaled": scaled.loss,
                "loss_rel": rel(scaled.loss, ref.loss),  # outputs are the objective's own: unscaled
                "grad_rel": g_rel, "norm_ratio": ratio, "micro_batches": len(ranges),
                "weights": [float(w) for w in weights],
                "weighted_grad_rel": float(np.max(errs)) if errs else 0.0}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        tol = float(th["upstream_rtol"])

        def judge(v):
            worst = max(v["grad_rel"], v["weighted_grad_rel"])
            what = (f"grad({v['scale']:g}·loss) / grad(loss) = {fmt(v['norm_ratio'])} in norm (expected "
                    f"{v['scale']:g}; ||Δ||/||c·g|| {fmt(v['grad_rel'])}); {v['micro_batches']} "
                    f"micro-batch losses weighted by w in [{min(v['weights']):.2f}, "
                    f"{max(v['weights']):.2f}]: ||Δ||/||w·g|| {fmt(v['weighted_grad_rel'])}")
            if not np.isfinite(worst):
                return Verdict.SKIP, what + ": not judged, the gradient is not finite (see OBJ702)", None
            if worst > tol:
                hint = (" (a custom bprop that ignores its incoming gradient)"
                        if abs(v["norm_ratio"] - 1.0) < 1e-3 else "")
                return Verdict.FAIL, what + f"; above {tol:.0e}: the backward does not scale with " \
                                            f"the incoming gradient{hint}", float(worst)
            return Verdict.PASS, what + f"; within {tol:.0e}", float(worst)

        return [Condition("OBJ704", "gradient_scales_with_upstream", judge)]
