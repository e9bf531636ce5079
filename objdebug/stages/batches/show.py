"""`objdebug batches --show N`: N real rows as the batches stage sees them, token by token.

Each input token is shown as text (the configured tokenizer's; an id the tokenizer cannot show
is written `⟨id⟩`) and marked by what its label does, as measured on the objective
(`Audit.classes`): trained, ignored, padding (its label ignored) or wrong-label (the objective
trains on a label where nothing should be learned; the label is written after an arrow). A run of
four or more identical tokens is written once with its count. Rows are wrapped to the width.
"""

from __future__ import annotations

import textwrap
from typing import Any, Callable

import numpy as np

from objdebug.stages.batches.audit import IGNORED, PADDING, TRAINED, WRONG, Audit
from objdebug.stages.batches.layout import PRE_SHIFTED, UNSHIFTED

TAGS = {TRAINED: "[trained]", IGNORED: "[ignored]", PADDING: "[padding]", WRONG: "[wrong-label]"}
COLOURS = {TRAINED: "32", IGNORED: "2", PADDING: "90", WRONG: "1;31"}  # ANSI SGR
LEGEND = [
    "[trained]     the objective learns this position's label (the paired input token)",
    "[ignored]     its label is a value the objective ignores (measured): the prompt, a masked token",
    "[padding]     padding (attention mask 0, or the pad run) whose label the objective ignores",
    "[wrong-label] the objective trains on this label where nothing should be learned "
    "(padding, prompt, outside the vocabulary): token→label",
]
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


def _pieces(lay, r: int, classes: np.ndarray, decode) -> list[tuple[str, str]]:
    """(text, class) of one row, a piece a token (or a run of one token) or a class tag, written
    where a class starts; a line never breaks inside a piece shorter than the line."""
    ids, labels = lay.batch.input_ids[r], lay.batch.labels
    tokens = []
    for t in range(len(ids)):
        text = token_text(decode, ids[t])
        if classes[t] == WRONG and labels is not None:
            text += f"→{int(labels[r, t])}"
        tokens.append((text, classes[t]))
    pieces: list[tuple[str, str]] = []
    last, t = None, 0
    while t < len(tokens):
        text, cls = tokens[t]
        n = 1
        while t + n < len(tokens) and tokens[t + n] == tokens[t]:
            n += 1
        n = n if n >= RUN else 1
        if cls != last:
            pieces.append((TAGS[cls], cls))
            last = cls
        pieces.append((f"{text}×{n} " if n > 1 else text, cls))
        t += n
    return pieces


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
    return ["  " + "".join(f"\x1b[{COLOURS[cls]}m{text}" for text, cls in line) + "\x1b[0m"
            for line in lines]


def render(a: Audit, n: int, decode: Callable[[list[int]], str] | None, width: int = 100,
           colour: bool = False) -> str:
    """The first `n` rows of the batches read, marked, with a legend."""
    width = max(int(width) - 2, 20)
    lines = textwrap.wrap(f"objdebug batches: {a.source} (the objective ignores "
                          f"{', '.join(map(str, a.ignored())) or 'none of the values probed'})",
                          width + 2, subsequent_indent="  ")
    pairing = {PRE_SHIFTED: "labels are pre-shifted: each token is marked by its label, the token "
                            "after it (the last prompt token trains toward the answer's first)",
               UNSHIFTED: "labels are unshifted: each token is marked by its own label (the model "
                          "shifts)"}.get(a.layout)
    for entry in LEGEND + ([pairing] if pairing else []):
        lines += textwrap.wrap(entry, width + 2, subsequent_indent=" " * 14)
    lines.append("")
    total = sum(len(lay.padding) for lay in a.layouts)
    shown = 0
    for lay in a.layouts:
        classes = a.classes(lay)
        for r in range(len(lay.padding)):
            if shown == n:
                break
            count = {cls: int((classes[r] == cls).sum()) for cls in TAGS}
            lines += textwrap.wrap(f"batch {lay.batch.number} row {r}: {len(classes[r])} positions — "
                                   + ", ".join(f"{v} {k}" for k, v in count.items()), width + 2,
                                   subsequent_indent="    ")
            lines += _wrap(_pieces(lay, r, classes[r], decode), width, colour)
            shown += 1
    lines.append(f"{shown} of {total} rows read shown")
    return "\n".join(lines)


def decoder(cfg: Any) -> Callable[[list[int]], str] | None:
    """The configured tokenizer's decode (the built-in bytes one by default), or None."""
    from objdebug.engine.data import make_tokenizer

    try:
        return make_tokenizer(cfg.data.tokenizer, cfg.base_dir).decode
    except Exception:  # noqa: BLE001 - a tokenizer that cannot load: ids are shown
        return None
