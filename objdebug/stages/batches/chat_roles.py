"""Each real row split into turns by role (`[chat]`), read against what the objective trains.

A turn starts where a role's header (`pipeline/chat_template.py`: derived from the template or
declared) is found in the row's real tokens; its content runs to its closing (the role's stop
ids; a whitespace tail after them), or, with "next-role" (GLM), to the next header, whose first
token is then the turn's stop, or to a final EOS. Tokens before the first header are the
preamble (BOS, `[gMASK]<sop>`); a template-fixed span right after an assistant header (an empty
`<think></think>` block) is FIXED. With a template or markers as strings the row is read as
its decoded text instead (`chat_text.py`: one character-to-token mapping that a tokenizer's
merges and dummy prefixes do not move); markers as ids are matched here as id sequences. numpy only; whether a label is ignored comes from the real
objective (`audit.Audit.classes`, OBJ010's probe).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from objdebug.stages.batches.audit import TRAINED, audit
from objdebug.stages.batches.chat_turn import CONTENT, FIXED, HEADER, PREAMBLE, STOP, TAIL, Turn  # noqa: F401 (re-exported)
from objdebug.stages.batches.layout import PRE_SHIFTED


@dataclass
class RowRoles:
    batch: int
    row: int
    turns: list[Turn]
    role: np.ndarray         # object [T]: the role each position belongs to ("" outside turns)
    kind: np.ndarray         # object [T]: PREAMBLE / HEADER / CONTENT / STOP / TAIL / FIXED ("" padding)
    turn: np.ndarray         # int [T]: the 1-based turn of each position (0: none)
    trained: np.ndarray      # bool [T]: the token at this position is a trained target (measured)

    @property
    def where(self) -> str:
        return f"batch {self.batch} row {self.row}"


def _find(ids: np.ndarray, seq: list[int], start: int = 0) -> list[int]:
    n = len(seq)
    if not n or len(ids) < n:
        return []
    hits = np.ones(len(ids) - n + 1, bool)
    for k, v in enumerate(seq):
        hits &= ids[k:len(ids) - n + 1 + k] == v
    return [int(i) for i in np.nonzero(hits)[0] if i >= start]


def _match(ids: np.ndarray, at: int, seq: list[int]) -> bool:
    return bool(seq) and at + len(seq) <= len(ids) and bool((ids[at:at + len(seq)] == seq).all())


def split_row(ids: np.ndarray, roles: Any, eos_id: int | None) -> tuple[list[Turn], np.ndarray, np.ndarray, np.ndarray]:
    """(turns, role [n], kind [n], turn [n]) of one row's real tokens `ids`."""
    if getattr(roles, "by_text", False):  # [chat] template: the row read as its text
        from objdebug.stages.batches.chat_text import split_text

        return split_text(ids, roles, eos_id)
    n = len(ids)
    role, kind, turn_of = np.full(n, "", object), np.full(n, "", object), np.zeros(n, int)
    starts = []
    for name, header in roles.headers.items():
        starts += [(s, -len(header), name) for s in _find(ids, header)]
    starts.sort()
    heads, end = [], -1
    for s, neg, name in starts:  # the longest header at a position; none inside another
        if s >= end:
            heads.append((s, name, -neg))
            end = s - neg
    turns: list[Turn] = []
    kind[:heads[0][0] if heads else n] = PREAMBLE
    for k, (s, name, length) in enumerate(heads):
        number, begin = k + 1, s + length
        limit = heads[k + 1][0] if k + 1 < len(heads) else n
        role[s:limit], turn_of[s:limit] = name, number
        kind[s:begin] = HEADER
        for span in roles.fixed:  # an empty reasoning block the template puts after the header
            if _match(ids, begin, span):
                kind[begin:begin + len(span)] = FIXED
                begin += len(span)
                break
        stop_ids, stop, cend, truncated = roles.closing.get(name, []), [], limit, False
        if stop_ids and not roles.next_role:
            found = _find(ids[:limit], stop_ids, begin)
            if found:
                cend = found[0]
                stop = list(range(cend, cend + len(stop_ids)))
                kind[cend:cend + len(stop_ids)] = STOP
                after = cend + len(stop_ids)
                kind[after:limit] = TAIL  # "\n" after <|im_end|>: the template's, trained or not
            else:
                truncated = True
        elif k + 1 < len(heads):  # next-role: the next header's first token closes this turn
            stop = [limit]
        elif eos_id is not None and n and ids[n - 1] == eos_id and n - 1 >= begin:
            cend, stop = n - 1, [n - 1]
            kind[n - 1] = STOP
        else:
            truncated = True
        kind[begin:cend] = CONTENT
        turns.append(Turn(name, number, s, (begin, cend), stop, truncated))
    return turns, role, kind, turn_of


def trained_tokens(classes: np.ndarray, layout: str | None) -> np.ndarray:
    """bool [T]: the input token at j is a trained target (its label's class is TRAINED):
    pre-shifted labels predict j from position j-1, unshifted ones carry it at j."""
    hit = classes == TRAINED
    if layout == PRE_SHIFTED:
        out = np.zeros_like(hit)
        out[1:] = hit[:-1]
        return out
    out = hit.copy()
    out[:1] = False  # nothing predicts the first token
    return out


def row_roles(ctx: Any, th: Any) -> list[RowRoles]:
    """Every real row read, split into turns, with its trained tokens (once per run)."""
    def build() -> list[RowRoles]:
        roles = roles_of(ctx)
        a = audit(ctx, th)
        eos = ctx.config.data.eos_id
        out = []
        for lay in a.layouts:
            classes = a.classes(lay)
            for r in range(len(lay.padding)):
                real = np.nonzero(~lay.padding[r])[0]
                ids = lay.batch.input_ids[r][real]
                turns, role, kind, turn = split_row(ids, roles, eos)
                trained = trained_tokens(classes[r], a.layout)[real] if lay.batch.labels is not None \
                    else np.zeros(len(real), bool)
                out.append(RowRoles(lay.batch.number, r, turns, role, kind, turn, trained))
        return out
    return ctx.provide(row_roles, build)


def roles_of(ctx: Any) -> Any:
    """The run's resolved `[chat]` (once per run; InputError on a bad template or markers)."""
    from objdebug.pipeline.chat_template import chat_roles

    return ctx.provide(roles_of, lambda: chat_roles(ctx.config, ctx.engine.vocab_size()))
