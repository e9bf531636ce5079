"""OBJ305, primary share: the primary (task) component's share of the total's gradient, with
the components' effective weights, and the factor on the auxiliary weights that restores it."""

from __future__ import annotations

import math
from typing import Any

from objdebug.core.findings import Check, Condition, Verdict, band
from objdebug.core.settings import Settings
from objdebug.pipeline.context import Context
from objdebug.stages.decompose._common import KINDS, component_values
from objdebug.stages.decompose._gradients import measured_gradients
from objdebug.stages.decompose.gradient_share import GradientShare


def primary_name(ctx: Context, names: list[str]) -> str:
    """The task component: [objective] primary, else the first declared component."""
    return ctx.config.objective.primary or names[0]


def rebalance_factor(primary: float, secondary: float, target: float) -> float:
    """Factor on every secondary weight that gives the primary `target` of the gradient sum."""
    if secondary <= 0 or not 0 < target < 1:
        return float("nan")
    return primary * (1 - target) / (target * secondary)


class PrimaryShare(Check):
    """The primary (task) component's share of the total's gradient, with effective weights."""

    name = "primary-share"
    stage = "decompose"
    kinds = KINDS

    def skip_reason(self, ctx: Context) -> str | None:
        return GradientShare().skip_reason(ctx)

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        values = component_values(ctx)
        comps = values["components"]
        names = [c["name"] for c in comps]
        batches, g = measured_gradients(ctx, len(comps))
        # A component enters the total as w_i * c_i: its part of the total's gradient is
        # |w_i| * |grad c_i|. w comes from the least-squares reconstruction (a "ce - 0.1 * entropy"
        # returned as (total, ce, entropy) has w = (1, -0.1)); where the components do not
        # reconstruct the total (OBJ302), they are taken as added (w = 1).
        rec = values["reconstruction"] or {}
        fitted = (rec.get("weights") and len(rec["weights"]) == len(comps)
                  and rec.get("rank") == len(comps)
                  and rec.get("residual", math.inf) <= float(th["residual_fail"]))
        weights = [float(w) for w in rec["weights"]] if fitted else [1.0] * len(comps)
        contrib = [abs(w) * n for w, n in zip(weights, g["norms"])]
        total = sum(contrib)
        primary = primary_name(ctx, names)
        k = names.index(primary)
        rows = [{"name": nm, "weight": w, "grad_norm": n, "contribution": c,
                 "share": c / total if total > 0 else float("nan")}
                for nm, w, n, c in zip(names, weights, g["norms"], contrib)]
        secondary = total - contrib[k]
        target = float(th["primary_share_target"])
        factor = rebalance_factor(contrib[k], secondary, target)
        return {"primary": primary, "components": rows, "weights_from": "fit" if fitted else "as added",
                "primary_share": rows[k]["share"], "contribution_sum": total,
                "n_batches": len(batches), "batch_rows": ctx.engine.batch_size,
                "length": int(batches[0][0].shape[1]), "target_share": target,
                "rebalance_factor": factor,
                "rebalanced_weights": {r["name"]: (r["weight"] if r["name"] == primary
                                                   else r["weight"] * factor) for r in rows}}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        warn, fail = th["primary_share_warn"], th["primary_share_fail"]

        def judge(v):
            rows = v["components"]
            if not v["contribution_sum"] > 0:
                return Verdict.SKIP, "no component puts any gradient on the model (see OBJ304)", None
            x = v["primary_share"]
            top = max((r for r in rows if r["name"] != v["primary"]), key=lambda r: r["share"])
            shares = ", ".join(f"{r['name']} {r['share']:.1%} (|w| {abs(r['weight']):.3g} x |g| "
                               f"{r['grad_norm']:.3g})" for r in rows)
            where = (f"share of the total's gradient, |w_i|·|∇c_i| with w from the "
                     f"{'least-squares fit of the total' if v['weights_from'] == 'fit' else 'components as added'}"
                     f", over {v['n_batches']} batch(es) of {v['batch_rows']}x{v['length']}: {shares}")
            rule = f"primary '{v['primary']}' share: pass >= {warn:.0%}, fail < {fail:.0%}"
            verdict = band(x, pass_if=lambda a: a >= warn, fail_if=lambda a: a < fail)
            if verdict is Verdict.PASS:
                return verdict, f"primary '{v['primary']}' gets {x:.1%} {where}; {rule}", x
            f = v["rebalance_factor"]
            new = ", ".join(f"{n} {w:.3g}" for n, w in v["rebalanced_weights"].items())
            fix = (f"multiply the auxiliary weights by {f:.3g} (weights {new}) to give "
                   f"'{v['primary']}' {v['target_share']:.0%} of the gradient") if math.isfinite(f) else ""
            return verdict, (f"'{top['name']}' takes {top['share']:.1%} of the gradient while the primary "
                             f"'{v['primary']}' gets {x:.1%} (the multi-task seesaw) {where}; {fix}; {rule}"), x

        return [Condition("OBJ305", f"primary_share_at_least_{warn}", judge)]
