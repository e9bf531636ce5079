"""OBJ304, gradient share: the gradient norm each component alone puts on the shared parameters,
against its share of the loss value."""

from __future__ import annotations

from typing import Any

from objdebug.core.findings import Check, Condition, Verdict
from objdebug.core.settings import Settings
from objdebug.pipeline.context import Context
from objdebug.stages.decompose._common import KINDS, component_values, shared_params
from objdebug.stages.decompose._gradients import measured_gradients


class GradientShare(Check):
    """The gradient norm each component alone puts on the shared parameters, vs its value share."""

    name = "gradient-share"
    stage = "decompose"
    kinds = KINDS

    def skip_reason(self, ctx: Context) -> str | None:
        if not ctx.config.objective.components:
            return "single-term objective: the whole gradient belongs to its one component"
        if not shared_params(ctx):
            return "the target has no trainable parameters"
        return None

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        values = component_values(ctx)
        comps = values["components"]
        batches, g = measured_gradients(ctx, len(comps))
        total = sum(g["norms"])
        rows = [{"name": c["name"], "value_share": c["share"], "grad_norm": n,
                 "grad_share": n / total if total > 0 else float("nan")}
                for c, n in zip(comps, g["norms"])]
        return {"components": rows, "n_batches": len(batches), "batch_rows": ctx.engine.batch_size,
                "length": int(batches[0][0].shape[1]), "n_params": g["n_params"],
                "grad_norm_sum": total, "batch_values": g["batch_values"]}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        hi, lo = th["value_share_high"], th["grad_share_low"]

        def judge(v):
            rows = v["components"]
            if not v["grad_norm_sum"] > 0:
                return Verdict.FAIL, (f"no component puts any gradient on the {v['n_params']} shared "
                                      f"parameters (all norms 0): the objective cannot train the model"), 0.0
            top = max(rows, key=lambda r: r["grad_share"])
            shares = ", ".join(f"{r['name']} value {r['value_share']:.0%} / grad {r['grad_share']:.1%} "
                               f"(|g| {r['grad_norm']:.3g})" for r in rows)
            silent = [r for r in rows if r["value_share"] > hi and r["grad_share"] < lo]
            loud = [r for r in rows if r["grad_share"] > hi and r["value_share"] < lo]
            where = (f"over {v['n_batches']} batch(es) of {v['batch_rows']}x{v['length']}: {shares}; "
                     f"'{top['name']}' dominates the update")
            rule = f"flag value share > {hi:.0%} with grad share < {lo:.0%}, or the reverse"
            if silent:
                names = ", ".join(f"'{r['name']}'" for r in silent)
                return Verdict.FAIL, (f"{names} dominate(s) the loss value but barely move the parameters "
                                      f"(non-differentiable path?) {where}; {rule}"), silent[0]["grad_share"]
            if loud:
                names = ", ".join(f"'{r['name']}'" for r in loud)
                return Verdict.WARN, (f"{names} is a small part of the loss value but steer(s) the update "
                                      f"{where}; {rule}"), loud[0]["grad_share"]
            return Verdict.PASS, f"value and gradient shares agree {where}; {rule}", top["grad_share"]

        return [Condition("OBJ304", f"grad_share_matches_value_share_{hi}_{lo}", judge)]
