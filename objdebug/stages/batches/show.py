"""`objdebug batches --show N`: N real rows as the batches stage sees them, token by token.

Each input token is shown as text (the configured tokenizer's; an id the tokenizer cannot show
is written `⟨id⟩`) and marked by what its label does, as measured on the objective
(`Audit.classes`): trained, ignored, padding (its label ignored) or wrong-label (the objective
trains on a label where nothing should be learned; the label is written after an arrow). A run of
four or more identical tokens is written once with its count. Rows are wrapped to the width.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any, Callable

import numpy as np

from objdebug.report.batch_rows import TAGS, header, legend_lines
from objdebug.stages.batches.audit import IGNORED, PADDING, TRAINED, WRONG, Audit
from objdebug.stages.batches.layout import PRE_SHIFTED, UNSHIFTED

COLOURS = {TRAINED: "32", IGNORED: "2", PADDING: "90", WRONG: "1;31"}  # ANSI SGR
# [chat]: a turn's role label (⟦user⟧) where each turn starts, coloured by role
ROLE_COLOURS = {"system": "1;35", "user": "1;34", "assistant": "1;36", "tool": "1;33"}
ROLE_LABEL = re.compile(r"⟦(\w+)⟧")
RUN = 4  # identical tokens in a row written once with their count from this many on


def token_text(decode: Callable[[list[int]], str] | None, token: int) -> str:
    """The token as text when the tokenizer shows it, else ⟨id⟩; a newline is ⏎."""
    if decode is not None:
        try:
            text = decode([int(token)])
        except Exception:  # noqa: BLE001 - an id the tokenizer does not know: shown as an id
            text = ""
        text = text.replace("\n", "⏎")
        if text and text.isprintable() and "\ufffd" not in text:
            return text
    return f"⟨{int(token)}⟩"


def _segments(lay, r: int, classes: np.ndarray, decode, starts: dict[int, str] | None = None) -> list[list]:
    """[class, [token text, ...]] runs of one row: a new segment where the class changes; a run
    of RUN or more identical tokens written once with its count; `starts` ([chat]): column ->
    the role of the turn starting there, written ⟦role⟧ before its first token."""
    ids, labels = lay.batch.input_ids[r], lay.batch.labels
    tokens = []
    for t in range(len(ids)):
        text = token_text(decode, ids[t])
        if starts and t in starts:
            text = f"⟦{starts[t]}⟧{text}"
        if classes[t] == WRONG and labels is not None:
            text += f"→{int(labels[r, t])}"
        tokens.append((text, str(classes[t])))
    segments: list[list] = []
    t = 0
    while t < len(tokens):
        text, cls = tokens[t]
        n = 1
        while t + n < len(tokens) and tokens[t + n] == tokens[t]:
            n += 1
        n = n if n >= RUN else 1
        if not segments or segments[-1][0] != cls:
            segments.append([cls, []])
        segments[-1][1].append(f"{text}×{n} " if n > 1 else text)
        t += n
    return segments


def _pieces(segments: list[list]) -> list[tuple[str, str]]:
    """(text, class): each segment's tag, then its tokens; a line never breaks inside a piece
    shorter than the line."""
    return [piece for cls, tokens in segments
            for piece in [(TAGS[cls], cls)] + [(text, cls) for text in tokens]]


def _wrap(pieces: list[tuple[str, str]], width: int, colour: bool) -> list[str]:
    lines: list[list[tuple[str, str]]] = [[]]
    used = 0
    for text, cls in pieces:
        parts = [text] if len(text) <= width else [text[k:k + width] for k in range(0, len(text), width)]
        for part in parts:
            if used + len(part) > width and lines[-1]:
                lines.append([])
                used = 0
            lines[-1].append((part, cls))
            used += len(part)
    if not colour:
        return ["  " + "".join(text for text, _ in line) for line in lines]
    def paint(text: str, cls: str) -> str:
        text = ROLE_LABEL.sub(lambda m: f"\x1b[0;{ROLE_COLOURS.get(m.group(1), '1')}m{m.group(0)}"
                                        f"\x1b[0;{COLOURS[cls]}m", text)
        return f"\x1b[{COLOURS[cls]}m{text}"
    return ["  " + "".join(paint(text, cls) for text, cls in line) + "\x1b[0m" for line in lines]


def view(a: Audit, n: int, decode: Callable[[list[int]], str] | None,
         roles: list | None = None) -> dict[str, Any]:
    """The first `n` rows of the batches read, as data (report/batch_rows.py): what `--show`
    prints and the HTML report colours (stored in OBJ014's measured value). `roles` ([chat],
    `chat_roles.row_roles`): each turn's role written where it starts, the turns in the title."""
    by_row = {(rr.batch, rr.row): rr for rr in roles or []}
    pairing = {PRE_SHIFTED: "labels are pre-shifted: each token is marked by its label, the token "
                            "after it (the last prompt token trains toward the answer's first)",
               UNSHIFTED: "labels are unshifted: each token is marked by its own label (the model "
                          "shifts)"}.get(a.layout)
    rows = []
    for lay in a.layouts:
        classes = a.classes(lay)
        for r in range(len(lay.padding)):
            if len(rows) == n:
                break
            count = {cls: int((classes[r] == cls).sum()) for cls in TAGS}
            rr = by_row.get((lay.batch.number, r))
            starts, turns = {}, ""
            if rr is not None:
                real = np.nonzero(~lay.padding[r])[0]
                starts = {int(real[t.start]): t.role for t in rr.turns}
                turns = f"; turns: {' '.join(t.role for t in rr.turns) or 'none found'}"
            rows.append({"title": f"batch {lay.batch.number} row {r}: {len(classes[r])} positions — "
                                  + ", ".join(f"{v} {k}" for k, v in count.items()) + turns,
                         "segments": _segments(lay, r, classes[r], decode, starts)})
    return {"source": a.source, "ignored": a.ignored(), "pairing": pairing, "rows": rows,
            "total": sum(len(lay.padding) for lay in a.layouts)}


def render(a: Audit, n: int, decode: Callable[[list[int]], str] | None, width: int = 100,
           colour: bool = False, roles: list | None = None) -> str:
    """The first `n` rows of the batches read, marked, with a legend, wrapped to `width`."""
    shown = view(a, n, decode, roles)
    width = max(int(width) - 2, 20)
    lines = textwrap.wrap(header(shown), width + 2, subsequent_indent="  ")
    for entry in legend_lines(shown):
        lines += textwrap.wrap(entry, width + 2, subsequent_indent=" " * 14)
    lines.append("")
    for row in shown["rows"]:
        lines += textwrap.wrap(row["title"], width + 2, subsequent_indent="    ")
        lines += _wrap(_pieces(row["segments"]), width, colour)
    lines.append(f"{len(shown['rows'])} of {shown['total']} rows read shown")
    return "\n".join(lines)


def decoder(cfg: Any) -> Callable[[list[int]], str] | None:
    """The configured tokenizer's decode (the built-in bytes one by default), or None."""
    from objdebug.engine.data import make_tokenizer

    try:
        return make_tokenizer(cfg.data.tokenizer, cfg.base_dir).decode
    except Exception:  # noqa: BLE001 - a tokenizer that cannot load: ids are shown
        return None


def chat_rows(ctx: Any, th: Any) -> list | None:
    """[chat]: every row's turns (`chat_roles.row_roles`), else None."""
    if getattr(ctx.config, "chat", None) is None:
        return None
    from objdebug.stages.batches.chat_roles import row_roles

    return row_roles(ctx, th)
