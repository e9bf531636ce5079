"""Loaded data shared by all stages, cached per run on the Context.

- `encoder(ctx)`: tokenizer checked against the model's vocabulary.
- `align_rows(ctx)`: data.align rows with good / medium / bad Samples (or synthesized ones).
- `score_rows(ctx)`: data.scores rows with a response Sample and human scores.
- `text_rows(ctx)`: data.text, a plain corpus (JSONL {id, text} rows or one document a line).
- `text_samples(ctx, n)`: ordinary (good / reference) samples for gradient and stress stages.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from objdebug.pipeline.context import Context
from objdebug.engine.data import Encoder, Sample, frame, make_tokenizer, read_jsonl
from objdebug.core.errors import InputError
from objdebug.core.findings import listing

KINDS = ("good", "medium", "bad")


def encoder(ctx: Context) -> Encoder:
    """The tokenizer and the model's vocabulary (`Engine.vocab_size`: the model's, never the byte
    tokenizer's 256), checked against each other (shared by all stages)."""
    def build() -> Encoder:
        cfg = ctx.config.data
        tok = make_tokenizer(cfg.tokenizer, ctx.config.base_dir)
        vocab = ctx.engine.vocab_size()
        where = ctx.engine.vocab_source
        if vocab is not None and cfg.tokenizer != "bytes" and tok.vocab_size > vocab:
            # the byte tokenizer is no statement about the model: its text ids are checked one by one
            raise InputError(f"vocabulary mismatch: tokenizer '{tok.name}' has {tok.vocab_size} "
                             f"tokens but the model has {vocab} ({where})", source=ctx.config.source)
        if vocab is not None:
            if not 0 <= cfg.pad_id < vocab:
                raise InputError(f"For 'data.pad_id', the value must be in [0, {vocab}), but got "
                                 f"{cfg.pad_id}.", source=ctx.config.source)
            for key in ("bos_id", "eos_id"):
                value = getattr(cfg, key)
                if value is not None and not 0 <= value < vocab:
                    raise InputError(f"For 'data.{key}', the value must be in [0, {vocab}), but got "
                                     f"{value}.", source=ctx.config.source)
        return Encoder(tokenizer=tok, vocab_size=vocab, vocab_from=where)
    return ctx.provide(encoder, build)


def _framed(ctx: Context, prompt: list[int], response: list[int]) -> tuple[list[int], list[int]]:
    """[data] bos_id / eos_id applied (data.frame): what the model saw in training."""
    return frame(prompt, response, ctx.config.data.bos_id, ctx.config.data.eos_id)


def _synthesize(good: list[int], kind: str, rng: np.random.Generator, vocab: int, pad_id: int) -> list[int]:
    if kind == "shuffled":
        out = list(good)
        rng.shuffle(out)
        return out
    if kind == "random":
        choices = np.array([i for i in range(vocab) if i != pad_id])
        return [int(i) for i in rng.choice(choices, size=len(good))]
    if kind == "repeat":
        return [good[0]] * len(good)
    raise ValueError(kind)


def _check_lengths(ctx: Context, rows: list[dict[str, Any]], path: str) -> None:
    """Rows longer than the model takes (its position table) are named, file:line, before any
    MindSpore call fails on them with an index error."""
    limit = ctx.engine.max_length
    if not limit:
        return
    long = [(r["line"], r["id"], max(s.length for s in _samples_of(r))) for r in rows
            if max(s.length for s in _samples_of(r)) > limit]
    if long:
        line, rid, n = long[0]
        more = f"; {len(long)} rows are too long (lines {listing([x[0] for x in long])})" \
            if len(long) > 1 else ""
        raise InputError(f"row '{rid}' has {n} tokens (prompt + answer), more than the model's "
                         f"{limit} positions (data.max_length or the model's position table){more}; "
                         f"shorten these rows or remove them", source=path, line=line)


def _samples_of(row: dict[str, Any]) -> list[Sample]:
    return list(row["samples"].values()) if "samples" in row else [row["sample"]]


def _with_ids(lines, path) -> Iterator[tuple[int, dict[str, Any], str]]:
    """(line, row, id) of each row: the row's `id`, or `line<N>`; an id used twice is an error
    naming the file and the second line."""
    seen: set[str] = set()
    for lineno, raw in lines:
        rid = str(raw.get("id", f"line{lineno}"))
        if rid in seen:
            raise InputError(f"duplicate id '{rid}'", source=str(path), line=lineno)
        seen.add(rid)
        yield lineno, raw, rid


def align_rows(ctx: Context) -> list[dict[str, Any]]:
    """Rows of {id, line, samples: {kind: Sample}, synthetic: [kinds]} from data.align."""
    def build() -> list[dict[str, Any]]:
        path = ctx.config.data.align
        enc = replace(encoder(ctx), source=str(path))  # errors name this file
        synthesize = ctx.options.synthesize
        rng = np.random.default_rng(ctx.profile.section("align")["seed"])
        rows = []
        for lineno, raw, rid in _with_ids(read_jsonl(path, "align"), path):
            prompt = enc.field(raw, "prompt", lineno)
            answers = {k: enc.field(raw, k, lineno, required=(k == "good")) for k in KINDS}
            for kind in KINDS:  # an empty 'bad' scores 0 tokens: it would pass any ordering
                if answers[kind] is not None and not answers[kind]:
                    raise InputError(f"field '{kind}' is empty", source=str(path), line=lineno)
            synthetic = []
            if answers["bad"] is None and answers["medium"] is None:
                if not synthesize:
                    raise InputError("row has only 'good'; add 'bad' (and 'medium') answers or pass "
                                     "--synthesize to generate counterparts", source=str(path), line=lineno)
                for kind, how in (("medium", "shuffled"), ("bad", "random"), ("repeat", "repeat")):
                    answers[kind] = _synthesize(answers["good"], how, rng, enc.id_range,
                                                ctx.config.data.pad_id)
                    synthetic.append(f"{kind}={how}")
            elif answers["bad"] is None:
                raise InputError("row has 'medium' but no 'bad' answer", source=str(path), line=lineno)
            samples = {k: Sample(id=rid, prompt=framed[0], response=framed[1], kind=k)
                       for k, v in answers.items() if v is not None
                       for framed in [_framed(ctx, prompt, v)]}
            rows.append({"id": rid, "line": lineno, "samples": samples, "synthetic": synthetic})
        _check_lengths(ctx, rows, str(path))
        return rows
    rows = ctx.provide(align_rows, build)
    plan_buckets(ctx)
    return rows


def score_rows(ctx: Context) -> list[dict[str, Any]]:
    """Rows of {id, line, sample, score, aspects: {name: score}} from data.scores.

    A row has `response` (or `response_ids`), optional `prompt`, a numeric `score`, and optionally
    `scores`: {aspect: number} for per-aspect human ratings.
    """
    def build() -> list[dict[str, Any]]:
        path = ctx.config.data.scores
        enc = replace(encoder(ctx), source=str(path))
        rows = []
        for lineno, raw, rid in _with_ids(read_jsonl(path, "scores"), path):
            prompt = enc.field(raw, "prompt", lineno, required=False) or []
            response = enc.field(raw, "response", lineno)
            if not response:
                raise InputError("field 'response' is empty", source=str(path), line=lineno)
            score = raw.get("score")
            if isinstance(score, bool) or not isinstance(score, (int, float)):
                raise InputError(f"field 'score' must be a number, but got {score!r}", source=str(path),
                                 line=lineno)
            aspects = raw.get("scores", {})
            if not isinstance(aspects, dict) or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) for v in aspects.values()):
                raise InputError("field 'scores' must be an object of numbers", source=str(path),
                                 line=lineno)
            rows.append({"id": rid, "line": lineno, "score": float(score),
                         "aspects": {str(k): float(v) for k, v in aspects.items()},
                         "sample": Sample(rid, *_framed(ctx, prompt, response), kind="response")})
        _check_lengths(ctx, rows, str(path))
        return rows
    rows = ctx.provide(score_rows, build)
    plan_buckets(ctx)
    return rows


JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")


def _text_documents(path: str) -> list[tuple[int, dict[str, Any]]]:
    """(line, row) pairs of a corpus: JSONL rows as they are, a plain file's lines as {text}."""
    if Path(path).suffix.lower() in JSONL_SUFFIXES:
        return read_jsonl(path, "text")
    p = Path(path)
    if not p.is_file():
        raise InputError("For 'data.text', file not found", source=str(p))
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start})", source=str(p)) from None
    rows = [(i, {"text": line}) for i, line in enumerate(lines, 1) if line.strip()]
    if not rows:
        raise InputError("For 'data.text', the file has no documents", source=str(p))
    return rows


def text_rows(ctx: Context) -> list[Sample]:
    """Samples of data.text: every token of a document scored (no prompt), a document longer than
    data.text_max_tokens cut into consecutive pieces, so one long line cannot set the batch shape."""
    def build() -> list[Sample]:
        path = ctx.config.data.text
        enc = replace(encoder(ctx), source=str(path))
        limit = ctx.config.data.text_max_tokens
        out = []
        for lineno, raw, rid in _with_ids(_text_documents(path), path):
            ids = enc.field(raw, "text", lineno)
            if len(ids) < 2:  # nothing to predict: a document needs a next token
                raise InputError(f"field 'text' has {len(ids)} token(s); a document needs at least 2",
                                 source=str(path), line=lineno)
            ids = sum(_framed(ctx, [], ids), [])  # BOS + document + EOS, then cut
            pieces = [ids[k:k + limit] for k in range(0, len(ids), limit)]
            pieces = [p for p in pieces if len(p) >= 2]
            for k, piece in enumerate(pieces):
                out.append(Sample(id=rid if len(pieces) == 1 else f"{rid}#{k}", prompt=[],
                                  response=piece, kind="text", meta={"line": lineno}))
        return out
    rows = ctx.provide(text_rows, build)
    plan_buckets(ctx)
    return rows


def plan_buckets(ctx: Context) -> None:
    """The engine's length buckets, chosen once from every row the stages batch (align answers,
    scored responses, the corpus; `Engine.plan_buckets`), as soon as the first rows are read, so
    align, grad, decompose, correlate and stress pad to the same lengths and share the graphs."""
    def build():
        cfg = ctx.config.data
        lengths = []
        if cfg.align:   # these loaders come back here: they get `while_building` (planning)
            lengths += [s.length for r in align_rows(ctx) for s in r["samples"].values()]
        if cfg.scores:
            lengths += [r["sample"].length for r in score_rows(ctx)]
        if cfg.text:
            lengths += [s.length for s in text_rows(ctx)]
        return ctx.engine.plan_buckets(lengths)
    ctx.provide(plan_buckets, build, while_building=())


def text_samples(ctx: Context, n: int | None = None) -> list[Sample]:
    """Ordinary samples from the target's data: align 'good' answers, scored responses, then the
    plain corpus (data.text), so a target with only a corpus runs every mechanical check."""
    out: list[Sample] = []
    if ctx.config.data.align:
        out += [r["samples"]["good"] for r in align_rows(ctx)]
    if ctx.config.data.scores:
        out += [r["sample"] for r in score_rows(ctx)]
    if ctx.config.data.text:
        out += text_rows(ctx)
    if not out:
        raise InputError("the target has no data: set data.align, data.scores or data.text",
                         source=ctx.config.source)
    return out[:n] if n else out


def preference_rows(ctx: Context) -> list[dict[str, Any]]:
    """Rows of {id, line, prompt, chosen, rejected, strength} from data.preference.

    A row has `prompt` (optional), `chosen` and `rejected` (text, or `*_ids`), and optionally a
    numeric `strength` (the annotated size of the preference). An empty answer is allowed: the
    preference stage names pairs with no supervised token rather than refusing the file.
    """
    def build() -> list[dict[str, Any]]:
        path = ctx.config.data.preference
        enc = replace(encoder(ctx), source=str(path))
        rows = []
        for lineno, raw, rid in _with_ids(read_jsonl(path, "preference"), path):
            prompt = enc.field(raw, "prompt", lineno, required=False) or []
            chosen = enc.field(raw, "chosen", lineno)
            rejected = enc.field(raw, "rejected", lineno)
            strength = raw.get("strength")
            if strength is not None and (isinstance(strength, bool) or not isinstance(strength, (int, float))):
                raise InputError(f"field 'strength' must be a number, but got {strength!r}",
                                 source=str(path), line=lineno)
            prompt, chosen = _framed(ctx, prompt, chosen)
            rejected = _framed(ctx, prompt, rejected)[1]
            rows.append({"id": rid, "line": lineno, "prompt": prompt, "chosen": chosen,
                         "rejected": rejected, "strength": None if strength is None else float(strength)})
        return rows
    return ctx.provide(preference_rows, build)
