"""OBJ820: the zero point (on-policy, policy == reference, advantages 0): loss 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.core.findings import Condition, Verdict
from objdebug.core.settings import Settings
from objdebug.pipeline.context import Context
from objdebug.stages.policy._common import _base
from objdebug.stages.policy.base import PolicyCheck
from objdebug.stages.policy.session import session


class ZeroPoint(PolicyCheck):
    """On-policy, policy == reference, advantages 0: the loss is 0."""

    name = "policy-zero-point"

    def prepare(self, ctx: Context, th: Settings) -> None:
        """The rollouts read and the objective bound before any stage: a bad rollout file or a
        construct parameter that nothing binds ends the run with exit 2 here."""
        if self.skip_reason(ctx) is None:
            session(ctx)

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        s = session(ctx)
        losses, g0 = [], []
        for b in s.batches:
            base = _base(s, b)
            losses.append(base["zero"]["loss"])
            g0.append(float(np.max(np.abs(base["gz"]["g"][b.mask]))) if b.mask.any() else 0.0)
        return {"losses": losses, "max_abs_loss": float(np.max(np.abs(losses))), "batches": len(losses),
                "rollouts": len(s.rows), "groups": len(s.groups), "kl_gradient_max": float(max(g0)),
                "finite": bool(np.all(np.isfinite(losses)))}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        tol = float(th["zero_loss_tolerance"])

        def judge(v):
            what = (f"loss at the zero point (old := policy, reference := policy, advantages 0; "
                    f"{v['rollouts']} rollouts in {v['groups']} groups, {v['batches']} batches): max |loss| "
                    f"{v['max_abs_loss']:.3g}; the KL term's gradient there, per token log-prob: max "
                    f"{v['kl_gradient_max']:.3g} (beta x weight for k1, 0 for k2 / k3)")
            if v["finite"] and v["max_abs_loss"] <= tol:
                return Verdict.PASS, what, v["max_abs_loss"]
            return Verdict.FAIL, (what + f", expected 0 (tolerance {tol:.0e}): the loss does not vanish "
                                  "when the policy has not moved and no completion is better than "
                                  "another (a KL or ratio term computed against something else?)"), v["max_abs_loss"]

        return [Condition("OBJ820", "zero_point_loss_is_zero", judge)]
