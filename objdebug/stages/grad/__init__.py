"""Stage 2, grad: one real forward + backward of the user's objective on a batch of the target's data.

The batch total is the objective called as the user calls it (flat / sequence / end-to-end); its
gradients are reduced inside the compiled graph (see objdebug/engine/gradients.py). Codes OBJ2xx:

- OBJ201 mean per-parameter gradient norm out of range, OBJ202 max/mean norm imbalance,
  OBJ203 NaN/Inf gradients, OBJ204 disconnected (all-zero) parameters;
- OBJ205 padding / prompt positions (label == label_pad_id) receive gradient;
- OBJ209 supervised positions get no gradient (dropped supervision), OBJ210 the label contract
  (data side, with one row's table): supervision.py beside this module;
- OBJ206 autodiff disagrees with central finite differences of the real objective;
- OBJ207 logit-gradient scale differs from a standard mean cross-entropy (reference);
- OBJ208 logit-gradient direction is not a likelihood's (see objdebug/stages/grad/likelihood.py).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.core.findings import Check, Condition, Verdict, band, listing
from objdebug.core.settings import Settings
from objdebug.engine.gradients import Batch, layer_of, max_mean_ratio
from objdebug.pipeline.context import Context
from objdebug.pipeline.run_data import (fd_directions, grad_batch, grad_probe, logit_checks_skip,
                                        logit_gradients, pairing_skip, param_gradients)
from objdebug.stages.grad.likelihood import analyse as likelihood_shape
from objdebug.stages.grad.supervision import SupervisionCoverage
from objdebug.stages.grad.class_weights import ClassWeights, IgnoredLabel, health_measure
from objdebug.stages.grad.crf import CRFChecks
from objdebug.stages.grad.contrastive import Contrastive
from objdebug.engine import kinds as task_kinds

_LISTED = 8
_F32_EPS = 2.0 ** -23


def _settings(ctx: Context) -> Settings:
    return ctx.profile.section("grad")


_NO_PARAMS = "the target has no trainable parameters: there are no parameter gradients to measure"


def _no_params(ctx: Context) -> str | None:
    """SKIP reason for the checks that differentiate w.r.t. the parameters."""
    return None if ctx.target.trainable_params() else _NO_PARAMS


def _batch_info(ctx: Context, batch: Batch) -> dict[str, Any]:
    pid = ctx.engine.padding.label_pad_id
    masked = (batch.labels == pid) | (batch.labels < 0)  # a pipeline's batch: -100 and its pad id
    return {"rows": int(batch.input_ids.shape[0]), "length": int(batch.input_ids.shape[1]),
            "data_rows": len(batch.samples), "filled_rows": batch.filled,
            "scored_positions": int((~masked).sum()), "masked_positions": int(masked.sum())}


# --------------------------------------------------------------------------- checks
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


class FiniteDifferences(Check):
    """Directional derivative g.d (autodiff) vs central finite differences of the real objective.

    float32 makes a naive comparison noisy in two ways, handled here without loosening the pass
    line: a random unit direction's g.d is |g|/sqrt(P) on average and can be near 0, where a
    tiny absolute error is a large relative one; and the difference of two float32 losses carries
    rounding noise ~ ulp(L)/ε while a large ε adds curvature error ~ ε². So:

    - the normalized gradient g/|g| is always the first direction: its derivative |g| is the
      largest of any unit direction, far above rounding noise, and a backward with the wrong
      scale or sign shows its full error there;
    - random directions (they see errors the gradient direction cannot: a backward that drops
      a part of the gradient) are judged on the scale of a typical random direction,
      |FD - g.d| / max(|g.d|, |FD|, |g|/sqrt(P), rounding floor);
    - each direction is differenced at a few steps (along the gradient: ε|g| = f|L| for f in
      `fd_gradient_steps`; along random directions: ε = step * ||θ|| for `fd_rel_steps`) and
      Richardson-extrapolated over consecutive steps (the ε² curvature term cancels); the
      candidate that agrees best counts, because a wrong backward disagrees with every one.
    """

    name = "finite-differences"
    stage = "grad"

    def skip_reason(self, ctx: Context) -> str | None:
        from objdebug.engine import precision

        if precision.enabled(ctx.config):  # [run] amp_level: rounding swamps the differences
            return precision.FD_SKIP
        return _no_params(ctx)

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        probe, batch = grad_probe(ctx), grad_batch(ctx)
        g = param_gradients(ctx)
        random_dirs = fd_directions(ctx)
        finite = bool(math.isfinite(g.loss) and not g.nonfinite.any())
        if not finite:
            return {"loss": g.loss, "finite": False, "n_directions": 0, "directions": [],
                    "max_rel_error": float("nan")}
        gnorm = float(np.sqrt(g.sq_norm.sum()))
        n_elements = int(g.sizes.sum())
        typical = gnorm / math.sqrt(n_elements)  # RMS of g.d over random unit directions
        ulps = float(th["fd_noise_ulps"])
        loss_scale = max(abs(g.loss), 1e-6)
        directions = []  # (label, moving arrays, index, autodiff g.d, steps)
        rows = []
        # the parameters go to the host once for all 2 x directions x steps evaluations and are
        # restored once, bit for bit, at the end (or on an error)
        with probe.saved_parameters() as saved:
            theta = probe.parameter_norm(saved)
            # random directions: steps relative to the parameter norm (their derivative is small;
            # the curvature along them sets the scale)
            steps = sorted(float(x) * (theta if theta > 0 else 1.0)
                           for x in th["fd_rel_steps"])
            # the gradient direction: steps that change the loss by a fixed small share to first
            # order, ε|g| = f|L|. A parameter-relative step is far too long there on a confident
            # model (the demo: |L| = 0.002, |g| = 0.17, ε = 3e-4 ||θ|| = 0.011 moves the loss by
            # 80% of itself and the FD is 12% off)
            grad_steps = sorted(float(f) * loss_scale / gnorm
                                for f in th["fd_gradient_steps"]) if gnorm > 0 else []
            if gnorm > 0:
                directions.append(("gradient", probe.gradient_direction(g), 0, gnorm, grad_steps))
            directions += [(f"random {k}", random_dirs, k, float(g.gdot[k]), steps)
                           for k in range(len(g.gdot))]
            for label, dirs, k, ad, eps_list in directions:
                diffs = []
                for eps in eps_list:
                    plus = probe.loss_at(batch, dirs, eps, k, saved)
                    minus = probe.loss_at(batch, dirs, -eps, k, saved)
                    diffs.append((plus - minus) / (2 * eps))
                # below this the float32 difference of two losses cannot resolve a derivative
                floors = [ulps * _F32_EPS * max(abs(g.loss), 1.0) / (2 * eps) for eps in eps_list]
                candidates = [(f"ε={eps:.2g}", fd, floor) for eps, fd, floor in zip(eps_list, diffs, floors)]
                for i in range(len(eps_list) - 1):
                    r2 = (eps_list[i + 1] / eps_list[i]) ** 2  # D(ε) = g.d + c ε² + O(ε⁴): cancel c ε²
                    rich = (r2 * diffs[i] - diffs[i + 1]) / (r2 - 1)
                    candidates.append((f"Richardson ε={eps_list[i]:.2g},{eps_list[i + 1]:.2g}", rich,
                                       floors[i]))
                best: dict[str, Any] | None = None
                for how, fd, floor in candidates:
                    scale = max(abs(fd), abs(ad), typical, floor)
                    err = abs(fd - ad) / scale if math.isfinite(fd) and math.isfinite(ad) else float("nan")
                    if best is None or not err >= best["rel_error"]:  # NaN never replaces a number
                        best = {"direction": label, "autodiff": ad, "finite_difference": fd,
                                "rel_error": err, "method": how}
                best["epsilons"] = eps_list
                best["differences"] = diffs
                rows.append(best)
        errs = [r["rel_error"] for r in rows]
        return {"loss": g.loss, "finite": True, "n_directions": len(rows), "epsilons": steps,
                "gradient_epsilons": grad_steps,
                "parameter_norm": theta, "gradient_norm": gnorm, "typical_gdot": typical,
                "n_elements": n_elements, "seed": int(th["seed"]),
                # np.max propagates NaN (builtin max() keeps whatever came first)
                "max_rel_error": float(np.max(errs)) if errs else float("nan"), "directions": rows}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        e_pass, e_fail = th["fd_pass"], th["fd_fail"]

        def judge(v):
            if not v["finite"]:
                return Verdict.SKIP, (f"not judged: the loss ({v['loss']:.4g}) or its gradient is "
                                      "not finite, see OBJ203"), None
            x = v["max_rel_error"]
            verdict = band(x, pass_if=lambda a: a < e_pass, fail_if=lambda a: a > e_fail)
            worst = max(v["directions"], key=lambda r: r["rel_error"] if math.isfinite(r["rel_error"])
                        else float("inf"))
            pairs = "; ".join(f"{r['autodiff']:.4g} vs {r['finite_difference']:.4g}"
                              for r in v["directions"])
            rounding = (f", counted beyond what the loss's measured float32 rounding "
                        f"({v['rounding_noise']:.2g}) does to a difference quotient"
                        if "rounding_noise" in v else "")  # the task kinds' (task_fd.py)
            return verdict, (
                f"autodiff vs central finite differences along "
                f"{'the gradient direction and ' if v['directions'][0]['direction'] == 'gradient' else ''}"
                f"{sum(r['direction'] != 'gradient' for r in v['directions'])} random directions "
                f"(ε = {', '.join(f'{e:.2g}' for e in v['gradient_epsilons'])} along the gradient, "
                f"{', '.join(f'{e:.2g}' for e in v['epsilons'])} along random ones, each pair also "
                f"Richardson-extrapolated, best agreement; "
                f"random directions on the scale |g|/sqrt(P) = {v['typical_gdot']:.3g}): max relative "
                f"error {x:.2g}{rounding} ({worst['direction']}, {worst['method']}; g·d vs FD: {pairs}); "
                f"pass < {e_pass}, fail > {e_fail}"), x

        return [Condition("OBJ206", f"fd_rel_error_less_than_{e_pass}", judge)]


class LikelihoodShape(Check):
    """Direction of the logit gradient vs a mean cross-entropy's (numpy float64 reference)."""

    name = "likelihood-shape"
    stage = "grad"

    def skip_reason(self, ctx: Context) -> str | None:
        return pairing_skip(ctx)

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        lg = logit_gradients(ctx)
        v = likelihood_shape(lg["grad"], lg["logits"], lg["labels"], ctx.engine.padding.label_pad_id,
                             band=float(th["likelihood_weight_band"]),
                             max_smoothing=float(th["likelihood_max_smoothing"]),
                             max_entropy=float(th["likelihood_max_entropy"]),
                             cosine_min=float(th["likelihood_cosine_pass"]),
                             reweighted_max=float(th["likelihood_reweighted_pass"]),
                             max_zloss=float(th["likelihood_max_zloss"]))
        return {**v, "loss": float(lg["outputs"][0]), "rows": int(lg["labels"].shape[0])}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        c_pass, c_fail = th["likelihood_cosine_pass"], th["likelihood_cosine_fail"]
        w_pass, w_fail = th["likelihood_reweighted_pass"], th["likelihood_reweighted_fail"]

        def judge(v):
            shape = v["shape"]
            if shape == "no scored tokens":
                return Verdict.SKIP, "not judged: the gradient batch has no scored token", None
            if shape == "non-finite gradient":
                return Verdict.SKIP, (f"not judged: {v['nonfinite']} NaN/Inf logit-gradient elements "
                                      f"(loss {v['loss']:.4g}), see OBJ203"), None
            if shape == "no gradient":
                return Verdict.FAIL, (f"looks like: no gradient — the objective's gradient w.r.t. the "
                                      f"logits is exactly 0 at all {v['scored_tokens']} scored tokens "
                                      f"(argmax, a hard threshold or stop_gradient in the loss path)"), 0.0
            x, rw, co = v["cosine_family"], v["reweighted_share"], v["coefficients"]
            pt = v["per_token"]
            numbers = (f"cosine with a mean cross-entropy's gradient (reference, {v['scored_tokens']} scored "
                       f"tokens) {v['cosine_ce']:.4f} overall, per token median {pt['median']:.4f} / "
                       f"10th percentile {pt['p10']:.4f}; best likelihood fit (CE + label smoothing <= "
                       f"{th['likelihood_max_smoothing']:g} + entropy |λ| <= "
                       f"{th['likelihood_max_entropy']:g} + z-loss w <= {th['likelihood_max_zloss']:g}: ε "
                       f"{v['smoothing']:.3g}, λ {v['entropy_weight']:.3g}, w {v['z_loss_weight']:.3g}) "
                       f"cosine {x:.4f}; {rw:.0%} of tokens weighted "
                       f"outside [1/{v['band']:g}, {v['band']:g}]x that fit (label probability median "
                       f"{v['label_probability']['median']:.3g})")
            rule = (f"pass: fit cosine >= {c_pass:g} and re-weighted <= {w_pass:.0%}; fail: cosine < "
                    f"{c_fail:g} or re-weighted > {w_fail:.0%}")
            if not co["ce"] > 0:
                return Verdict.FAIL, f"looks like: {shape}; {numbers}; {rule}", x
            ok = x >= c_pass and not rw > w_pass
            bad = x < c_fail or rw > w_fail or not math.isfinite(x)
            verdict = Verdict.PASS if ok else Verdict.FAIL if bad else Verdict.WARN
            return verdict, f"looks like: {shape}; {numbers}; {rule}", x

        return [Condition("OBJ208", f"likelihood_cosine_at_least_{c_pass}", judge)]


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


class TaskFiniteDifferences(FiniteDifferences):
    """OBJ206 on a `[task] kind`'s gradient batch (issue 47): the same measurement and conditions,
    the kind's gradient and losses (stages/grad/task_fd.py)."""

    name = "task-finite-differences"  # the rule page of OBJ206 names both
    kinds = task_kinds.tasks()

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        from objdebug.stages.grad import task_fd

        return task_fd.measure(ctx, th)


def checks() -> list[Check]:
    return [GradientHealth(), PaddingLeakage(), SupervisionCoverage(), LogitGradientScale(),
            FiniteDifferences(), LikelihoodShape(),
            TaskGradientHealth(), TaskFiniteDifferences(), ClassWeights(), IgnoredLabel(), CRFChecks(), Contrastive()]  # [task] kinds (issue 47)
