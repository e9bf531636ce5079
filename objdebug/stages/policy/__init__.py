"""The policy stage's package: RLHF objectives. This branch holds the reward form
(`[objective] call = "reward"`, reward.py, codes OBJ850-OBJ856), registered as the opt-in stage
`reward` (pipeline/registry.py) until the policy-gradient checks join it."""

from __future__ import annotations

from objdebug.stages.policy.reward import checks as reward_checks


def checks() -> list:
    return reward_checks()
