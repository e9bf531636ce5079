"""OBJ207, logit-gradient scale: the logit-gradient norm per scored token against a standard mean
cross-entropy's (numpy reference), and the likely cause of a difference."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.core.findings import Check, Condition, Verdict, band
from objdebug.core.settings import Settings
from objdebug.pipeline.context import Context
from objdebug.pipeline.run_data import logit_gradients, pairing_skip


class LogitGradientScale(Check):
    """Logit-gradient norm per scored token vs a standard mean cross-entropy (numpy reference)."""

    name = "logit-gradient-scale"
    stage = "grad"

    def skip_reason(self, ctx: Context) -> str | None:
        return pairing_skip(ctx)

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        lg = logit_gradients(ctx)
        sq, ref_sq = lg["sq"], lg["reference_sq"]
        scored = lg["labels"] != ctx.engine.padding.label_pad_id
        n = int(scored.sum())
        user = float(np.sqrt(np.sum(sq[scored])))
        ref = float(np.sqrt(np.sum(ref_sq[scored])))
        ratio = user / ref if ref > 0 else float("nan")
        return {"scored_tokens": n, "rows": int(scored.shape[0]), "positions": int(scored.size),
                "loss": float(lg["outputs"][0]), "norm": user, "reference_norm": ref, "ratio": ratio,
                "per_token_norm": float(np.mean(np.sqrt(sq[scored]))) if n else float("nan"),
                "reference_per_token_norm": float(np.mean(np.sqrt(ref_sq[scored]))) if n else float("nan"),
                "cause": _likely_cause(ratio, sq, ref_sq, scored)}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        p_lo, p_hi = th["scale_pass_low"], th["scale_pass_high"]
        f_lo, f_hi = th["scale_fail_low"], th["scale_fail_high"]

        def judge(v):
            x = v["ratio"]
            if not math.isfinite(x):
                return Verdict.SKIP, (f"not judged: the objective's logit gradient is not finite "
                                      f"(loss {v['loss']:.4g}), see OBJ203"), None
            verdict = band(x, pass_if=lambda a: p_lo <= a <= p_hi, fail_if=lambda a: a < f_lo or a > f_hi)
            return verdict, (
                f"logit-gradient norm = {x:#.3g}x a standard mean cross-entropy on the same logits "
                f"(reference, {v['scored_tokens']} scored tokens; per token {v['per_token_norm']:.3g} vs "
                f"{v['reference_per_token_norm']:.3g}): {v['cause']}; pass in [{p_lo}, {p_hi}], "
                f"fail outside [{f_lo}, {f_hi}]"), x

        return [Condition("OBJ207", f"logit_grad_ratio_in_{p_lo}_{p_hi}", judge)]


def _likely_cause(ratio: float, sq: np.ndarray, ref_sq: np.ndarray, scored: np.ndarray) -> str:
    """Name the likely cause from the per-position ratio user / reference.

    A reduction or a loss weight rescales every position's gradient by the same factor c; a
    temperature (or another loss shape) changes the softmax, so the factor varies by position.
    """
    if not math.isfinite(ratio):
        return "the objective's logit gradient is not finite"
    n, rows, positions = int(scored.sum()), scored.shape[0], scored.size
    # Confident positions (||softmax - onehot|| < 1e-2) carry float32 cancellation error in the
    # objective's own gradient: leave them out of the per-position comparison.
    use = scored & (np.sqrt(ref_sq) * n > 1e-2)
    if not use.any():
        use = scored & (ref_sq > 0)
    r = np.sqrt(sq[use] / ref_sq[use])
    if r.size and r.std() <= 1e-3 * r.mean():
        c = float(r.mean())

        def near(x: float) -> bool:
            return abs(c / x - 1) < 0.02

        if near(1.0):
            return "consistent with a mean cross-entropy over scored tokens"
        if n > 1 and near(n):
            return f"likely a sum instead of a mean over tokens (factor {c:.4g} ~ {n} scored tokens)"
        if rows > 1 and near(n / rows):
            return (f"likely a sum over tokens and a mean over rows (factor {c:.4g} ~ {n}/{rows} "
                    "scored tokens per row)")
        if n < positions and near(n / positions):
            return (f"likely a mean over all {positions} positions, masked ones included (factor "
                    f"{c:.3g} ~ {n}/{positions} scored)")
        return f"the same cross-entropy gradient scaled by a constant {c:.4g} (a loss weight?)"
    if 0.8 <= ratio <= 1.25:
        return "close to a mean cross-entropy (not a pure rescaling: label smoothing or per-row means?)"
    return (f"not a pure rescaling: likely a temperature T ~ {1 / ratio:.2g} applied to the logits "
            "(or a different loss shape)")
