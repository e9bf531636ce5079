"""docs/config.md's examples as the tests read them, so a test and the doc it checks cannot drift:
a block marked `<!-- ecosystem snippet: NAME -->` on the line above its fence is found by NAME
(tests/test_ecosystem_real.py runs each on the real library, tests/test_config.py loads each as a
config in every run); `section_blocks` lists every block of a section, so none goes unmarked."""

from __future__ import annotations

import re
from pathlib import Path

CONFIG_MD = Path(__file__).resolve().parent.parent / "docs" / "config.md"
_MARKED = re.compile(r"<!-- ecosystem snippet: ([\w-]+) -->\n```toml\n(.*?)```", re.S)


def ecosystem_snippets(text: str | None = None) -> dict[str, str]:
    """{name: the TOML text} of every marked block, in the doc's order."""
    text = CONFIG_MD.read_text(encoding="utf-8") if text is None else text
    found: dict[str, str] = {}
    for name, body in _MARKED.findall(text):
        assert name not in found, f"docs/config.md: two snippets named {name!r}"
        found[name] = body
    return found


def section_blocks(heading: str, lang: str = "toml", text: str | None = None) -> list[str]:
    """Every ```lang block under the Markdown heading `heading` (up to the next heading of its
    level or above; a `# comment` inside a block is no heading)."""
    text = CONFIG_MD.read_text(encoding="utf-8") if text is None else text
    level = len(heading.split(" ", 1)[0])
    lines = text.splitlines(keepends=True)
    start = lines.index(heading + "\n")
    fenced, end = False, len(lines)
    for i in range(start + 1, len(lines)):
        if lines[i].startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(rf"#{{1,{level}}} ", lines[i]):
            end = i
            break
    return re.findall(rf"```{lang}\n(.*?)```", "".join(lines[start:end]), re.S)
