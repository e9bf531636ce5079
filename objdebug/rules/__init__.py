"""The rule registry: one Markdown page per finding code, `OBJxyz.md` in this folder.

Each page starts with a front matter block::

    ---
    code: OBJ101
    name: align-gap
    stage: align
    summary: one line
    fix: one line of fix advice, shown under every non-passing finding
    ---

followed by the sections What it does / Why it matters / Example / How to fix.
Codes are stable and never reused: a retired rule keeps its page with `retired: true`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

_DIR = Path(__file__).parent


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    stage: str
    summary: str
    fix: str
    doc: str


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
    return Rule(code=meta["code"], name=meta["name"], stage=meta["stage"],
                summary=meta["summary"], fix=meta.get("fix", ""), doc=body.strip())


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


def render_rule(rule: Rule) -> str:
    return f"{rule.code} ({rule.name}) — {rule.summary}\nstage: {rule.stage}\n\n{rule.doc}\n"
