"""OBJ821 / OBJ829: the KL estimator measured (k1 / k2 / k3 from the loss at the reference moved by
+-1 and +-0.5 nats), its sign and direction.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.core.findings import Condition, Verdict
from objdebug.core.settings import Settings
from objdebug.pipeline.context import Context
from objdebug.stages.policy._common import ESTIMATORS, DELTAS, _base
from objdebug.stages.policy.base import PolicyCheck
from objdebug.stages.policy.session import BETA_KEYS, read_token_gradients, session


class KLEstimator(PolicyCheck):
    """The KL term's estimator from the loss at the reference moved by delta nats per token."""

    name = "policy-kl-estimator"

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        s = session(ctx)
        b = s.batches[0]
        logits = _base(s, b)["logits"]
        zero = np.zeros(len(b.ids))
        losses = {d: s.point(b, logits, adv=zero, delta=d)["loss"] for d in DELTAS}
        grads = {}
        for d in (0.5, -0.5):
            out = s.point(b, logits, adv=zero, delta=d)
            g = read_token_gradients(out["dlogits"], logits, b.ids, b.mask)["g"][b.mask]
            grads[d] = float(np.mean(g)) if g.size else 0.0
        l1 = losses[1.0]
        tol = float(th["kl_ratio_tolerance"])
        best, err = None, math.inf
        if abs(l1) > float(th["zero_loss_tolerance"]) and math.isfinite(l1):
            got = np.array([losses[d] / l1 for d in DELTAS[1:]])
            for name, fn in ESTIMATORS.items():
                want = np.array([fn(d) / fn(1.0) for d in DELTAS[1:]])
                e = float(np.max(np.abs(got - want)))
                if e < err:
                    best, err = name, e
        kind = "none" if best is None else (best if err <= tol else "unknown")
        return {"losses": {str(d): losses[d] for d in DELTAS}, "estimator": kind, "closest": best,
                "ratio_error": err if best else None, "sign": (1 if l1 > 0 else -1) if kind != "none" else 0,
                "grad_mean_plus": grads[0.5], "grad_mean_minus": grads[-0.5], "beta": (s.setting(BETA_KEYS) or (None, None))[1]}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        def estimator(v):
            L = v["losses"]
            what = (f"loss at advantages 0, on-policy, reference := policy - delta per completion token: "
                    f"L(+1) {L['1.0']:.5g}, L(-1) {L['-1.0']:.5g}, L(+0.5) {L['0.5']:.5g}, L(-0.5) {L['-0.5']:.5g}")
            kind = v["estimator"]
            if kind == "none":
                if v["beta"]:
                    return Verdict.FAIL, (what + f": no KL term measured although beta = {v['beta']:g} is "
                                          "declared"), 0.0
                return Verdict.PASS, what + ": no KL term (none declared)", 0.0
            if kind == "unknown":
                return Verdict.WARN, (what + f": not one of k1, k2, k3 (closest {v['closest']}, ratio error "
                                      f"{v['ratio_error']:.3g})"), v["ratio_error"]
            if v["sign"] < 0:
                return Verdict.FAIL, (what + f": the KL term ({kind}) enters with a negative sign: the loss "
                                      "rewards moving away from the reference"), v["ratio_error"]
            if kind.startswith("k3 with"):
                return Verdict.FAIL, (what + ": the estimator is k3 with policy and reference exchanged "
                                      "(exp(logp - ref) - (logp - ref) - 1), an estimate of KL(ref || policy), "
                                      "not KL(policy || ref)"), v["ratio_error"]
            return Verdict.PASS, what + f": the {kind} estimator (ratio error {v['ratio_error']:.1e})", v["ratio_error"]

        def direction(v):
            kind = v["estimator"]
            if kind in ("none", "unknown"):
                return Verdict.SKIP, f"not judged: KL estimator {kind}", None
            plus, minus = v["grad_mean_plus"], v["grad_mean_minus"]
            what = (f"d loss / d log p on completion tokens with the policy 0.5 nats above the reference: "
                    f"mean {plus:.3g}; 0.5 below: {minus:.3g}")
            ok = plus > 0 and (kind == "k1" or minus < 0)
            if ok:
                return Verdict.PASS, what + ": a step along -gradient moves the policy back to the reference", plus
            return Verdict.FAIL, (what + ": a step along -gradient moves the policy away from the reference "
                                  "(a KL term with the wrong sign)"), plus

        return [Condition("OBJ821", "kl_estimator", estimator), Condition("OBJ829", "kl_pulls_back", direction)]
