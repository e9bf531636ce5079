"""OBJ030-OBJ035: preference batches (chosen / rejected columns) as the pipeline makes them.

Per pair (`pipeline/preference_batches.pair_facts`: each side's real tokens, which of them are
scored — the loss mask when there is one, else a label the objective does not ignore, probed on
the real objective as OBJ010 does — and where the two sides part): OBJ030 both answers follow the
same prompt tokens (LLaMA-Factory #4402: cut to different prompts); OBJ031 the prompt and the
padding are masked in both (OpenRLHF #294: the prompt masked in chosen only); OBJ032 each answer
has at least one scored token (TRL #6321: a response truncated to nothing, loss ln 2 or NaN);
OBJ033 no doubled BOS (axolotl #1616); OBJ034 the first response token is scored in both
(minimind #621: an off-by-one drops it); OBJ035 a `lens` column agrees with the real lengths
(PaddleFormers #4908, ms-swift #9925: lengths that count padding).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from objdebug.core.findings import Check, Condition, Verdict, listing
from objdebug.pipeline.pipeline_batches import real_batches
from objdebug.pipeline.preference_batches import PairFacts, is_pair_batch, pair_facts
from objdebug.pipeline.preference_columns import SIDES

EXAMPLES = 4


def pairs_of(ctx: Any, th: Any) -> list[PairFacts]:
    """Every pair read (once per run); the ignored label values probed on the objective."""
    def build() -> list[PairFacts]:
        from objdebug.stages.batches.audit import audit

        from objdebug.stages.batches.audit import no_label_objective

        d = ctx.config.data
        if no_label_objective(ctx):  # no labels-taking objective to probe: the declared value and -100
            return pair_facts(real_batches(ctx).batches, {d.label_pad_id, -100}, d.pad_id)
        try:
            ignored = set(audit(ctx, th).ignored()) or {d.label_pad_id}
        except Exception:  # noqa: BLE001 - a preference-only objective takes no labels to probe
            ignored = {d.label_pad_id, -100}
        return pair_facts(real_batches(ctx).batches, ignored, d.pad_id)
    return ctx.provide(pairs_of, build)


def _tokens(ids) -> str:
    return "[" + ", ".join(str(int(i)) for i in list(ids)[:8]) + (", …]" if len(ids) > 8 else "]")


class _PairCheck(Check):
    stage = "batches"

    def skip_reason(self, ctx: Any) -> str | None:
        if ctx.config.data.batches is None or not any(is_pair_batch(b) for b in real_batches(ctx).batches):
            return "the batches hold no chosen / rejected columns: not preference batches"
        return None


class PairPrompt(_PairCheck):
    """OBJ030: chosen and rejected follow the same prompt tokens."""

    name = "pair-same-prompt"

    def measure(self, ctx: Any, th: Any) -> dict[str, Any]:
        bad = []
        pairs = pairs_of(ctx, th)
        for f in pairs:
            starts = [f.start(s) for s in SIDES]
            if None in starts:
                continue
            if f.common < min(starts):  # they part before either answer is scored: different prompts
                at = f.common
                bad.append(f"{f.where}: they part at token {at} (chosen {_tokens(f.chosen.ids[at:at + 4])}, "
                           f"rejected {_tokens(f.rejected.ids[at:at + 4])}), before either answer "
                           f"starts (chosen at {starts[0]}, rejected at {starts[1]})")
        return {"pairs": len(pairs), "bad": bad}

    def conditions(self, th: Any) -> list[Condition]:
        def judge(v):
            if v["bad"]:
                return Verdict.FAIL, (f"chosen and rejected follow different prompt tokens in "
                                      f"{len(v['bad'])} of {v['pairs']} pairs: "
                                      f"{'; '.join(v['bad'][:EXAMPLES])}; the preference then "
                                      f"compares answers to different questions (prompts cut "
                                      f"differently)"), float(len(v["bad"]))
            return Verdict.PASS, f"chosen and rejected follow the same prompt in all {v['pairs']} pairs", 0.0

        return [Condition("OBJ030", "pair_same_prompt", judge)]


class PairMasking(_PairCheck):
    """OBJ031: the prompt and the padding are masked in both answers."""

    name = "pair-prompt-masked"

    def measure(self, ctx: Any, th: Any) -> dict[str, Any]:
        prompt, padding = [], []
        pairs = pairs_of(ctx, th)
        for f in pairs:
            starts = {s: f.start(s) for s in SIDES}
            if None not in starts.values():
                end = min(f.common, max(starts.values()))  # the shared prompt, as the later side masks it
                for s in SIDES:
                    n = int(getattr(f, s).scored[:end].sum())
                    if n:
                        prompt.append(f"{f.where} {s}: {n} prompt tokens scored (from token "
                                      f"{starts[s]}; the other answer from {max(starts.values())})")
            for s in SIDES:
                if getattr(f, s).scored_pad:
                    padding.append(f"{f.where} {s}: {getattr(f, s).scored_pad} padding positions")
        return {"pairs": len(pairs), "prompt": prompt, "padding": padding}

    def conditions(self, th: Any) -> list[Condition]:
        def judge(v):
            parts = []
            if v["prompt"]:
                parts.append(f"the prompt is scored in one answer and masked in the other in "
                             f"{len(v['prompt'])} answers ({'; '.join(v['prompt'][:EXAMPLES])})")
            if v["padding"]:
                parts.append(f"padding is scored in {len(v['padding'])} answers "
                             f"({listing(v['padding'], EXAMPLES)})")
            if parts:
                return Verdict.FAIL, (f"{'; '.join(parts)}: the log-prob difference then carries "
                                      f"tokens that are not the answer"), float(len(v["prompt"]) + len(v["padding"]))
            return Verdict.PASS, (f"the prompt and the padding are masked in both answers of all "
                                  f"{v['pairs']} pairs"), 0.0

        return [Condition("OBJ031", "pair_prompt_masked", judge)]


class PairResponse(_PairCheck):
    """OBJ032: each answer has at least one scored token."""

    name = "pair-response-scored"

    def measure(self, ctx: Any, th: Any) -> dict[str, Any]:
        empty, counts = [], {s: [] for s in SIDES}
        pairs = pairs_of(ctx, th)
        for f in pairs:
            for s in SIDES:
                n = int(getattr(f, s).scored.sum())
                counts[s].append(n)
                if n == 0:
                    empty.append(f"{f.where} {s} ({len(getattr(f, s).ids)} real tokens)")
        return {"pairs": len(pairs), "empty": empty,
                "fewest": {s: min(c) if c else 0 for s, c in counts.items()}}

    def conditions(self, th: Any) -> list[Condition]:
        def judge(v):
            if v["empty"]:
                return Verdict.FAIL, (f"{len(v['empty'])} answers have no scored token "
                                      f"({listing(v['empty'], EXAMPLES)}): a truncation cut the "
                                      f"response away; its log-prob is 0 (or 0/0 = NaN averaged), the "
                                      f"pair's loss a constant (ln 2 for sigmoid DPO)"), float(len(v["empty"]))
            return Verdict.PASS, (f"every answer of {v['pairs']} pairs has scored tokens (fewest: "
                                  f"chosen {v['fewest']['chosen']}, rejected {v['fewest']['rejected']})"), 0.0

        return [Condition("OBJ032", "pair_response_scored", judge)]


class PairBos(_PairCheck):
    """OBJ033: no answer opens with the BOS twice."""

    name = "pair-doubled-bos"

    def measure(self, ctx: Any, th: Any) -> dict[str, Any]:
        pairs = pairs_of(ctx, th)
        bos = _bos_of(ctx, pairs)  # data.bos_id, else the id every answer opens with
        doubled = [f"{f.where} {s}" for f in pairs for s in SIDES
                   if bos is not None and len(getattr(f, s).ids) > 1
                   and getattr(f, s).ids[0] == bos and getattr(f, s).ids[1] == bos]
        return {"pairs": len(pairs), "bos": bos, "declared": ctx.config.data.bos_id is not None,
                "doubled": doubled}

    def conditions(self, th: Any) -> list[Condition]:
        def judge(v):
            if v["bos"] is None:
                return Verdict.SKIP, "no BOS: data.bos_id is not set and the answers open with different ids", None
            said = "data.bos_id" if v["declared"] else "the id every answer opens with"
            if v["doubled"]:
                return Verdict.FAIL, (f"{len(v['doubled'])} answers open with the BOS ({v['bos']}, "
                                      f"{said}) twice ({listing(v['doubled'], EXAMPLES)}): the "
                                      f"template and the tokenizer both add it"), float(len(v["doubled"]))
            return Verdict.PASS, f"no answer of {v['pairs']} pairs opens with the BOS ({v['bos']}, {said}) twice", 0.0

        return [Condition("OBJ033", "pair_single_bos", judge)]


def _known_prompts(ctx: Any) -> list[tuple[int, ...]]:
    """The target's own prompts ([data] preference, align and scores rows, as objdebug frames
    them, and each without its leading token when that is the declared BOS), longest first; []
    where the target configures none (a row that cannot be read is not this check's business)."""
    from objdebug.pipeline.datasets import preference_rows, text_samples

    d, out = ctx.config.data, set()
    try:
        prompts = [r["prompt"] for r in preference_rows(ctx)] if d.preference else []
        prompts += [s.prompt for s in text_samples(ctx)] if (d.align or d.scores) else []
    except Exception:  # noqa: BLE001 - the stages that read those rows report them
        return []
    for p in prompts:
        p = tuple(int(t) for t in p)
        out.add(p)
        if d.bos_id is not None and p[:1] == (d.bos_id,):
            out.add(p[1:])
    return sorted((p for p in out if p), key=len, reverse=True)


def _prompt_end(f: PairFacts, prompts: list[tuple[int, ...]], lead: int | None) -> int | None:
    """Where the longest prompt of `prompts` that both answers start with ends (after the
    answers' own leading BOS tokens, `lead`), within the tokens they share; None: none does."""
    ids = f.chosen.ids
    skip = 0
    while lead is not None and skip < f.common and ids[skip] == lead:
        skip += 1
    for start in sorted({0, skip}, reverse=True):
        for p in prompts:
            end = start + len(p)
            if end <= f.common and tuple(ids[start:end].tolist()) == p:
                return end
    return None


def _response_starts(ctx: Any, pairs: list[PairFacts], bos: int | None) -> list[tuple[int | None, str]]:
    """Each pair's first response token and how it was found: from the prompt, not only from
    where the answers part (two answers that open alike, "The eel of Ivo" / "The eel of Eva",
    part after their first token, so an off-by-one dropping it in both showed nowhere):
    - "pair": the longest prompt another pair proves (its answers part where its scoring
      starts, so the tokens before are its prompt as the pipeline rendered it) both answers
      start with;
    - "prompt": else the longest of the target's own prompts (`_known_prompts`) they start with;
    - "parting": else where the sides part, or where both start scoring if earlier (the pair alone).
    A prompt found either way counts only where scoring starts at its end or one token after
    (the off-by-one): a later turn of the same conversation starts with an earlier turn's prompt
    too, and a template's assistant header after a configured prompt is no drop.
    """
    known = _known_prompts(ctx)
    proven = set()
    for f in pairs:
        starts = [f.start(s) for s in SIDES]
        if f.common and None not in starts and f.common <= min(starts):
            proven.add(tuple(f.chosen.ids[:f.common].tolist()))
    ways = (("pair", sorted(proven, key=len, reverse=True), None), ("prompt", known, bos))
    out = []
    for f in pairs:
        starts = [f.start(s) for s in SIDES]
        found = (f.response_start, "parting")
        for how, prompts, lead in ways:
            at = _prompt_end(f, prompts, lead) if prompts and None not in starts else None
            if at is not None and at <= min(starts) <= at + 1:
                found = (at, how)
                break
        out.append(found)
    return out


def _bos_of(ctx: Any, pairs: list[PairFacts]) -> int | None:
    """data.bos_id, else the id every answer opens with (OBJ033's reading)."""
    bos = ctx.config.data.bos_id
    if bos is None:
        firsts = Counter(int(getattr(f, s).ids[0]) for f in pairs for s in SIDES if len(getattr(f, s).ids))
        top = firsts.most_common(1)
        bos = top[0][0] if top and top[0][1] == sum(firsts.values()) and len(pairs) > 1 else None
    return bos


class PairFirstToken(_PairCheck):
    """OBJ034: the first response token is scored in both answers."""

    name = "pair-first-token"

    def measure(self, ctx: Any, th: Any) -> dict[str, Any]:
        pairs = pairs_of(ctx, th)
        dropped, judged, found_by = [], 0, Counter()
        for f, (at, how) in zip(pairs, _response_starts(ctx, pairs, _bos_of(ctx, pairs))):
            if at is None:
                continue
            judged += 1
            found_by[how] += 1
            for s in SIDES:
                side = getattr(f, s)
                if at < len(side.ids) and not side.scored[at]:
                    dropped.append(f"{f.where} {s}: token {at} ({int(side.ids[at])}) unscored, "
                                   f"scoring from {f.start(s)}")
        return {"pairs": judged, "dropped": dropped, "found_by": dict(found_by)}

    def conditions(self, th: Any) -> list[Condition]:
        def how(v):
            words = {"prompt": "the target's prompts", "pair": "another pair's prompt",
                     "parting": "where the answers part"}
            by = v.get("found_by", {})
            return ", ".join(f"{n} by {words[k]}" for k, n in sorted(by.items()) if n)

        def judge(v):
            if v["dropped"]:
                return Verdict.FAIL, (f"the first response token is not scored in "
                                      f"{len(v['dropped'])} answers ({'; '.join(v['dropped'][:EXAMPLES])}): "
                                      f"a mask one token too long (the answer's start found: {how(v)})"
                                      ), float(len(v["dropped"]))
            return Verdict.PASS, (f"the first response token is scored in both answers of all "
                                  f"{v['pairs']} pairs (the answer's start found: {how(v)})"), 0.0

        return [Condition("OBJ034", "pair_first_token_scored", judge)]


class PairLens(_PairCheck):
    """OBJ035: a lens column agrees with each answer's real length."""

    name = "pair-lens"

    def skip_reason(self, ctx: Any) -> str | None:
        reason = super().skip_reason(ctx)
        if reason:
            return reason
        if all("chosen_lens" not in b.columns for b in real_batches(ctx).batches):
            return "the batches have no chosen_lens / rejected_lens column"
        return None

    def measure(self, ctx: Any, th: Any) -> dict[str, Any]:
        pairs = pairs_of(ctx, th)
        bad, judged = [], 0
        for f in pairs:
            for s in SIDES:
                side = getattr(f, s)
                if side.lens_entry is not None:  # a pair found by the row's segments: its own entry
                    judged += 1
                    n, start = len(side.ids), f.start(s)
                    # a lens entry counts the pair's tokens (packers' sequence lengths) or its
                    # answer's (MindFormers' len(resp_ids)): from the first scored token, or the
                    # one before it where a pre-shifted mask leaves the answer's first unscored
                    fits = {n} | ({n - start, n - start + 1} if start is not None else set())
                    if side.lens_entry not in fits:
                        answer = f"its answer {n - start} or {n - start + 1}" if start is not None else "no answer scored"
                        bad.append(f"{f.where} {s}: lens entry {side.lens_entry}, the pair holds {n} real "
                                   f"tokens ({answer})")
                    continue
                if side.lens is None:
                    continue
                judged += 1
                total = int(np.sum(side.lens))
                fits = {side.row_length}
                start = f.start(s)
                if len(side.lens) == 1 and start is not None:  # one pair: its lens may count its answer
                    fits |= {side.row_length - start, side.row_length - start + 1}
                if total not in fits:
                    bad.append(f"batch {f.batch} row {f.row} {s}: lens {side.lens.tolist()} sum to "
                               f"{total}, the row holds {side.row_length} real tokens")
        return {"answers": judged, "bad": bad}

    def conditions(self, th: Any) -> list[Condition]:
        def judge(v):
            if v["bad"]:
                return Verdict.FAIL, (f"the lens column disagrees with the real length of "
                                      f"{len(v['bad'])} of {v['answers']} answers "
                                      f"({'; '.join(v['bad'][:EXAMPLES])}): lengths that count "
                                      f"padding (or miss the EOS) mis-place every packed answer"), float(len(v["bad"]))
            return Verdict.PASS, f"the lens column agrees with the real length of all {v['answers']} answers", 0.0

        return [Condition("OBJ035", "pair_lens_agree", judge)]


CHECKS = (PairPrompt, PairMasking, PairResponse, PairBos, PairFirstToken, PairLens)
