"""`PolicyCheck`: the base of the policy-gradient checks (the package's and old_logps.py's)."""

from __future__ import annotations

from objdebug.core.findings import Check
from objdebug.pipeline.context import Context
from objdebug.stages.policy.session import no_policy_reason


class PolicyCheck(Check):
    stage = "policy"

    def applies(self, cfg) -> bool:
        """Only a policy-gradient call ("policy", "policy-model"): in a reward run these checks
        leave no result (the stage serves three calls; each check belongs to its own)."""
        return super().applies(cfg) and cfg.policy_objective is not None

    def skip_reason(self, ctx: Context) -> str | None:
        return no_policy_reason(ctx)
