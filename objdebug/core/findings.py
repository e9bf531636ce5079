"""Measurement apart from verdict: checks, conditions, findings.

A `Check` measures and returns a plain dict (`measure`). Its `conditions(thresholds)` judge that
dict; each `Condition` carries a stable rule code and yields one `Finding` with a verdict, a
one-line message holding the measured numbers, and the rule's fix advice. An exception inside a
check becomes an ERROR finding and the suite goes on.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from objdebug.core.jsonsafe import encode
from objdebug.rules import codes_of, get_rule
from objdebug.core.settings import Settings


class Verdict(str, Enum):
    """PASS / WARN / FAIL / ERROR / SKIP, and INFO: a note.

    INFO describes the model's or MindSpore's nature, or a state of the target, rather than an
    objective bug (an embedding that wraps id -1, an untrained model): it is reported with its
    numbers and fix advice, counted apart, and never fails a run, not even under
    `fail_on = "warn"` or `--strict`.
    """

    PASS = "PASS"
    INFO = "INFO"
    WARN = "WARN"
    FAIL = "FAIL"
    ERROR = "ERROR"
    SKIP = "SKIP"

    @property
    def rank(self) -> int:
        return {"PASS": 0, "SKIP": 0, "INFO": 0, "WARN": 1, "FAIL": 2, "ERROR": 3}[self.value]

    @classmethod
    def from_setting(cls, value: Any, setting: str, allowed: tuple[str, ...] = ("info", "warn", "fail")
                     ) -> "Verdict":
        """A profile setting such as `label_out_of_range = "info"` -> Verdict.INFO (InputError if unknown)."""
        text = str(value).lower()
        if text not in allowed:
            from objdebug.core.errors import InputError

            raise InputError(f"For '{setting}', the value must be in {list(allowed)}, but got {value!r}.")
        return cls(text.upper())


@dataclass
class Finding:
    code: str
    verdict: Verdict
    message: str
    check: str = ""
    stage: str = ""
    condition: str = ""
    fix: str = ""
    value: float | None = None  # the key number, for summary tables and baselines
    location: dict[str, Any] | None = None  # {"file", "line"} in the user's config or data, if any

    @classmethod
    def of(cls, code: str, verdict: Verdict, message: str, *, check: str, stage: str,
           condition: str = "", value: float | None = None) -> "Finding":
        """The one way to make a finding: the fix advice comes from the rule's page, and is shown
        on every finding that is not a pass or a skip."""
        fix = get_rule(code).fix if verdict not in (Verdict.PASS, Verdict.SKIP) else ""
        return cls(code=code, verdict=verdict, message=message, check=check, stage=stage,
                   condition=condition, fix=fix, value=value)

    def to_dict(self) -> dict[str, Any]:
        out = {"code": self.code, "verdict": self.verdict.value, "message": self.message,
               "check": self.check, "stage": self.stage, "condition": self.condition,
               "fix": self.fix, "value": encode(self.value)}
        if self.location:  # only when known: reports without locations stay as they were
            out["location"] = encode(self.location)
        return out


@dataclass
class Condition:
    """A named judgement over a check's measurement: judge(value) -> (verdict, message, key number)."""

    code: str
    name: str
    judge: Callable[[dict[str, Any]], tuple[Verdict, str, float | None]]
    # where the finding points (objdebug.core.locations), from the same measurement; CI annotations use it
    locate: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None


def listing(items: list, limit: int = 8) -> str:
    """'a, b, c, ... (12 more)': names or ids in a one-line message."""
    items = [str(i) for i in items]
    return ", ".join(items[:limit]) + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")


def band(x: float, *, pass_if: Callable[[float], bool], fail_if: Callable[[float], bool]) -> Verdict:
    """PASS / FAIL / WARN in between; a non-finite measurement fails."""
    if x is None or not math.isfinite(float(x)):  # numpy scalars too
        return Verdict.FAIL
    if pass_if(x):
        return Verdict.PASS
    if fail_if(x):
        return Verdict.FAIL
    return Verdict.WARN


@dataclass
class CheckResult:
    stage: str
    check: str
    value: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None

    @property
    def verdict(self) -> Verdict:
        if not self.findings:
            return Verdict.SKIP
        # a note outranks a pass for display; neither fails the run
        return max((f.verdict for f in self.findings), key=lambda v: (v.rank, v is Verdict.INFO))

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "check": self.check, "verdict": self.verdict.value,
                "seconds": round(self.seconds, 3), "error": self.error,
                "value": encode(self.value), "findings": [f.to_dict() for f in self.findings]}


class _CodesOfCheck:
    """`Check.codes`: the codes whose rule page names this check (`check:` in the front matter)."""

    def __get__(self, obj: Any, cls: type) -> tuple[str, ...]:
        return codes_of(cls.name)


class Check:
    """Base class: subclasses set `name` and `stage` and implement `measure` and `conditions`;
    the codes they report are read from the rule pages (`objdebug/rules/OBJxxx.md`)."""

    name: str = ""
    stage: str = ""
    codes = _CodesOfCheck()
    # codes that judge what a TRAINED model learned: their WARN/FAIL become notes (INFO) on a model
    # measured untrained (objdebug/pipeline/model_state.py; applied by pipeline/runner.py)
    needs_trained: tuple[str, ...] = ()
    # the `[task] kind`s this check runs on (the default `applies` reads it)
    kinds: tuple[str, ...] = ("causal-lm",)

    def enabled(self, th: Settings) -> bool:
        """False when the profile switches this check off (it then leaves no result at all)."""
        return True

    def applies(self, cfg: Any) -> bool:
        """Whether this check belongs to the target at all (asked by the runner before it plans or
        runs the check): one that does not leaves no result, neither a SKIP nor a pass. The
        default: the target's `[task] kind` is one of `kinds`. A check that serves one form of
        its stage only (the policy stage's policy-gradient and reward calls) narrows it; a target
        the check belongs to but cannot measure is `skip_reason`'s (a SKIP that says why)."""
        return cfg.task.kind in self.kinds

    def measure(self, ctx: Any, th: Settings) -> dict[str, Any]:
        """The measurement as a plain dict; `th` is the stage's profile section, as in `conditions`."""
        raise NotImplementedError

    def conditions(self, th: Settings) -> list[Condition]:
        raise NotImplementedError

    def skip_reason(self, ctx: Any) -> str | None:
        """A reason this check cannot run on this target (e.g. end-to-end form without logits)."""
        return None

    # when the runner calls `prepare`: "run" (once, after the contract probe, before any stage)
    # or "stage" (when this check's stage starts, before its first check runs)
    prepare_at: str = "run"

    def prepare(self, ctx: Any, th: Settings) -> None:
        """Start work that can go on beside the checks before this one (a measurement in a
        process of its own), or take ahead what the checks before it would change, once per
        run, at `prepare_at` (before `skip_reason` is asked); `measure` collects it. Never
        needed for a result: a check run without it measures everything itself."""
        return None

    def run(self, ctx: Any, th: Settings) -> CheckResult:
        result = CheckResult(stage=self.stage, check=self.name)
        start = time.perf_counter()
        try:
            reason = self.skip_reason(ctx)
            if reason:
                result.findings.append(self._finding(self.codes[0], Verdict.SKIP, reason, ""))
                return result
            result.value = self.measure(ctx, th)
            for cond in self.conditions(th):
                verdict, message, key = cond.judge(result.value)
                finding = self._finding(cond.code, verdict, message, cond.name, key)
                if cond.locate is not None and verdict not in (Verdict.PASS, Verdict.SKIP):
                    finding.location = cond.locate(result.value)
                result.findings.append(finding)
        except Exception as exc:  # a crash inside a check is ERROR, the run goes on
            from objdebug.core.errors import InputError
            from objdebug.core.interrupts import raise_swallowed

            if isinstance(exc, InputError):
                raise
            raise_swallowed()  # a signal, turned into an error on the way: stop
            result.error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            from objdebug.core import crash  # a MindSpore text may open with a newline or a ruler
            from objdebug.core.locations import location  # a graph error: name the user's line

            first = crash.summary(exc)

            where = location(str(exc))
            if where:
                first += f" (at {where})"
            crashed = self._finding(self.codes[0], Verdict.ERROR, f"check '{self.name}' crashed: {first}", "")
            crashed.fix = crash.advice(exc)  # about the crash, not the rule's usual advice
            result.findings.append(crashed)
            if getattr(ctx, "debug", False):
                result.error = traceback.format_exc()
        finally:
            result.seconds = time.perf_counter() - start
        return result

    def _finding(self, code: str, verdict: Verdict, message: str, condition: str,
                 value: float | None = None) -> Finding:
        return Finding.of(code, verdict, message, check=self.name, stage=self.stage,
                          condition=condition, value=value)


# the one JSON codec (objdebug/core/jsonsafe.py); the name stays for the modules that import it from here
_clean = encode
