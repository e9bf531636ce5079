"""The pipeline's real rows token by token: each position marked by what its label does, as the
batches stage measured it on the objective (trained / ignored / padding / wrong-label), and with
`[chat]` by the role of its turn (the HTML report underlines each turn in its role's colour). One view,
two renderings: `objdebug batches --show N` (stages/batches/show.py, the terminal) and the HTML
report (built from a report dict only: the view is OBJ014's measured value, `rows_view`, so
`objdebug render` shows it too; a run without `[data] batches` has none).

A view: {"source", "ignored", "pairing", "total", "rows": [{"title", "segments": [[class,
[token text, ...]], ...]}]}: a segment is a run of positions of one class, its tag written where it
starts.
"""

from __future__ import annotations

import re
from html import escape
from typing import Any

CHECK = "batch-supervision"
TRAINED, IGNORED, PADDING, WRONG = "trained", "ignored", "padding", "wrong-label"
TAGS = {TRAINED: "[trained]", IGNORED: "[ignored]", PADDING: "[padding]", WRONG: "[wrong-label]"}
LEGEND = {
    TRAINED: "the objective learns this position's label (the paired input token)",
    IGNORED: "its label is a value the objective ignores (measured): the prompt, a masked token",
    PADDING: "padding (attention mask 0, or the pad run) whose label the objective ignores",
    WRONG: "the objective trains on this label where nothing should be learned "
           "(padding, prompt, outside the vocabulary): token→label",
}

# the HTML report's colours: green trains, grey is ignored, light grey pads, red is the bug
CSS = """
.tokens{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.85em;line-height:1.6;
 white-space:pre-wrap;overflow-wrap:anywhere;border:1px solid #eee;padding:.4em .6em;margin:.2em 0 .8em}
.tok-trained{background:#c8e6c9}.tok-ignored{color:#757575}
.tok-padding{color:#bdbdbd;background:#fafafa}.tok-wrong-label{background:#ffcdd2;color:#b71c1c;font-weight:600}
.tag{font-size:.75em;opacity:.75}
.role{font-weight:600;font-size:.8em}
.role-system{border-bottom:2px solid #8e24aa}.role-user{border-bottom:2px solid #1e88e5}
.role-assistant{border-bottom:2px solid #00897b}.role-tool{border-bottom:2px solid #f9a825}
.role-label.role-system{color:#8e24aa}.role-label.role-user{color:#1e88e5}
.role-label.role-assistant{color:#00897b}.role-label.role-tool{color:#f9a825}
"""
# [chat]: a turn's role label (⟦user⟧) written where the turn starts (stages/batches/show.py)
ROLE_LABEL = re.compile(r"⟦(\w+)⟧")
ROLES = ("system", "user", "assistant", "tool")


def header(view: dict[str, Any]) -> str:
    ignored = ", ".join(map(str, view["ignored"])) or "none of the values probed"
    return f"objdebug batches: {view['source']} (the objective ignores {ignored})"


def legend_lines(view: dict[str, Any]) -> list[str]:
    """'[trained]     the objective learns ...' per class, then the labels' pairing if known."""
    lines = [f"{TAGS[cls]:<13} {text}" for cls, text in LEGEND.items()]
    return lines + ([view["pairing"]] if view.get("pairing") else [])


def views(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows views a report holds (one per batches stage result that stored one)."""
    return [res["value"]["rows_view"] for res in report.get("results", [])
            if res.get("check") == CHECK and (res.get("value") or {}).get("rows_view")]


def html(view: dict[str, Any]) -> str:
    """The view as HTML: legend, then each row as coloured, wrapped tokens."""
    legend = "".join(f'<li><span class="tok-{cls}">{escape(TAGS[cls])}</span> {escape(text)}</li>'
                     for cls, text in LEGEND.items())
    parts = [f"<h3>Rows of the pipeline's batches</h3><p>{escape(header(view))}</p><ul>{legend}</ul>"]
    if view.get("pairing"):
        parts.append(f'<p class="muted">{escape(view["pairing"])}</p>')
    if any(ROLE_LABEL.search(t) for row in view["rows"] for _, tokens in row["segments"] for t in tokens):
        keys = "".join(f'<span class="role role-label role-{r}">⟦{r}⟧</span> ' for r in ROLES)
        parts.append(f"<p>{keys}each turn's tokens underlined in its role's colour ([chat])</p>")
    for row in view["rows"]:
        spans, role = [], None
        for cls, tokens in row["segments"]:
            inner = []
            for text in tokens:  # a role label starts a turn: its tokens carry the role's colour
                m = ROLE_LABEL.search(text)
                if m:
                    role = m.group(1)
                    text = escape(text[:m.start()]) + (f'<span class="role role-label role-{escape(role)}">'
                                                       f"{escape(m.group(0))}</span>") + escape(text[m.end():])
                else:
                    text = escape(text)
                inner.append(f'<span class="role-{escape(role)}">{text}</span>' if role and cls != PADDING else text)
            spans.append(f'<span class="tok-{escape(cls)}"><span class="tag">{escape(TAGS[cls])}</span>'
                         f'{"".join(inner)}</span>')
        parts.append(f"<h4>{escape(row['title'])}</h4><div class=\"tokens\">{''.join(spans)}</div>")
    parts.append(f'<p class="muted">{len(view["rows"])} of {view["total"]} rows read shown '
                 f"([batches] report_rows; <code>objdebug batches --show N</code> in a terminal)</p>")
    return "".join(parts)
