"""The model's position limit, and every input length objdebug builds held within it.

The limit is `data.max_length`, else a position-table size the model names
(`max_position_embeddings`, `seq_length`, `max_seq_len`, ... on the model or its `config`; see
`objdebug.pipeline.contract.position_table`), kept on the engine as `engine.max_length` by the contract
check. The stress stage builds its own lengths from the profile (2048 / 4096-token inputs, +500
padding, calibration runs): a length beyond the limit never runs; the longest length that fits
runs instead and the finding says so, naming the limit. The objective alone (OBJ513, logits fed
directly) has no position table and keeps its lengths.

A model that names no limit has one all the same when it fails with a shape or index error at a
length after a shorter one ran (a learned position table it does not name): `learnable` says so
for the error, and `learned` makes the longest length that ran the limit for the rest of the run,
so every later input is held within it and the findings name it.
"""

from __future__ import annotations

from typing import Any


def limit(ctx) -> int | None:
    value = getattr(getattr(ctx, "engine", None), "max_length", None)  # no engine: no limit known
    return int(value) if value else None


def source(ctx) -> str:
    """Where the limit comes from, for messages: 'data.max_length' or 'config.seq_length' ..."""
    target = getattr(ctx, "target", None)
    info = target.info.get("contract", {}) if target is not None else {}
    return info.get("max_length_source") or "the model's position limit"


def cap(length: int, ctx) -> int:
    """`length`, or the limit when it is shorter."""
    top = limit(ctx)
    return min(int(length), top) if top else int(length)


def capped_lengths(lengths, ctx) -> dict[int, int]:
    """profile length -> the length that runs (itself, or the limit when beyond it)."""
    return {int(t): cap(int(t), ctx) for t in lengths}


def note(asked: int, ran: int, ctx) -> str:
    return (f"T={asked} is beyond the model's {limit(ctx)} positions ({source(ctx)}): not run, "
            f"T={ran} (the longest that fits) ran instead")


def describe(ctx) -> dict[str, Any]:
    return {"max_length": limit(ctx), "source": source(ctx)}


_SHAPE_WORDS = ("range", "out of bound", "index", "indices", "position", "shape", "broadcast", "dimension")


def learnable(exc: BaseException, ctx) -> str | None:
    """The error's first line when it can be a model's unnamed position limit (no limit known, a
    shape or index error), else None: the crash it is."""
    from objdebug.core.crash import first_line

    if limit(ctx) is not None:
        return None
    text = str(exc).lower()
    if not any(w in text for w in _SHAPE_WORDS):
        return None
    return f"{type(exc).__name__}: {first_line(exc)}"[:200]


def learned(ctx, ran: int, failed: int, why: str) -> None:
    """The longest length that ran becomes the run's limit (`learnable` said the error at `failed`
    can be the model's position table)."""
    ctx.engine.max_length = int(ran)
    info = ctx.target.info.setdefault("contract", {})
    info["max_length_source"] = f"the longest length that ran; T={failed} failed: {why}"
    info["max_length_learned"] = {"ran": int(ran), "failed": int(failed), "error": why}
