"""`[objective] call = "policy" | "policy-model"`, `[policy]` and `[data] rollouts`: the policy
stage's config (objdebug/stages/policy/; docs/config.md "Policy-gradient objectives").

Kept apart from config.py so the forms' vocabulary (the names construct's parameters bind to, their
aliases, the layouts and aggregations) lives in one place the stage and the validation share.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from objdebug.core.errors import InputError

# "policy": construct takes the logits and the rollout arrays by name; "policy-model": the Cell owns
# the policy (factory(policy=<model>, **kwargs), MindRLHF's GRPOModel) and takes the same names
# without the logits
POLICY_CALLS = ("policy", "policy-model")
ADVANTAGES = ("sequence", "token")
LAYOUTS = ("inputs", "targets")
GROUP_ADVANTAGES = ("std", "mean")
AGGREGATIONS = ("token-mean", "sequence-mean", "sum")  # and "constant:N"
# who sampled the rollouts (their stored old_logps, OBJ837): another copy of the policy (weights of
# a few optimizer steps ago, a separate sampler: the default), or this checkpoint itself
OLD_LOGPS_SOURCES = ("sampler", "this-checkpoint")
# our names (what objdebug passes) and the parameter names that bind to each, the first our own
NAMES = {
    "logits": ("logits",),
    "input_ids": ("input_ids", "prompt_completion_ids"),
    "completion_mask": ("completion_mask", "responses_mask", "response_mask", "loss_mask"),
    "advantages": ("advantages",),
    "old_per_token_logps": ("old_per_token_logps", "old_logps", "old_log_probs"),
    "ref_per_token_logps": ("ref_per_token_logps", "ref_logps", "ref_log_probs"),
}


@dataclass
class PolicySpec:
    """[policy]: how the policy stage builds the arrays the objective takes."""

    advantages: str = "sequence"       # "sequence" [B] or "token" (the per-token layout)
    group_advantages: str = "std"      # rewards -> advantages: "std", "mean" or "pkg.mod:fn"
    layout: str = "inputs"             # per-token arrays: "inputs" [B, T] or "targets" [B, T-1]
    aggregation: str | None = None     # declared: "token-mean", "sequence-mean", "constant:N", "sum"
    inputs: dict[str, str] = field(default_factory=dict)  # our name -> construct's parameter
    # the temperature the trainer scores completions at (logits / temperature, as TRL's GRPO
    # trainer does): the rollouts' stored old_logps must be the policy's log-probs at it (OBJ837)
    temperature: float = 1.0
    # "sampler": the stored old_logps are another copy's (they drift; only systematic mistakes
    # fail); "this-checkpoint": this checkpoint sampled them, they must equal its own
    old_logps_source: str = "sampler"
    # a policy-gradient objective beside a cross-entropy [objective] (as [preference] is): the
    # other stages check the [objective], the policy stage this one (the demo does this)
    factory: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    call: str = "policy"


def constant_divisor(aggregation: str | None) -> float | None:
    """N of "constant:N", else None."""
    if aggregation and aggregation.startswith("constant:"):
        return float(aggregation.split(":", 1)[1])
    return None


def validate_policy(cfg: Any, src: Any) -> None:
    """`[policy]`, `[data] rollouts` and the policy calls (exit 2 naming the key)."""
    policy = getattr(cfg, "policy", None)
    beside = policy is not None and policy.factory is not None
    if beside:
        if cfg.objective.call in POLICY_CALLS:
            raise InputError("[policy] factory is for a policy-gradient objective beside a cross-entropy "
                             "[objective]; this [objective] is already a policy call", source=str(src))
        if not isinstance(policy.factory, str) or ":" not in policy.factory:
            raise InputError(f"For 'policy.factory', the value must be 'module:callable', but got "
                             f"{policy.factory!r}.", source=src.of("policy.factory"))
        if not isinstance(policy.kwargs, dict):
            raise InputError(f"For 'policy.kwargs', the value must be dict, but got {policy.kwargs!r}.",
                             source=src.of("policy.kwargs"))
        if policy.call not in POLICY_CALLS:
            raise InputError(f"For 'policy.call', the value must be in {list(POLICY_CALLS)}, but got "
                             f"{policy.call!r}.", source=src.of("policy.call"))
    if cfg.objective.call not in POLICY_CALLS and not beside:
        if policy is not None:
            raise InputError(f"[policy] is for a policy-gradient objective ([objective] call in "
                             f"{list(POLICY_CALLS)}), but objective.call is '{cfg.objective.call}'.",
                             source=str(src))
        return
    if cfg.model is None:
        raise InputError(f"For 'objective.call' = '{cfg.objective.call}', a [model] is required: the "
                         "policy stage runs the policy model and builds the reference from its factory",
                         source=str(src))
    if policy is None:
        cfg.policy = policy = PolicySpec()

    def one_of(key: str, value: Any, allowed: tuple) -> None:
        if value not in allowed:
            raise InputError(f"For 'policy.{key}', the value must be in {list(allowed)}, but got "
                             f"{value!r}.", source=src.of(f"policy.{key}"))

    one_of("advantages", policy.advantages, ADVANTAGES)
    one_of("old_logps_source", policy.old_logps_source, OLD_LOGPS_SOURCES)
    one_of("layout", policy.layout, LAYOUTS)
    if not isinstance(policy.group_advantages, str) or (
            policy.group_advantages not in GROUP_ADVANTAGES and ":" not in policy.group_advantages):
        raise InputError(f"For 'policy.group_advantages', the value must be in "
                         f"{list(GROUP_ADVANTAGES)} or 'module:function', but got "
                         f"{policy.group_advantages!r}.", source=src.of("policy.group_advantages"))
    agg = policy.aggregation
    if agg is not None:
        ok = isinstance(agg, str) and (agg in AGGREGATIONS or agg.startswith("constant:"))
        if ok and agg.startswith("constant:"):
            try:
                ok = constant_divisor(agg) > 0
            except ValueError:
                ok = False
        if not ok:
            raise InputError(f"For 'policy.aggregation', the value must be in {list(AGGREGATIONS)} "
                             f"or 'constant:N' (N > 0), but got {agg!r}.", source=src.of("policy.aggregation"))
    temp = policy.temperature
    if isinstance(temp, bool) or not isinstance(temp, (int, float)) or not 0 < float(temp) < float("inf"):
        raise InputError(f"For 'policy.temperature', the value must be a number > 0, but got {temp!r}.",
                         source=src.of("policy.temperature"))
    policy.temperature = float(temp)
    if not isinstance(policy.inputs, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in policy.inputs.items()):
        raise InputError(f"For 'policy.inputs', the value must be a table of our name -> parameter "
                         f"name, but got {policy.inputs!r}.", source=src.of("policy.inputs"))
    bad = [k for k in policy.inputs if k not in NAMES]
    if bad:
        raise InputError(f"For 'policy.inputs', every key must be in {list(NAMES)}, but got "
                         f"{bad[0]!r}.", source=src.of("policy.inputs"))
    rollouts = getattr(cfg.data, "rollouts", None)
    if rollouts is not None and not isinstance(rollouts, str):
        raise InputError(f"For 'data.rollouts', the value must be str, but got {rollouts!r}.",
                         source=src.of("data.rollouts"))
