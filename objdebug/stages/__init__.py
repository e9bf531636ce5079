"""The stage registry: every stage, in pipeline order, with its one-line summary.

Each stage is a module `objdebug.stages.<name>` exposing `checks() -> list[Check]`. The API, the CLI
(one command per stage, its help the summary) and profile validation all read this registry; it
imports nothing heavy, so the CLI can build its commands without MindSpore.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    name: str
    summary: str  # the stage command's help
    scores_rows: bool = False  # scores rows one by one (the engine's per-sample objective graph)


REGISTRY: tuple[Stage, ...] = (
    Stage("align", "Stage 1: loss must order good < medium < bad answers to the same prompt, with a clear gap.",
          scores_rows=True),
    Stage("grad", "Stage 2: gradient health (norms, disconnected/NaN parameters, padding leakage, supervision coverage, autodiff vs finite differences)."),
    Stage("invariants", "Stage 6: invariants of a correct objective (label alignment, logit shift, ignored positions, upstream gradient, unused settings, token weighting, side effects, empty rows)."),
    Stage("decompose", "Stage 3: components of a composite loss: shares, dead terms, scale imbalance, gradient share.",
          scores_rows=True),
    Stage("correlate", "Stage 4: per-sample loss against human quality scores (Pearson with CI, Spearman, Kendall).",
          scores_rows=True),
    Stage("preference", "Preference objectives (DPO, IPO, SimPO, hinge) on real pairs: zero point, symmetry, direction, masking, length, settings, agreement."),
    Stage("stress", "Stage 5: long inputs, all-padding, garbage ids, fp16, padding invariance.", scores_rows=True),
)
STAGES = tuple(s.name for s in REGISTRY)  # pipeline order


def scores_rows(names) -> bool:
    """Whether any of these stages scores rows one by one (the contract probe then checks the
    objective through that per-sample graph instead of compiling one of its own)."""
    return any(s.scores_rows for s in REGISTRY if s.name in names)


def pipeline_order(names, setting: str = "--stages", source: str | None = None) -> list[str]:
    """`names` checked against the registry (InputError naming `setting`), in pipeline order."""
    bad = [n for n in names if n not in STAGES]
    if bad:
        from objdebug.errors import InputError

        got = f"'{bad[0]}'" if len(bad) == 1 else str(bad)
        raise InputError(f"For '{setting}', each stage must be in {list(STAGES)}, but got {got}.",
                         source=source)
    return [s for s in STAGES if s in names]


def stage_checks(name: str) -> list:
    pipeline_order([name])
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
