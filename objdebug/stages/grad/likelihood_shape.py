"""OBJ208, likelihood shape: the direction of the logit gradient against a mean cross-entropy's
and the likelihood family's (the numpy float64 reference in likelihood.py)."""

from __future__ import annotations

import math
from typing import Any

from objdebug.core.findings import Check, Condition, Verdict
from objdebug.core.settings import Settings
from objdebug.pipeline.context import Context
from objdebug.pipeline.run_data import logit_gradients, pairing_skip
from objdebug.stages.grad.likelihood import analyse as likelihood_shape


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
