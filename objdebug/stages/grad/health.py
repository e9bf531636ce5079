"""OBJ201-OBJ204, gradient health: per-parameter and per-layer gradient norms, non-finite values
and disconnected parameters, on the causal LM's gradient batch (GradientHealth) and on a
`[task] kind`'s (TaskGradientHealth, the kind's batch from class_weights.py)."""

from __future__ import annotations

import math
from typing import Any

from objdebug.core.findings import Check, Condition, Verdict, band, listing
from objdebug.core.settings import Settings
from objdebug.engine import kinds as task_kinds
from objdebug.engine.gradients import layer_of, max_mean_ratio
from objdebug.pipeline.context import Context
from objdebug.pipeline.run_data import grad_batch, param_gradients
from objdebug.stages.grad._common import _LISTED, _batch_info, _no_params
from objdebug.stages.grad.class_weights import health_measure


class GradientHealth(Check):
    """Per-parameter and per-layer gradient norms, non-finite values and disconnected parameters."""

    name = "gradient-health"
    stage = "grad"
    # At initialisation the output head holds nearly all the gradient and max/mean over P tensors
    # sits near its bound P: the ratio measures the architecture, not the objective (see OBJ201).
    needs_trained = ("OBJ202",)

    def skip_reason(self, ctx: Context) -> str | None:
        return _no_params(ctx)

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        g = param_gradients(ctx)
        norms = g.norms
        params = [{"name": n, "layer": layer_of(n), "size": int(size), "norm": float(norm),
                   "max_abs": float(mx), "zero_share": float(z / size), "nonfinite": int(bad)}
                  for n, size, norm, mx, z, bad in zip(g.names, g.sizes, norms, g.max_abs, g.zeros,
                                                       g.nonfinite)]
        layers: dict[str, dict[str, Any]] = {}
        for p, sq in zip(params, g.sq_norm):
            lay = layers.setdefault(p["layer"], {"layer": p["layer"], "params": 0, "size": 0, "sq": 0.0,
                                                 "max_abs": 0.0, "zeros": 0, "nonfinite": 0})
            lay["params"] += 1
            lay["size"] += p["size"]
            lay["sq"] += float(sq)
            lay["max_abs"] = max(lay["max_abs"], p["max_abs"])
            lay["zeros"] += int(round(p["zero_share"] * p["size"]))
            lay["nonfinite"] += p["nonfinite"]
        layer_rows = [{"layer": v["layer"], "params": v["params"], "norm": math.sqrt(v["sq"]),
                       "max_abs": v["max_abs"], "zero_share": v["zeros"] / v["size"],
                       "nonfinite": v["nonfinite"]} for v in layers.values()]
        ratio, imax, mean = max_mean_ratio(norms)  # over all parameters (OBJ603 takes matrices)
        return {
            "loss": g.loss,
            "outputs": g.outputs.tolist(),
            "batch": _batch_info(ctx, grad_batch(ctx)),
            "n_params": len(params),
            "global_norm": float(math.sqrt(g.sq_norm.sum())),
            "mean_param_norm": mean,
            "max_param_norm": float(norms[imax]),
            "max_param": g.names[imax],
            "max_mean_ratio": ratio if mean > 0 else float("inf"),
            "nonfinite_total": int(g.nonfinite.sum()),
            "nonfinite_params": [p["name"] for p in params if p["nonfinite"]],
            "disconnected": [p["name"] for p in params if p["zero_share"] == 1.0],
            "params": params,
            "layers": layer_rows,
        }

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        lo_pass, hi_pass = th["mean_norm_pass_low"], th["mean_norm_pass_high"]
        lo_fail, hi_fail = th["mean_norm_fail_low"], th["mean_norm_fail_high"]
        r_pass, r_fail = th["ratio_pass"], th["ratio_fail"]

        def unjudged(v):
            if v["nonfinite_total"] or not math.isfinite(v["loss"]):
                return (Verdict.SKIP, f"not judged: the gradient has {v['nonfinite_total']} NaN/Inf "
                                      f"elements (loss {v['loss']:.4g}), see OBJ203", None)
            return None

        def mean_norm(v):
            x = v["mean_param_norm"]
            verdict = band(x, pass_if=lambda a: lo_pass <= a <= hi_pass,
                           fail_if=lambda a: a < lo_fail or a > hi_fail)
            return unjudged(v) or (verdict, (
                f"mean per-parameter gradient norm = {x:.4g} over {v['n_params']} parameters (global "
                f"norm {v['global_norm']:.4g}, loss {v['loss']:.4g}); pass in [{lo_pass}, {hi_pass}], "
                f"fail < {lo_fail} or > {hi_fail}"), x)

        def ratio(v):
            x = v["max_mean_ratio"]
            verdict = band(x, pass_if=lambda a: a < r_pass, fail_if=lambda a: a > r_fail)
            return unjudged(v) or (verdict, (
                f"max/mean per-parameter gradient norm = {x:.3g} (max {v['max_param_norm']:.4g} at "
                f"'{v['max_param']}', mean {v['mean_param_norm']:.4g}); pass < {r_pass}, "
                f"fail > {r_fail}"), x)

        def finite(v):
            n, names = v["nonfinite_total"], v["nonfinite_params"]
            if n or not math.isfinite(v["loss"]):
                return Verdict.FAIL, (f"loss = {v['loss']:.4g}; {n} NaN/Inf gradient elements in "
                                      f"{len(names)} of {v['n_params']} parameters"
                                      + (f": {listing(names, _LISTED)}" if names else "")), float(n)
            return Verdict.PASS, (f"loss {v['loss']:.4g} and all gradients of {v['n_params']} "
                                  f"parameters finite"), 0.0

        def connected(v):
            names = v["disconnected"]
            if names:
                return Verdict.FAIL, (
                    f"{len(names)} of {v['n_params']} parameters get an all-zero gradient "
                    f"(disconnected from the loss: argmax, stop_gradient or unused): {listing(names, _LISTED)}"
                ), float(len(names))
            return Verdict.PASS, f"all {v['n_params']} parameters receive gradient", 0.0

        return [Condition("OBJ201", f"mean_grad_norm_in_{lo_pass}_{hi_pass}", mean_norm),
                Condition("OBJ202", f"max_mean_ratio_less_than_{r_pass}", ratio),
                Condition("OBJ203", "gradients_finite", finite),
                Condition("OBJ204", "no_disconnected_parameters", connected)]


class TaskGradientHealth(GradientHealth):
    """OBJ201-OBJ204 on a `[task] kind`'s gradient batch (issue 47): the same measurement and
    conditions, the batch and gradient of the kind (stages/grad/class_weights.py)."""

    name = "task-gradient-health"  # the rule pages of OBJ201-OBJ204 name both
    kinds = task_kinds.labelled()
    needs_trained = ()  # the causal LM's model-state measurement does not apply to these shapes

    def skip_reason(self, ctx: Context) -> str | None:
        return _no_params(ctx)

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        return health_measure(ctx, th)

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        conds = super().conditions(th)
        factor = float(th["kind_reference_factor"])
        band_judge = conds[0].judge

        def mean_norm(v):
            """The band, unless the plain cross-entropy's gradient on the same model and batch is
            out of it too: a backbone's gradient scale (its depth, its norms) is the model's nature,
            not the objective's, and every correct loss of the kind shares it (a note)."""
            verdict, msg, x = band_judge(v)
            ref = v.get("reference_mean_param_norm")
            if not ref or verdict in (Verdict.SKIP, Verdict.PASS):
                return verdict, msg, x
            said = (f"; a plain mean cross-entropy on the same model and batch gives {ref:.4g} (x{x / ref:.3g};"
                    f" numpy float64 reference cotangent through the same model.vjp)")
            if 1.0 / factor <= x / ref <= factor:
                return Verdict.INFO, msg + said + ": the model's gradient scale, not the objective's", x
            return verdict, msg + said, x

        return [Condition(conds[0].code, conds[0].name, mean_norm, conds[0].locate)] + conds[1:]
