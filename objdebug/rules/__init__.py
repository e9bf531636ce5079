"""The rule registry: one Markdown page per finding code, `OBJxyz.md` in this folder.

Each page starts with a front matter block::

    ---
    code: OBJ101
    name: align-gap
    stage: align
    check: alignment        (the check(s) that report it, comma-separated: `Check.codes` comes from here)
    baseline: higher        (which way its key number is better for --baseline: higher | lower |
                            abs_higher | abs_lower | none, optionally an absolute tolerance: `lower 0.01`)
    summary: one line
    fix: one line of fix advice, shown under every non-passing finding
    ---

followed by the sections What it does / Why it matters / Example / How to fix. The front matter is
the only place a rule's metadata is written.
Codes are stable and never reused: a retired rule keeps its page with `retired: true`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

_DIR = Path(__file__).parent
# which way a finding's key number is better: a larger magnitude ("abs_higher", e.g. a correlation
# expected to be negative), closer to zero ("abs_lower"), or not compared ("none")
DIRECTIONS = ("higher", "lower", "abs_higher", "abs_lower", "none")


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    stage: str
    summary: str
    fix: str
    doc: str
    checks: tuple[str, ...] = ()          # the checks that report this code
    baseline: str = "none"                # which way the key number is better (objdebug/pipeline/baseline.py)
    baseline_tolerance: float | None = None  # replaces [baseline] abs_tolerance for this code


def _parse(path: Path) -> Rule:
    text = path.read_text(encoding="utf-8")
    if not text.startswith("---\n"):
        raise ValueError(f"{path.name}: missing front matter")
    head, _, body = text[4:].partition("\n---\n")
    meta = {}
    for line in head.splitlines():
        if ":" in line:
            key, _, value = line.partition(":")
            meta[key.strip()] = value.strip()
    missing = [k for k in ("code", "name", "stage", "check", "baseline", "summary") if k not in meta]
    if missing:
        raise ValueError(f"{path.name}: the front matter must have {missing} (see objdebug/rules/__init__.py)")
    direction, *tolerance = meta["baseline"].split()
    if direction not in DIRECTIONS or len(tolerance) > 1:
        raise ValueError(f"{path.name}: baseline must be one of {list(DIRECTIONS)} and an optional "
                         f"tolerance, but got {meta['baseline']!r}")
    return Rule(code=meta["code"], name=meta["name"], stage=meta["stage"],
                summary=meta["summary"], fix=meta.get("fix", ""), doc=body.strip(),
                checks=tuple(c.strip() for c in meta["check"].split(",") if c.strip()),
                baseline=direction, baseline_tolerance=float(tolerance[0]) if tolerance else None)


@functools.lru_cache(maxsize=1)
def all_rules() -> dict[str, Rule]:
    rules = {}
    for path in sorted(_DIR.glob("OBJ*.md")):
        rule = _parse(path)
        if rule.code != path.stem:
            raise ValueError(f"{path.name}: code {rule.code} does not match the file name")
        rules[rule.code] = rule
    return rules


def get_rule(code: str) -> Rule:
    try:
        return all_rules()[code]
    except KeyError:
        raise KeyError(f"unknown finding code {code!r}") from None


@functools.lru_cache(maxsize=None)
def codes_of(check: str) -> tuple[str, ...]:
    """The codes a check reports, in code order, from the rules' `check:` front matter."""
    return tuple(code for code, rule in all_rules().items() if check in rule.checks)


def render_rule(rule: Rule) -> str:
    return f"{rule.code} ({rule.name}) — {rule.summary}\nstage: {rule.stage}\n\n{rule.doc}\n"
