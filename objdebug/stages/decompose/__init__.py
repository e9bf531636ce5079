"""Stage 4, decompose: the components of a composite objective (total, c1, c2, ...).

Values come from the user's objective run per sample over the data (`engine.evaluate`); a batch
is one engine batch (same bucket grouping, padding rows excluded). Gradient shares come from
sum_i w_i * c_i, differentiated w.r.t. the model's trainable parameters and called with one-hot
`w`: one compile for K components (split form: the objective's weighted logit gradient and the
model's shared VJP, `_component_grad`). Codes OBJ3xx.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.pipeline.context import Context
from objdebug.engine.data import Sample
from objdebug.pipeline.datasets import text_samples
from objdebug.core.errors import InputError
from objdebug.core.findings import Check, Condition, Verdict, band
from objdebug.core.settings import Settings
from objdebug.stages.decompose import task_terms

KINDS = ("causal-lm", "classification", "tagging", "embedding")  # the others through task_terms.py
GRAPH_NAME = "decompose.component_grad"
LOGIT_GRAPH_NAME = "decompose.component_logit_grad"


# --------------------------------------------------------------------------- measurement
def _samples(ctx: Context) -> list[Sample]:
    th = ctx.profile.section("decompose")
    n = ctx.options.samples or th["max_samples"] or None
    return text_samples(ctx, n)


def engine_batches(ctx: Context, samples: list[Sample]) -> list[list[int]]:
    """Sample indices per engine batch: the engine's own batches, without filler rows."""
    return [b.index for b in ctx.engine.batches(samples)]


def component_names(ctx: Context, n_components: int) -> list[str]:
    """Declared names for the outputs after the total; a count mismatch is a config error."""
    declared = list(ctx.config.objective.components)
    if n_components == 0 and not declared:
        return ["total"]
    if n_components != len(declared):
        raise InputError(f"For 'objective.components', the names must match the objective's outputs "
                         f"after the total ({n_components}), but got {len(declared)}: {declared}.",
                         source=ctx.config.source)
    return declared


def component_values(ctx: Context) -> dict[str, Any]:
    """Per-component statistics over the data (cached: both checks of this stage use them)."""
    def build() -> dict[str, Any]:
        if task_terms.is_task(ctx):  # the kind's rows, one at a time (task_terms.py)
            measured = task_terms.values(ctx)
            out, batches, samples = measured["out"], measured["batches"], measured["out"]
        else:
            samples = _samples(ctx)
            out = ctx.engine.evaluate(samples, label="decompose: components")
            batches = engine_batches(ctx, samples)
        k = out.shape[1] - 1
        names = component_names(ctx, k)
        total = out[:, 0]
        comps = out[:, 1:] if k else out[:, :1]
        means = np.array([np.mean(comps[:, j]) for j in range(comps.shape[1])])
        denom = float(np.sum(np.abs(means)))
        stats = []
        for j, name in enumerate(names):
            col = comps[:, j]
            zero_batches = sum(1 for b in batches if np.all(col[b] == 0.0))
            stats.append({
                "name": name, "mean": float(means[j]), "std": float(np.std(col)),
                "min": float(np.min(col)), "max": float(np.max(col)),
                "share": float(abs(means[j]) / denom) if denom > 0 else float("nan"),
                "zero_batch_fraction": zero_batches / len(batches),
                "zero_sample_fraction": float(np.mean(col == 0.0)),
                "nonfinite": int(np.sum(~np.isfinite(col))),
            })
        return {"n_samples": len(samples), "n_batches": len(batches), "single_term": k == 0,
                "components": stats, "total_mean": float(np.mean(total)),
                "reconstruction": _reconstruction(total, comps) if k else None,
                "per_sample": out}
    return ctx.provide(component_values, build)


def _reconstruction(total: np.ndarray, comps: np.ndarray) -> dict[str, Any]:
    """Least-squares weights w with total ~ comps @ w, and the relative RMS residual."""
    ok = np.all(np.isfinite(comps), axis=1) & np.isfinite(total)
    t, c = total[ok], comps[ok]
    if len(t) == 0:
        return {"weights": [], "residual": float("nan"), "unit_residual": float("nan"),
                "rank": 0, "rows": 0}
    weights, _, rank, _ = np.linalg.lstsq(c, t, rcond=None)
    scale = max(float(np.sqrt(np.mean(t ** 2))), 1e-30)
    rel = float(np.sqrt(np.mean((t - c @ weights) ** 2)) / scale)
    unit = float(np.sqrt(np.mean((t - c.sum(axis=1)) ** 2)) / scale)
    return {"weights": [float(w) for w in weights], "residual": rel, "unit_residual": unit,
            "rank": int(rank), "rows": int(len(t))}


def _build_weighted_grad(ctx: Context):
    """One Cell: (input_ids, labels, w) -> ((sum_i w_i c_i, components), grads wrt model params):
    the engine's gradient family (`ObjectiveGradient`) on a weighted total."""
    from mindspore import nn

    from objdebug.engine.cells import BatchObjective
    from objdebug.engine.gradients import ObjectiveGradient

    class WeightedComponents(nn.Cell):
        def __init__(self, target):
            super().__init__(auto_prefix=False)  # keep the user's parameter names
            self.batch = BatchObjective(target)

        def construct(self, input_ids, labels, w):
            _, outputs = self.batch(input_ids, labels)
            comps = outputs[1:]
            return (comps * w).sum(), comps

    return ObjectiveGradient(WeightedComponents(ctx.target), shared_params(ctx))


def shared_params(ctx: Context) -> list:
    """Parameters every component can reach: the model's (the network's in end-to-end form)."""
    return list(ctx.target.network.trainable_params())


def gradient_batches(ctx: Context, samples: list[Sample], n_batches: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Up to n_batches engine batches at ONE bucket length (one graph), short ones filled."""
    chosen = samples[:max(1, n_batches) * ctx.engine.batch_size]
    length = ctx.engine.bucket(max(s.length for s in chosen))
    return [(b.input_ids, b.labels) for b in ctx.engine.batches(chosen, length)]


def _build_weighted_logit_grad(ctx: Context):
    """(logits, labels, w) -> (components, d(sum_i w_i c_i) / d logits): the objective alone."""
    import mindspore as ms
    from mindspore import nn

    from objdebug.engine.cells import as_outputs, call_on_logits

    class WeightedLogitGrad(nn.Cell):
        def __init__(self, objective, flat):
            super().__init__(auto_prefix=False)
            self.objective = objective
            self.flat = flat
            self.grad_fn = ms.value_and_grad(self._weighted, 0, None, has_aux=True)

        def _weighted(self, logits, labels, w):
            _, outputs = as_outputs(call_on_logits(self.objective, self.flat, logits, labels))
            comps = outputs[1:]
            return (comps * w).sum(), comps

        def construct(self, logits, labels, w):
            (_, comps), g = self.grad_fn(logits, labels, w)
            return comps, g

    return WeightedLogitGrad(ctx.target.objective, ctx.config.objective.call == "flat")


def _component_grad(ctx: Context, ids: np.ndarray, labels: np.ndarray, w: np.ndarray):
    """(components float32[K], gradients) of sum_i w_i c_i on one batch.

    Split form (engine/gradients.py `vjp_applies`): the objective's weighted logit gradient
    (`decompose.component_logit_grad`, the objective alone, dynamic shapes) and the model's
    VJP (`model.vjp`, shared with every other parameter gradient of the run); otherwise one
    graph of model + objective (`decompose.component_grad`)."""
    import mindspore as ms

    from objdebug.engine import dynamic_graph
    from objdebug.engine.gradients import model_vjp, vjp_applies

    x, y = ms.Tensor(ids, ms.int32), ms.Tensor(labels, ms.int32)
    if vjp_applies(ctx.target):
        logits = ctx.engine.forward(x)
        if logits.dtype == ms.float32:
            comps, g = dynamic_graph.call(
                ctx.engine, LOGIT_GRAPH_NAME, lambda: _build_weighted_logit_grad(ctx),
                (ms.Tensor(shape=[None, None, logits.shape[-1]], dtype=ms.float32),
                 ms.Tensor(shape=[None, None], dtype=ms.int32), ms.Tensor(shape=[None], dtype=ms.float32)),
                logits, y, ms.Tensor(w))
            return comps, model_vjp(ctx.engine, ctx.target, x, g)[1]
    cell = ctx.engine.cell(GRAPH_NAME, lambda: _build_weighted_grad(ctx))
    (_, comps), grads = ctx.engine.call(GRAPH_NAME, cell, x, y, ms.Tensor(w))
    return comps, grads


def component_gradients(ctx: Context, n_components: int, batches) -> dict[str, Any]:
    """Norm of each component's mean gradient over `batches` (float64 accumulation)."""
    task = task_terms.is_task(ctx)
    params = task_terms.params(ctx) if task else shared_params(ctx)
    sums = [[np.zeros(p.shape, np.float64) for p in params] for _ in range(n_components)]
    values = np.zeros((n_components, len(batches)))
    for b, batch in enumerate(batches):
        for k in range(n_components):
            w = np.zeros(n_components, np.float32)
            w[k] = 1.0
            if task:  # the kind's graphs (task_terms.py): numpy already
                comps, grads = task_terms.component_grad(ctx, batch, w)
            else:
                comps, grads = _component_grad(ctx, *batch, w)
                comps, grads = comps.asnumpy(), [g.asnumpy() for g in grads]
            values[k, b] = float(comps[k])
            for acc, g in zip(sums[k], grads):
                acc += g.astype(np.float64)
    norms = []
    for k in range(n_components):
        sq = sum(float(np.sum((acc / len(batches)) ** 2)) for acc in sums[k])
        norms.append(math.sqrt(sq))
    return {"norms": norms, "batch_values": values.tolist(), "n_params": len(params)}


def measured_gradients(ctx: Context, n_components: int):
    """(batches, component_gradients): computed once, shared by OBJ304 and OBJ305."""
    def build():
        th = ctx.profile.section("decompose")
        if task_terms.is_task(ctx):
            batches = task_terms.gradient_batches(ctx, task_terms.rows(ctx), int(th["grad_batches"]))
        else:
            batches = gradient_batches(ctx, _samples(ctx), int(th["grad_batches"]))
        return batches, component_gradients(ctx, n_components, batches)
    return ctx.provide(measured_gradients, build)


def primary_name(ctx: Context, names: list[str]) -> str:
    """The task component: [objective] primary, else the first declared component."""
    return ctx.config.objective.primary or names[0]


def rebalance_factor(primary: float, secondary: float, target: float) -> float:
    """Factor on every secondary weight that gives the primary `target` of the gradient sum."""
    if secondary <= 0 or not 0 < target < 1:
        return float("nan")
    return primary * (1 - target) / (target * secondary)


# --------------------------------------------------------------------------- checks
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


def checks() -> list[Check]:
    return [ComponentValues(), GradientShare(), PrimaryShare()]
