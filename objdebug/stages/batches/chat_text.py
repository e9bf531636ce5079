"""A row read as the text its tokens decode to, split into turns by a chat template's texts
(`[chat] template`): one mapping from rendered text to tokens for every template-path check.

The row's ids are decoded token by token (`tokenizer.pieces`, special tokens kept), so each token
owns a character span of the row's text. The template's texts (each role's headers, closings,
tails: `pipeline/chat_template.py`) are found in that text, and every character gets a kind
(header, fixed, content, stop, tail, preamble) and a turn. A token then takes the kind of its
characters, by one rule for every check: a token holding any content character is content (a
merge of a header's "\\n" with the answer's first letters trains when the answer does), else any
stop character makes it the stop, else header, fixed, tail, preamble in that order. Why not
match id sequences: a tokenizer's ids for a header alone differ from the row's wherever it
merges across the header's border or writes a sentencepiece dummy-prefix "▁" (a pipeline that
encodes each piece on its own has one at every piece). The dummy prefix is the one text the
template does not write: with a tokenizer that has special tokens (a sentencepiece / HF one), one
optional space is allowed before each piece of a template text (a segment starts after each
special token, and wherever a pipeline cuts the text to encode it apart) and kept in that
text's span; a byte tokenizer's rows hold the template's text exactly. numpy only.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from objdebug.stages.batches.chat_turn import CONTENT, FIXED, HEADER, PREAMBLE, STOP, TAIL, Turn

_RANK = {CONTENT: 5, STOP: 4, HEADER: 3, FIXED: 2, TAIL: 1, PREAMBLE: 0}


def pattern(text: str, specials: list[str], lead: bool = False) -> re.Pattern:
    """`text` as a regex that lets a dummy-prefix space open any piece of it: a tokenizer starts a
    segment after each special token, and a pipeline that encodes pieces apart starts one
    wherever it cuts (`lead`: before the text itself too). Only spaces are added; every
    character of `text` must be there, in order."""
    marks = sorted((s for s in specials if s and s in text), key=len, reverse=True)
    parts = re.split("(" + "|".join(re.escape(m) for m in marks) + ")", text) if marks else [text]
    atoms = []  # a special token whole, else one character
    for k, part in enumerate(parts):
        atoms += [part] if k % 2 else list(part)
    atoms = [a for a in atoms if a]
    if not atoms or not specials:  # a byte tokenizer writes no dummy prefix: the text exactly
        return re.compile(re.escape(text))
    out = ["(?: )?"] if lead and not text.startswith(" ") else []
    for k, atom in enumerate(atoms):
        if k and atom != " " and atoms[k - 1] != " ":
            out.append("(?: )?")
        out.append(re.escape(atom))
    return re.compile("".join(out))


def _patterns(roles: Any) -> dict:
    cached = getattr(roles, "_patterns", None)
    if cached is None:
        specials = roles.tok.specials() if hasattr(roles.tok, "specials") else []
        cached = {"headers": {r: [(pattern(v, specials), v) for v in vs] for r, vs in roles.header_texts.items()},
                  "base": {r: pattern(min(vs, key=len), specials) for r, vs in roles.header_texts.items()},
                  "closing": {r: pattern(v, specials) for r, v in roles.closing_texts.items() if v}}
        roles._patterns = cached
    return cached


def split_text(ids: np.ndarray, roles: Any, eos_id: int | None):
    """(turns, role [n], kind [n], turn [n]) of one row's real tokens, read as text."""
    n = len(ids)
    pieces = roles.tok.pieces([int(i) for i in ids])
    ends = np.cumsum([len(p) for p in pieces]) if n else np.zeros(0, int)
    starts = ends - np.array([len(p) for p in pieces], int) if n else np.zeros(0, int)
    text = "".join(pieces)
    pats = _patterns(roles)
    found = []
    for role, variants in pats["headers"].items():
        for pat, _ in variants:
            found += [(m.start(), -(m.end() - m.start()), role) for m in pat.finditer(text)]
    found.sort()
    heads, end = [], -1
    for s, neg, role in found:  # the longest header at a place; none inside another
        if s >= end:
            heads.append((s, s - neg, role))
            end = s - neg
    ckind = np.full(len(text), PREAMBLE, object)
    cturn = np.zeros(len(text), int)
    closed_turns = []  # per turn: its closing found (False: the row ends inside it)
    for k, (s, e, role) in enumerate(heads):
        limit = heads[k + 1][0] if k + 1 < len(heads) else len(text)
        cturn[s:limit] = k + 1
        base = pats["base"][role].match(text, s)
        hend = base.end() if base else e
        ckind[s:hend], ckind[hend:e] = HEADER, FIXED  # beyond the shortest header: template-fixed
        cend, closed = limit, False
        close = pats["closing"].get(role)
        if close is not None and not roles.next_role:
            m = close.search(text, e, limit)
            if m:
                cend, closed = m.start(), True
                ckind[m.start():m.end()] = STOP
                ckind[m.end():limit] = TAIL  # "\n" after <|im_end|>, an appended EOS: neither
        ckind[e:cend] = CONTENT
        closed_turns.append(closed)
    kind = np.full(n, "", object)
    turn_of = np.zeros(n, int)
    for j in range(n):
        a, b = int(starts[j]), int(ends[j])
        if b <= a:  # a token with no text of its own: as the character it stands at
            at = min(a, len(text) - 1)
            kind[j], turn_of[j] = (ckind[at], cturn[at]) if len(text) else (PREAMBLE, 0)
            continue
        ks = ckind[a:b]
        best = max(set(ks), key=_RANK.__getitem__)
        kind[j] = best
        turn_of[j] = int(cturn[a:b][list(ks).index(best)])
    role = np.array([heads[t - 1][2] if t else "" for t in turn_of], object)
    turns = []
    for k, (s, e, name) in enumerate(heads):
        number = k + 1
        mine = np.nonzero(turn_of == number)[0]
        start = int(mine[0]) if mine.size else int(np.searchsorted(ends, s, side="right"))
        content = [j for j in mine if kind[j] == CONTENT]
        stop = [int(j) for j in mine if kind[j] == STOP]
        truncated = False
        if roles.next_role:
            if k + 1 < len(heads):
                nxt = np.nonzero(turn_of == number + 1)[0]
                stop = [int(nxt[0])] if nxt.size else []
            elif eos_id is not None and n and ids[n - 1] == eos_id and turn_of[n - 1] == number:
                kind[n - 1] = STOP
                stop = [n - 1]
                content = [j for j in content if j != n - 1]
            else:
                truncated = True
        elif not closed_turns[k]:
            truncated = True
        after_header = [j for j in mine if kind[j] not in (HEADER, FIXED)]
        begin = int(content[0]) if content else (int(after_header[0]) if after_header else start)
        cend = int(content[-1]) + 1 if content else begin
        turns.append(Turn(name, number, start, (begin, cend), stop, truncated))
    return turns, role, kind, turn_of
