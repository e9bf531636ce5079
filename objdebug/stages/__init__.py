"""The stages, in pipeline order. Each module exposes `checks() -> list[Check]`."""

from __future__ import annotations

import importlib

STAGES = ("align", "grad", "invariants", "decompose", "correlate", "preference", "stress")


def stage_checks(name: str) -> list:
    if name not in STAGES:
        from objdebug.errors import InputError

        raise InputError(f"For '--stages', each stage must be in {list(STAGES)}, but got '{name}'.")
    return importlib.import_module(f"objdebug.stages.{name}").checks()


def stage_skip_reason(config, name: str) -> str | None:
    """Why a whole stage cannot run on this target, or None.

    A target whose [objective] is a preference call has no `loss(logits, labels)`: the stages that
    test one are skipped; only the preference stage runs.
    """
    from objdebug.config import PREFERENCE_CALLS

    if name != "preference" and config.objective.call in PREFERENCE_CALLS:
        return (f"[objective] call = \"{config.objective.call}\": the objective takes preference pairs, "
                f"not (logits, labels); the {name} stage needs a cross-entropy-style objective "
                "(put the preference loss under [preference] to check both)")
    return None


def skipped(check, reason: str):
    """A CheckResult with one SKIP finding and `reason` (the check does not run)."""
    from objdebug.findings import CheckResult, Verdict

    result = CheckResult(stage=check.stage, check=check.name)
    result.findings.append(check._finding(check.codes[0], Verdict.SKIP, reason, ""))
    return result
