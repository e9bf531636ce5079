"""Coverage a library model's head probe lost: one OBJ006 WARN naming the logit checks that skipped.

A library model as the end-to-end target runs its logit checks through its output head, found by
the setup probe (engine/library_logits.py `find_head`). When no head is found every one of those
checks skips with the probe's reason; a run whose other checks pass would exit 0 with that
coverage gone and only skip lines to say so. This turns the skips into one finding that counts.
"""

from __future__ import annotations

from typing import Any

from objdebug.core.findings import CheckResult, Finding, Verdict

LOGITS_LOST = "OBJ006"
CHECK = "logit-coverage"


def lost_logit_checks(library: dict[str, Any] | None, results: list[CheckResult]) -> CheckResult | None:
    """An OBJ006 WARN when `library` (the target's `library_model` setup record) has no head and
    findings skipped for that reason; None otherwise."""
    head = (library or {}).get("head") or {}
    why = head.get("why")
    if library is None or "path" in head or not why:
        return None
    codes = sorted({f.code for r in results for f in r.findings
                    if f.verdict is Verdict.SKIP and why in f.message})
    if not codes:
        return None
    res = CheckResult(stage="run", check=CHECK, value={"codes": codes, "why": why})
    res.findings.append(Finding.of(
        LOGITS_LOST, Verdict.WARN,
        f"{len(codes)} logit check(s) could not run on the library model's own loss "
        f"({', '.join(codes)}): {why}", check=CHECK, stage="run", condition="head_found",
        value=float(len(codes))))
    return res
