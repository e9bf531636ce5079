"""OBJ833 / OBJ834: the user's group_advantages: equal rewards give finite zeros, groups apart.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.core.findings import Condition, Verdict
from objdebug.core.settings import Settings
from objdebug.pipeline.context import Context
from objdebug.stages.policy.base import PolicyCheck


class Advantages(PolicyCheck):
    """The user's group_advantages: a group of equal rewards gives finite zeros; groups apart."""

    name = "policy-advantages"

    def skip_reason(self, ctx: Context) -> str | None:
        reason = super().skip_reason(ctx)
        if reason:
            return reason
        if ":" not in ctx.config.policy.group_advantages:
            return (f"[policy] group_advantages = '{ctx.config.policy.group_advantages}' is objdebug's own "
                    "reference; the check runs on a user's function ('pkg.mod:fn')")
        return None

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        from objdebug.engine.target import import_factory

        fn = import_factory(ctx.config.policy.group_advantages, "policy.group_advantages", ctx.config.base_dir)
        equal = np.asarray(fn(np.array([[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 1.0]])), np.float64)
        groups = np.array([[0.0, 1.0, 2.0, 4.0], [10.0, 11.0, 12.0, 14.0]])
        together = np.asarray(fn(groups), np.float64)
        apart = np.concatenate([np.asarray(fn(groups[i:i + 1]), np.float64) for i in range(2)])
        return {"equal_group": equal[0].tolist(), "equal_finite": bool(np.all(np.isfinite(equal[0]))),
                "equal_max_abs": float(np.nanmax(np.abs(equal[0]))) if np.isfinite(equal[0]).any() else None,
                "together": together.tolist(), "apart": apart.tolist(),
                "apart_error": float(np.max(np.abs(together - apart)))}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        tol = float(th["advantage_epsilon"])

        def equal(v):
            what = f"advantages of a group of equal rewards [1, 1, 1, 1]: {np.round(v['equal_group'], 6).tolist()}"
            if v["equal_finite"] and (v["equal_max_abs"] or 0.0) <= tol:
                return Verdict.PASS, what + ": finite zeros", 0.0
            return Verdict.FAIL, (what + ": expected finite zeros (std 0: divide by std + eps, or guard it)"), v["equal_max_abs"]

        def apart(v):
            e = v["apart_error"]
            what = f"two groups normalised together vs one at a time: max difference {e:.3g}"
            if math.isfinite(e) and e <= tol:
                return Verdict.PASS, what + ": each group normalised on its own", e
            return Verdict.FAIL, what + ": the advantages depend on the other groups of the batch (normalised across the batch, not per prompt)", e

        return [Condition("OBJ833", "equal_rewards_give_zero", equal),
                Condition("OBJ834", "groups_normalised_apart", apart)]
