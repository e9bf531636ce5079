"""OBJ300-OBJ303, the components over the data: each component's mean, std and share (OBJ300),
a term that is exactly 0 in whole batches (OBJ301), the reconstruction of the total from its
components (OBJ302) and their scale as they enter the total (OBJ303)."""

from __future__ import annotations

import math
from typing import Any

from objdebug.core.findings import Check, Condition, Verdict, band
from objdebug.core.settings import Settings
from objdebug.pipeline.context import Context
from objdebug.stages.decompose._common import KINDS, component_values


class ComponentValues(Check):
    """Each component over the data: mean, std, share; dead terms, reconstruction, scale."""

    name = "components"
    stage = "decompose"
    kinds = KINDS

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        v = dict(component_values(ctx))
        v.pop("per_sample")
        return v

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        dead_warn, dead_fail = th["dead_warn"], th["dead_fail"]
        res_warn, res_fail = th["residual_warn"], th["residual_fail"]
        scale_warn, scale_fail = th["scale_warn"], th["scale_fail"]

        def inventory(v):
            comps = v["components"]
            if v["single_term"]:
                return Verdict.PASS, (f"single-term objective: one component (mean {comps[0]['mean']:.4g} "
                                      f"over {v['n_samples']} samples); nothing to decompose — declare "
                                      f"objective.components for a composite loss"), 1.0
            shown = ", ".join(f"{c['name']} {c['mean']:.4g}±{c['std']:.3g} ({c['share']:.0%})"
                              for c in comps)
            return Verdict.PASS, (f"{len(comps)} components over {v['n_samples']} samples in "
                                  f"{v['n_batches']} batches (mean±std, share of |total|): {shown}"), \
                float(len(comps))

        def dead(v):
            if v["single_term"]:
                return Verdict.SKIP, "single-term objective: no component can be dead on its own", None
            worst = max(v["components"], key=lambda c: c["zero_batch_fraction"])
            x = worst["zero_batch_fraction"]
            verdict = band(x, pass_if=lambda a: a < dead_warn, fail_if=lambda a: a >= dead_fail)
            zeros = [f"{c['name']} {c['zero_batch_fraction']:.0%}" for c in v["components"]
                     if c["zero_batch_fraction"] > 0]
            what = (f"component '{worst['name']}' is exactly 0 in {x:.0%} of {v['n_batches']} batches"
                    + (": its condition never triggered, check the data path" if x >= dead_fail else "")
                    if zeros else f"no component is exactly 0 in any of {v['n_batches']} batches")
            return verdict, (f"{what}" + (f" (zero batches: {', '.join(zeros)})" if zeros else "")
                             + f"; warn >= {dead_warn:.0%}, fail >= {dead_fail:.0%}"), x

        def reconstruction(v):
            if v["single_term"]:
                return Verdict.SKIP, "single-term objective: the total is its only component", None
            r = v["reconstruction"]
            x = r["residual"]
            verdict = band(x, pass_if=lambda a: a <= res_warn, fail_if=lambda a: a > res_fail)
            weights = ", ".join(f"{c['name']} {w:.4g}" for c, w in zip(v["components"], r["weights"]))
            return verdict, (f"least-squares fit total ~ sum w_i c_i over {r['rows']} samples: weights "
                             f"{weights}; relative RMS residual {x:.3g} (plain sum: "
                             f"{r['unit_residual']:.3g}); warn > {res_warn:g}, fail > {res_fail:g}"), x

        def scale(v):
            if v["single_term"]:
                return Verdict.SKIP, "single-term objective: no scale to compare", None
            # the terms as they enter the total: the components themselves when the total is their
            # plain sum; w_i * c_i when only the fitted weights reconstruct it (ce + 1e-3 * z_loss
            # returned with the raw z_loss: 1.27 vs 228 raw, 1.27 vs 0.23 as trained)
            r = v.get("reconstruction") or {}
            ws = r.get("weights") or []
            weighted = (len(ws) == len(v["components"]) and all(math.isfinite(w) for w in ws)
                        and r.get("residual", math.inf) <= res_warn
                        and not r.get("unit_residual", math.inf) <= res_warn)
            terms = [{**c, "term": (w if weighted else 1.0) * c["mean"]}
                     for c, w in zip(v["components"], ws if weighted else [1.0] * len(v["components"]))]
            live = [c for c in terms
                    if c["zero_batch_fraction"] < 1.0 and math.isfinite(c["term"]) and c["term"] != 0]
            if len(live) < 2:
                return Verdict.PASS, (f"{len(live)} live component(s): no scale to compare "
                                      f"(dead terms are judged by OBJ301)"), None
            big = max(live, key=lambda c: abs(c["term"]))
            small = min(live, key=lambda c: abs(c["term"]))
            x = abs(big["term"]) / abs(small["term"])
            verdict = band(x, pass_if=lambda a: a <= scale_warn, fail_if=lambda a: a > scale_fail)
            what = "|weight x mean component| (weights fitted, OBJ302)" if weighted else "|mean component|"
            shown = (lambda c: f"{c['term']:.4g} = {c['term'] / c['mean']:.4g} x {c['mean']:.4g}") if weighted \
                else (lambda c: f"{c['mean']:.4g}")
            return verdict, (f"largest/smallest {what} = {x:.4g} ('{big['name']}' "
                             f"{shown(big)} vs '{small['name']}' {shown(small)}); "
                             f"warn > {scale_warn:g}, fail > {scale_fail:g}"), x

        return [Condition("OBJ300", "components_reported", inventory),
                Condition("OBJ301", f"zero_batch_fraction_less_than_{dead_warn}", dead),
                Condition("OBJ302", f"residual_not_greater_than_{res_warn}", reconstruction),
                Condition("OBJ303", f"scale_ratio_not_greater_than_{scale_warn}", scale)]
