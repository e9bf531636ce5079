"""The policy stage: a policy-gradient objective (PPO, GRPO, DAPO, Dr. GRPO) with its KL term on
real rollouts, in graph mode, or a reward model's loss (`[objective] call = "reward"`: reward.py,
OBJ850-OBJ856). Opt-in: runs when `[objective] call` is "policy", "policy-model" or "reward".
Codes OBJ820-OBJ849:

- OBJ820 the zero point (on-policy, policy == reference, advantages 0): loss 0;
- OBJ821 the KL estimator measured (k1 / k2 / k3 from the loss at the reference moved by
  +-1 and +-0.5 nats), its sign and direction; OBJ829 a step along -gradient moves the policy
  back toward the reference;
- OBJ822-OBJ826 the token weights w_t read off d loss / d logits (policy term alone: the gradient at
  the real advantages minus the one at advantages 0): sign against the advantage, aggregation and
  length bias against the declared one, gradient on prompt / padding, a completion token (EOS
  included) without gradient, logits paired with the right token;
- OBJ827 the clip's measured bounds against the declared epsilon; OBJ828 its shape (min vs max);
- OBJ830 prompt and padding entries of old / reference log-probs change nothing;
- OBJ831 every numeric setting (beta, epsilon, ...) changes the loss;
- OBJ832 one SGD step on the real model raises positive-advantage completions over negative ones;
- OBJ833 / OBJ834 the user's group_advantages: equal rewards give finite zeros, groups apart;
- OBJ835 a completion truncated to nothing, ratios far outside the clip, float16 logits: finite;
- OBJ836 the gradient accumulated over two micro-batches vs the whole batch (a note for a token mean);
  OBJ835 and OBJ836 run on the rollouts' stored old log-probs where they carry them (on-policy else);
- OBJ837 the rollouts' stored old log-probs carry no systematic mistake (their drift from this
  checkpoint a note; the plain comparison where it is declared to have sampled them) (old_logps.py).

Every number comes from the user's objective run through MindSpore (session.py); objdebug's own
log-probs and the closed forms of the estimators are references, reported as such.

This module is the stage's face: one module per check family (zero_point.py, kl_estimator.py,
weights.py, clip.py, outside_entries.py, settings_used.py, step.py, advantages.py, stress.py,
micro_batches.py, old_logps.py), their shared measurements in _common.py.
"""

from __future__ import annotations

from objdebug.core.findings import Check
from objdebug.stages.policy.zero_point import ZeroPoint
from objdebug.stages.policy.kl_estimator import KLEstimator
from objdebug.stages.policy.weights import Weights
from objdebug.stages.policy.clip import Clip
from objdebug.stages.policy.outside_entries import OutsideEntries
from objdebug.stages.policy.settings_used import Settings_
from objdebug.stages.policy.step import Step
from objdebug.stages.policy.advantages import Advantages
from objdebug.stages.policy.stress import Stress
from objdebug.stages.policy.micro_batches import MicroBatches

__all__ = ["ZeroPoint", "KLEstimator", "Weights", "Clip", "OutsideEntries", "Settings_", "Step", "Advantages", "Stress", "MicroBatches", "checks"]


def checks() -> list[Check]:
    """The policy-gradient checks (they apply only to the calls "policy" / "policy-model"), then
    the reward form's (only to the call "reward"): `Check.applies` drops the other call's, so a
    run lists only its own call's checks."""
    from objdebug.stages.policy.old_logps import OldLogps
    from objdebug.stages.policy.reward import checks as reward_checks

    return [ZeroPoint(), KLEstimator(), OldLogps(), Weights(), Clip(), OutsideEntries(), Settings_(), Step(),
            Advantages(), MicroBatches(), Stress()] + reward_checks()
