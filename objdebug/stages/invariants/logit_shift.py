"""OBJ702 logit-shift invariance: a softmax objective must not change when every logit moves by c.

The model's float32 logits plus c (1, 1e2, 1e4 by default) are rounded to float32, as they would
be on the device; the objective's loss and logit gradient are compared with those at c = 0.

Tolerance, derived from that rounding rather than fixed. The shifted logit the objective sees is
x + c + δ with δ = fl32(x + c) - (x + c), computed here exactly (float64), and it computes at
magnitude |x + c|, where float32 numbers are s = spacing(max|x + c|) apart (~1e-3 at 1e4). So even
a max-subtracted objective is not exact at 1e4: a log-probability formed as x - logsumexp(x) (as
`nn.CrossEntropyLoss` does) carries an error of about s per token. Allowed:

- loss: safety x (Σ |g|·|δ| + 2·s·W): the first-order effect of δ (g: the objective's logit
  gradient at c = 0) plus 2 spacings per token weighted by W, the sum of the objective's position
  weights (1 for a token mean, the token count for a sum);
- gradient, per element: safety x 2·s·w_max (softmax minus one-hot, times a position weight w,
  moves by at most w times the log-probability error);
- both plus `noise_ulps` float32 ulps for the objective's own rounding.

The position weights are measured, not assumed: at all-equal logits a softmax objective's gradient
at the label is -w (1 - 1/V), so one more call at logits = 0 (same graph and shape) gives each
position's w. The safety factor is `rounding_safety`. A missing max subtraction (exp overflows to
inf, loss NaN) does not pass, nor does an undeclared term on the absolute logit level. A declared
component that explains the change (a z-loss returned as (total, ce, z_loss) with
`objective.components`) is a note naming it: see shift_attribution.py.

Graphs: `objective.logit_grad` on the grad stage's batch shape (shared); a library
model as the end-to-end target: `library.logit_grad` (its own loss, the head's output + c).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.pipeline.context import Context
from objdebug.core.findings import Check, Condition, Verdict
from objdebug.core.settings import Settings
from objdebug.stages.invariants._common import (F32_EPS, base, fmt, labels, logits,
    position_labels, probe, scored, skip_logit_checks)
from objdebug.stages.invariants.shift_attribution import attribute, component_names


def position_weights(ctx: Context) -> np.ndarray:
    """Each scored position's weight in the loss, measured: at logits = 0 (p = 1/V everywhere) a
    softmax objective's gradient at the label is -w (1 - 1/V)."""
    def build() -> np.ndarray:
        y, x = labels(ctx), logits(ctx)
        g = probe(ctx).run(np.zeros_like(x), y).grad
        at = position_labels(ctx)  # the label each logit position is scored against
        keep = scored(ctx, at)
        if not keep.any() or not np.isfinite(g).all():
            return np.zeros(0)
        at_label = np.take_along_axis(g, np.where(keep, at, 0)[..., None], -1)[..., 0]
        vocab = x.shape[-1]
        return np.abs(at_label[keep]) * vocab / (vocab - 1)
    return ctx.provide(position_weights, build)


class LogitShift(Check):
    """Loss and logit gradient at logits + c vs at the logits, within the rounding of x + c."""

    name = "logit-shift"
    stage = "invariants"

    def skip_reason(self, ctx: Context) -> str | None:
        return skip_logit_checks(ctx)

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        safety, ulps = float(th["rounding_safety"]), float(th["noise_ulps"])
        y, x, ref = labels(ctx), logits(ctx), base(ctx)
        g0 = ref.grad
        gmax = float(np.abs(g0).max()) if np.isfinite(g0).all() else float("nan")
        w = position_weights(ctx)
        big_w, max_w = float(w.sum()), float(w.max()) if w.size else 0.0
        rows = []
        for c in th["logit_shifts"]:
            c = float(c)
            shifted = (x + np.float32(c)).astype(np.float32)
            delta = shifted.astype(np.float64) - (x.astype(np.float64) + c)  # exact rounding error
            spacing = float(np.spacing(np.abs(shifted).max()))
            p = probe(ctx).run(shifted, y)
            loss_tol = safety * (float(np.sum(np.abs(g0) * np.abs(delta))) + 2.0 * spacing * big_w) + \
                ulps * F32_EPS * max(abs(ref.loss), 1.0)
            grad_tol = (safety * 2.0 * spacing + ulps * F32_EPS) * max(max_w, gmax)
            loss_diff = abs(p.loss - ref.loss) if np.isfinite(p.loss) else float("nan")
            g_diff = float(np.abs(p.grad - g0).max()) if np.isfinite(p.grad).all() else float("nan")
            rows.append({"shift": c, "loss": p.loss, "loss_diff": loss_diff, "loss_tolerance": loss_tol,
                         "grad_diff": g_diff, "grad_tolerance": grad_tol,
                         "grad_rel": g_diff / gmax if gmax > 0 else g_diff,
                         "max_rounding": float(np.abs(delta).max()), "spacing": spacing,
                         "ok": bool(loss_diff <= loss_tol and g_diff <= grad_tol),
                         # signed changes of the total and of each declared component (shift_attribution)
                         "total_change": float(p.outputs[0] - ref.outputs[0]),
                         "component_changes": [float(a - b) for a, b in zip(p.outputs[1:], ref.outputs[1:])],
                         "finite": bool(np.isfinite(p.outputs).all() and np.isfinite(p.grad).all())})
        names = component_names(ctx.config, len(ref.outputs))
        primary = ctx.config.objective.primary
        return {"loss": ref.loss, "max_grad": gmax, "weight_sum": big_w, "max_weight": max_w,
                "rows": rows, "components": names, "primary": primary or (names[0] if names else None),
                "attribution": attribute(rows, names, primary, float(th["component_rtol"]))}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        verdict = Verdict.from_setting(th["logit_shift"], "[invariants] logit_shift")

        def judge(v):
            shown = "; ".join(f"+{r['shift']:g}: loss {fmt(r['loss'])} (|Δ| {fmt(r['loss_diff'])}, "
                              f"allowed {r['loss_tolerance']:.2g}), gradient max|Δ| "
                              f"{fmt(r['grad_diff'])} (allowed {r['grad_tolerance']:.2g})"
                              for r in v["rows"])
            what = (f"objective at logits + c vs logits (loss {fmt(v['loss'])}, position weights sum "
                    f"{v['weight_sum']:.3g}, max {v['max_weight']:.3g}): {shown}")
            bad = [r for r in v["rows"] if not r["ok"]]
            att = v.get("attribution") or {}
            if bad and att.get("explained"):
                parts = ", ".join(f"'{n}' (x {w:.3g})" for n, w in zip(att["components"], att["weights"]))
                worst = bad[-1]
                return Verdict.INFO, (what + f"; from +{bad[0]['shift']:g} the total moves (|Δ| "
                                      f"{fmt(worst['loss_diff'])} at +{worst['shift']:g}) and the declared "
                                      f"component {parts} explains it (fit residual {att['residual']:.2g}): "
                                      f"a term on the logit level by design (a z-loss); the task component "
                                      f"'{v['primary']}' is invariant within the rounding of x + c"), \
                    float(bad[0]["shift"])
            if bad:
                overflow = [r for r in bad if not (np.isfinite(r["loss"]) and np.isfinite(r["grad_rel"]))]
                if overflow:
                    why = (f"from +{overflow[0]['shift']:g} the loss or gradient is not finite: the "
                           "softmax overflows (no max subtraction)")
                else:
                    why = (f"from +{bad[0]['shift']:g} beyond the float32 rounding of the shifted "
                           "logits: the objective depends on the absolute logit level"
                           + (f" ({att['why']})" if att.get("why") and v.get("components") else ""))
                return verdict, what + "; " + why, float((overflow or bad)[0]["shift"])
            return Verdict.PASS, what + "; invariant within the rounding of x + c", \
                float(max(r["grad_rel"] for r in v["rows"]))

        return [Condition("OBJ702", "loss_and_gradient_invariant_to_logit_shift", judge)]
