"""Code selection (`select` / `ignore`) checked before any work, and the run that checked nothing.

A gate must never pass without checking: a selection prefix that matches no finding code (a typo,
`obj105` in lower case before codes were case-insensitive, `OBJ9`) used to drop every finding and
exit 0. Here every prefix is upper-cased and must match a code that has a rule page; the selection
as a whole must keep at least one code of the stages that run. A run whose findings are all skips
(every check skipped or switched off) gets an OBJ005 FAIL instead of a pass, and so does each
stage the target's data opts in (`[data] batches`, a `[packing]` section, a policy or reward
objective: `STAGE_DATA`) that ran and checked nothing: the data it reads is there, so a skip of
every one of its checks is a check lost, not a stage that does not apply.
"""

from __future__ import annotations

from typing import Any

from objdebug.core.errors import InputError
from objdebug.core.findings import CheckResult, Finding, Verdict

NOTHING_CHECKED = "OBJ005"
# verdicts that mean a check measured something (INFO notes and SKIPs do not)
_CHECKED = (Verdict.PASS, Verdict.WARN, Verdict.FAIL, Verdict.ERROR)


def prefixes(value: Any, key: str, source: str | None = None) -> list[str]:
    """A list of code prefixes, upper-cased; each must match a known code (InputError naming `key`)."""
    from objdebug.rules import all_rules

    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InputError(f"For '{key}', the value must be a list of code prefixes (e.g. [\"OBJ1\"]), "
                         f"but got {value!r}.", source=source)
    codes = all_rules()
    out = []
    for text in value:
        prefix = text.strip().upper()
        if not prefix or not any(code.startswith(prefix) for code in codes):
            raise InputError(f"For '{key}', each prefix must match a finding code (`objdebug rules` "
                             f"lists them), but got {text!r}, which matches none.", source=source)
        out.append(prefix)
    return out


def kept_codes(stages: list[str], select: list[str], ignore: list[str],
               baseline: bool = False) -> list[str]:
    """The codes of `stages` (and of the baseline comparison) that the selection keeps."""
    from objdebug.pipeline.profile import code_selected
    from objdebug.rules import all_rules

    wanted = set(stages) | ({"baseline"} if baseline else set())
    return [code for code, rule in all_rules().items()
            if rule.stage in wanted and code_selected(code, select, ignore)]


def require_something(stages: list[str], select: list[str], ignore: list[str],
                      baseline: bool = False) -> None:
    """InputError before any work when the selection keeps no code of the stages that run."""
    if not kept_codes(stages, select, ignore, baseline):
        raise InputError(f"nothing to check: the code selection (select {select}, ignore {ignore}) "
                         f"keeps no finding code of the stages {stages}; a gate that checks nothing "
                         f"cannot pass")


# stage -> the config keys that give it what it reads (registry.OPT_IN's, less packing's
# data.batches: batches without packed rows rightly leave the packing stage nothing to check)
STAGE_DATA = {"batches": ("data.batches",), "packing": ("packing",),
              "policy": ("policy_objective", "objective.call=reward")}


def _declared(cfg: Any, key: str) -> bool:
    key, _, wanted = key.partition("=")
    value = cfg
    for part in key.split("."):
        value = getattr(value, part, None)
    return value is not None and (not wanted or value == wanted)


def stages_checking_nothing(cfg: Any, results: list[CheckResult]) -> list[CheckResult]:
    """An OBJ005 FAIL per stage whose data the config declares that ran and measured nothing
    (every finding a skip or a note), naming the key and its first skip reason."""
    out = []
    for stage, keys in STAGE_DATA.items():
        mine = [f for r in results if r.stage == stage for f in r.findings]
        key = next((k for k in keys if _declared(cfg, k)), None)
        if key is None or not mine or any(f.verdict in _CHECKED for f in mine):
            continue
        reason = next((f.message for f in mine if f.verdict is Verdict.SKIP and f.message), "")
        res = CheckResult(stage=stage, check="nothing-checked",
                          value={"findings": len(mine), "declared": key})
        res.findings.append(Finding.of(
            NOTHING_CHECKED, Verdict.FAIL,
            f"the {stage} stage checked nothing although {key.partition('=')[0]} gives it what it "
            f"reads: all {len(mine)} of its findings skipped (first: {reason})",
            check="nothing-checked", stage=stage, condition="stage_checked_something",
            value=float(len(mine))))
        out.append(res)
    return out


def nothing_checked(results: list[CheckResult]) -> CheckResult | None:
    """An OBJ005 FAIL when no finding of the run measured anything (all skipped or filtered)."""
    findings = [f for r in results for f in r.findings]
    if any(f.verdict in _CHECKED for f in findings):
        return None
    skipped = sum(f.verdict is Verdict.SKIP for f in findings)
    res = CheckResult(stage="run", check="nothing-checked",
                      value={"findings": len(findings), "skipped": skipped})
    res.findings.append(Finding.of(
        NOTHING_CHECKED, Verdict.FAIL,
        f"nothing was checked: {len(findings)} finding(s), {skipped} skipped, none passed, warned "
        f"or failed", check="nothing-checked", stage="run", condition="something_checked",
        value=float(len(findings))))
    return res
