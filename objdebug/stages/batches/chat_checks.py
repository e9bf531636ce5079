"""OBJ023-OBJ028: conversations (`[chat]`) — every turn of a `train_on` role trained to its stop
token, nothing else.

Each real row is split into turns (`chat_roles.py`) and each token read as trained or not from
the labels the real objective trains (OBJ010's probe): OBJ023 the markers are found (a row
without them is said, never guessed); OBJ024 the content of each turn that should train is
trained; OBJ025 its stop token is trained ("the model never learns to stop": an end-of-turn token
outside the mask, GLM's next-role stop); OBJ026 no token of another role is trained (a template
without `{% generation %}`, history turns with `last_turn_only`); OBJ027 no role header and no
template-fixed span (an empty reasoning block, a preamble) is trained; OBJ028 a chat row's mask
is not all ones or all zeros. `eos_judged` lets OBJ020 judge only the EOS tokens that close a
turn that trains (an EOS after a user turn is rightly untrained).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from objdebug.core.findings import Check, Condition, Verdict, listing
from objdebug.stages.batches.audit import has_labels, no_label_objective
from objdebug.stages.batches.chat_roles import (CONTENT, FIXED, HEADER, PREAMBLE, STOP, RowRoles,
                                                roles_of, row_roles)

EXAMPLES = 4  # places named in a message


def _text(ctx: Any, ids: list[int]) -> str:
    from objdebug.engine.data import BytesTokenizer
    from objdebug.stages.batches.show import decoder, token_text

    roles = roles_of(ctx)
    if getattr(roles, "by_text", False) and not isinstance(roles.tok, BytesTokenizer):
        # the tokens' text as the row reads (special tokens kept), as the template path matched it
        text = "".join(roles.tok.pieces([int(i) for i in ids[:40]])).replace("\n", "⏎")
        return repr(text + ("…" if len(ids) > 40 else ""))
    decode = decoder(ctx.config)
    text = "".join(token_text(decode, i) for i in ids[:40])
    return repr(text + ("…" if len(ids) > 40 else ""))


def _expected(rr: RowRoles, roles: Any) -> list:
    """The turns that should train: of a train_on role; only the last of them with last_turn_only."""
    turns = [t for t in rr.turns if t.role in roles.train_on]
    return turns[-1:] if roles.last_turn_only else turns


class _ChatCheck(Check):
    stage = "batches"

    def skip_reason(self, ctx: Any) -> str | None:
        if getattr(ctx.config, "chat", None) is None:
            return "no [chat] section: the rows are not read as conversations"
        if no_label_objective(ctx):
            return no_label_objective(ctx)
        if not has_labels(ctx):
            return "the batches have no labels column: nothing trained to read"
        return None

    def prepare(self, ctx: Any, th: Any) -> None:
        if getattr(ctx.config, "chat", None) is not None:
            roles_of(ctx)  # a template that does not render / markers outside the vocabulary: exit 2 now

    def rows(self, ctx: Any, th: Any) -> tuple[list[RowRoles], Any]:
        return row_roles(ctx, th), roles_of(ctx)

    def ids(self, ctx: Any, th: Any, rr: RowRoles, positions: list[int]) -> list[int]:
        from objdebug.stages.batches.audit import audit

        for lay in audit(ctx, th).layouts:
            if lay.batch.number == rr.batch:
                real = lay.batch.input_ids[rr.row][~lay.padding[rr.row]]
                return [int(real[p]) for p in positions]
        return []


class ChatMarkers(_ChatCheck):
    """OBJ023: every chat row's role markers are found."""

    name = "chat-markers"

    def measure(self, ctx: Any, th: Any) -> dict[str, Any]:
        rows, roles = self.rows(ctx, th)
        none, no_train, turns = [], [], Counter()
        for rr in rows:
            if not len(rr.kind):
                continue
            if not rr.turns:
                none.append(rr.where)
            elif not _expected(rr, roles):
                no_train.append(rr.where)
            turns.update(t.role for t in rr.turns)
        return {"rows": sum(1 for rr in rows if len(rr.kind)), "none": none, "no_train": no_train,
                "turns": dict(turns), "how": roles.how, "headers": roles.texts,
                "train_on": list(roles.train_on), "next_role": roles.next_role}

    def conditions(self, th: Any) -> list[Condition]:
        def judge(v):
            said = ", ".join(f"{r} {h!r}" for r, h in v["headers"].items())
            if v["none"]:
                return Verdict.FAIL, (f"no role marker found in {len(v['none'])} of {v['rows']} rows "
                                      f"({listing(v['none'], EXAMPLES)}): their tokens hold none of "
                                      f"the headers of {v['how']} ({said}); their roles are not "
                                      f"audited (not guessed): the template or markers do not match "
                                      f"the batches, or every label there is masked"), float(len(v["none"]))
            extra = (f"; {len(v['no_train'])} rows hold no {'/'.join(v['train_on'])} turn "
                     f"({listing(v['no_train'], EXAMPLES)})") if v["no_train"] else ""
            turns = ", ".join(f"{n} {r}" for r, n in sorted(v["turns"].items()))
            return Verdict.PASS, (f"roles found in all {v['rows']} rows by {v['how']}: {turns} "
                                  f"turns{', each closed by the next header (next-role)' if v['next_role'] else ''}"
                                  f"{extra}"), 0.0

        return [Condition("OBJ023", "chat_markers_found", judge)]


class ChatContentTrained(_ChatCheck):
    """OBJ024: the content of every turn that should train is trained."""

    name = "chat-content-trained"

    def measure(self, ctx: Any, th: Any) -> dict[str, Any]:
        rows, roles = self.rows(ctx, th)
        untrained, by_role, turns, only_last = [], Counter(), 0, []
        for rr in rows:
            expected = _expected(rr, roles)
            stops = {p: t.role for t in rr.turns for p in t.stop}  # next-role: a header token is a stop
            for k in np.nonzero(rr.trained)[0]:
                label = f"{stops[k]} stop" if k in stops else \
                    (rr.role[k] or "outside turns") + ("" if rr.kind[k] == CONTENT else f" {rr.kind[k]}")
                by_role[label] += 1
            missed = []
            for t in expected:
                turns += 1
                b, e = t.content
                off = [p for p in range(b, e) if not rr.trained[p]]
                if off:
                    missed.append(t)
                    if len(untrained) < 50:
                        untrained.append({"at": rr.where, "turn": t.number, "role": t.role,
                                          "untrained": len(off), "tokens": e - b,
                                          "text": _text(ctx, self.ids(ctx, th, rr, off))})
            if len(expected) > 1 and missed and expected[-1] not in missed \
                    and len(missed) == len(expected) - 1:
                only_last.append(rr.where)
        count = sum(1 for rr in rows for t in _expected(rr, roles)
                    if any(not rr.trained[p] for p in range(*t.content)))
        return {"turns": turns, "missed": count, "untrained": untrained, "by_role": dict(by_role),
                "train_on": list(roles.train_on), "only_last": only_last}

    def conditions(self, th: Any) -> list[Condition]:
        def judge(v):
            roles = "/".join(v["train_on"])
            share = ", ".join(f"{k} {n}" for k, n in sorted(v["by_role"].items(), key=lambda x: -x[1])) or "none"
            if v["missed"]:
                where = "; ".join(f"{u['at']} turn {u['turn']} ({u['role']}): {u['untrained']} of "
                                  f"{u['tokens']} content tokens untrained {u['text']}"
                                  for u in v["untrained"][:EXAMPLES])
                last = (f"; only the last {roles} turn trains in {len(v['only_last'])} rows (set "
                        f"[chat] last_turn_only = true if that is meant)") if v["only_last"] else ""
                return Verdict.FAIL, (f"{v['missed']} of {v['turns']} {roles} turns have content "
                                      f"the objective does not train: {where}{last} (trained "
                                      f"tokens by role: {share})"), float(v["missed"])
            return Verdict.PASS, (f"the content of all {v['turns']} {roles} turns is trained "
                                  f"(trained tokens by role: {share})"), 0.0

        return [Condition("OBJ024", "chat_content_trained", judge)]


class ChatStopTrained(_ChatCheck):
    """OBJ025: the stop token(s) closing each turn that trains are trained."""

    name = "chat-stop-trained"

    def measure(self, ctx: Any, th: Any) -> dict[str, Any]:
        rows, roles = self.rows(ctx, th)
        closed = truncated = 0
        untrained = []
        for rr in rows:
            for t in _expected(rr, roles):
                if not t.stop:
                    truncated += 1
                    continue
                closed += 1
                off = [p for p in t.stop if not rr.trained[p]]
                if off:
                    untrained.append({"at": rr.where, "turn": t.number, "role": t.role,
                                      "text": _text(ctx, self.ids(ctx, th, rr, t.stop)),
                                      "position": int(t.stop[0])})
        return {"closed": closed, "truncated": truncated, "untrained": untrained,
                "next_role": roles.next_role, "train_on": list(roles.train_on)}

    def conditions(self, th: Any) -> list[Condition]:
        def judge(v):
            roles = "/".join(v["train_on"])
            how = " (the next role's header: next-role)" if v["next_role"] else ""
            cut = f"; {v['truncated']} turns cut before their stop" if v["truncated"] else ""
            if v["untrained"]:
                where = "; ".join(f"{u['at']} turn {u['turn']} ({u['role']}): {u['text']} at real "
                                  f"token {u['position']}" for u in v["untrained"][:EXAMPLES])
                return Verdict.FAIL, (f"the stop token{how} of {len(v['untrained'])} of "
                                      f"{v['closed']} {roles} turns is not trained: the model never "
                                      f"learns to stop: {where}{cut}"), float(len(v["untrained"]))
            if not v["closed"]:
                return Verdict.SKIP, f"no {roles} turn holds its stop token{cut}", None
            return Verdict.PASS, (f"the stop token{how} of all {v['closed']} {roles} turns is "
                                  f"trained{cut}"), 0.0

        return [Condition("OBJ025", "chat_stop_trained", judge)]


def _spans(rr: RowRoles, hit: np.ndarray) -> list[tuple[int, str, int]]:
    """(turn, role, tokens) of each turn holding hit positions (turn 0: before the first turn)."""
    out = Counter()
    for k in np.nonzero(hit)[0]:
        out[(int(rr.turn[k]), rr.role[k] or "preamble")] += 1
    return [(t, r, n) for (t, r), n in sorted(out.items())]


class ChatOtherRolesUntrained(_ChatCheck):
    """OBJ026: no token of a role outside train_on (nor of a history turn, last_turn_only) trained."""

    name = "chat-other-roles"

    def measure(self, ctx: Any, th: Any) -> dict[str, Any]:
        rows, roles = self.rows(ctx, th)
        total, found, count = 0, [], Counter()
        for rr in rows:
            keep = {t.number for t in _expected(rr, roles)}
            stops = {p for t in rr.turns if t.number in keep for p in t.stop}
            other = np.array([rr.turn[k] > 0 and rr.turn[k] not in keep and rr.kind[k] in (CONTENT, STOP)
                              and k not in stops for k in range(len(rr.kind))], bool)
            hit = other & rr.trained
            total += int(other.sum())
            for turn, role, n in _spans(rr, hit):
                count[role] += n
                if len(found) < 50:
                    pos = [k for k in np.nonzero(hit)[0] if rr.turn[k] == turn]
                    found.append({"at": rr.where, "turn": turn, "role": role, "tokens": n,
                                  "text": _text(ctx, self.ids(ctx, th, rr, pos))})
        return {"positions": total, "trained": dict(count), "found": found,
                "train_on": list(roles.train_on), "last_only": roles.last_turn_only}

    def conditions(self, th: Any) -> list[Condition]:
        def judge(v):
            n = sum(v["trained"].values())
            if n:
                roles = ", ".join(f"{r} {k}" for r, k in sorted(v["trained"].items()))
                where = "; ".join(f"{f['at']} turn {f['turn']} ({f['role']}): {f['tokens']} tokens "
                                  f"{f['text']}" for f in v["found"][:EXAMPLES])
                history = " (history turns: [chat] last_turn_only = true)" if v["last_only"] else ""
                return Verdict.FAIL, (f"{n} tokens of turns that should not train are trained "
                                      f"({roles}){history}: {where}; the model learns to write the "
                                      f"user's side (a template without {{% generation %}}: the "
                                      f"assistant mask came back all ones)"), float(n)
            return Verdict.PASS, (f"none of the {v['positions']} tokens of turns outside "
                                  f"{'/'.join(v['train_on'])} is trained"), 0.0

        return [Condition("OBJ026", "chat_other_roles_untrained", judge)]


class ChatTemplateTokensUntrained(_ChatCheck):
    """OBJ027: no role header, preamble or template-fixed span (empty reasoning block) trained."""

    name = "chat-template-tokens"

    def measure(self, ctx: Any, th: Any) -> dict[str, Any]:
        rows, roles = self.rows(ctx, th)
        total, found, kinds = 0, [], Counter()
        for rr in rows:
            keep = {t.number for t in _expected(rr, roles)}
            stops = {p for t in rr.turns if t.number in keep for p in t.stop}  # next-role's stop is a header token
            fixed = np.array([rr.kind[k] in (HEADER, FIXED, PREAMBLE) and k not in stops
                              for k in range(len(rr.kind))], bool)
            hit = fixed & rr.trained
            total += int(fixed.sum())
            for k in np.nonzero(hit)[0]:
                kinds[rr.kind[k]] += 1
            for turn, role, n in _spans(rr, hit):
                if len(found) < 50:
                    pos = [k for k in np.nonzero(hit)[0] if rr.turn[k] == turn]
                    found.append({"at": rr.where, "turn": turn, "role": role, "tokens": n,
                                  "kind": "/".join(sorted({rr.kind[k] for k in pos})),
                                  "text": _text(ctx, self.ids(ctx, th, rr, pos))})
        return {"positions": total, "kinds": dict(kinds), "found": found}

    def conditions(self, th: Any) -> list[Condition]:
        def judge(v):
            n = sum(v["kinds"].values())
            if n:
                kinds = ", ".join(f"{k} {c}" for k, c in sorted(v["kinds"].items()))
                where = "; ".join(f"{f['at']} turn {f['turn']} ({f['role']} {f['kind']}): "
                                  f"{f['tokens']} tokens {f['text']}" for f in v["found"][:EXAMPLES])
                return Verdict.FAIL, (f"{n} template tokens are trained ({kinds}): {where}; the "
                                      f"template writes them, the model never has to (a role header "
                                      f"or an empty reasoning block in the mask)"), float(n)
            return Verdict.PASS, (f"none of the {v['positions']} template tokens (role headers, "
                                  f"fixed spans, preamble) is trained"), 0.0

        return [Condition("OBJ027", "chat_template_tokens_untrained", judge)]


class ChatMaskShape(_ChatCheck):
    """OBJ028: a chat row's mask is neither all ones nor all zeros."""

    name = "chat-mask-shape"

    def measure(self, ctx: Any, th: Any) -> dict[str, Any]:
        rows, _ = self.rows(ctx, th)
        ones, zeros, chat = [], [], 0
        for rr in rows:
            if not rr.turns:
                continue
            chat += 1
            scored = rr.trained[1:]
            if scored.size and scored.all():
                ones.append(rr.where)
            elif not rr.trained.any():
                zeros.append(rr.where)
        return {"rows": chat, "ones": ones, "zeros": zeros}

    def conditions(self, th: Any) -> list[Condition]:
        def judge(v):
            parts = []
            if v["ones"]:
                parts.append(f"every token trained in {len(v['ones'])} rows "
                             f"({listing(v['ones'], EXAMPLES)}): system, user and tool tokens too")
            if v["zeros"]:
                parts.append(f"no token trained in {len(v['zeros'])} rows "
                             f"({listing(v['zeros'], EXAMPLES)}): nothing is learned there")
            if parts:
                return Verdict.FAIL, (f"the mask of {len(v['ones']) + len(v['zeros'])} of {v['rows']} "
                                      f"conversation rows is degenerate: {'; '.join(parts)} (an "
                                      f"assistant mask from a template without {{% generation %}} "
                                      f"markers)"), float(len(v["ones"]) + len(v["zeros"]))
            return Verdict.PASS, f"the mask of all {v['rows']} conversation rows selects some tokens and not others", 0.0

        return [Condition("OBJ028", "chat_mask_not_degenerate", judge)]


def eos_judged(ctx: Any, th: Any, lay: Any, r: int) -> np.ndarray | None:
    """bool [T] over the batch's columns: the EOS positions OBJ020 should judge with `[chat]` (those
    outside any turn or in a turn that trains); None without `[chat]`."""
    if getattr(ctx.config, "chat", None) is None:
        return None
    roles = roles_of(ctx)
    for rr in row_roles(ctx, th):
        if rr.batch == lay.batch.number and rr.row == r:
            keep = {t.number for t in _expected(rr, roles)}
            real = np.nonzero(~lay.padding[r])[0]
            out = np.ones(lay.padding.shape[1], bool)
            out[real] = [rr.turn[k] == 0 or rr.turn[k] in keep or rr.kind[k] == STOP
                         and rr.turn[k] in keep for k in range(len(real))]
            return out
    return None


CHECKS = (ChatMarkers, ChatContentTrained, ChatStopTrained, ChatOtherRolesUntrained,
          ChatTemplateTokensUntrained, ChatMaskShape)
