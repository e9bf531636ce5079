"""The align stage's shared pieces: a finite number, and the SKIP reason without align data."""

from __future__ import annotations

import math

from objdebug.pipeline.context import Context


def _finite(x: float) -> bool:
    return x is not None and math.isfinite(x)


def _no_align_data(ctx: Context) -> str | None:
    if not ctx.config.data.align:
        return "no align data: set data.align to a JSONL of {id, prompt, good, medium, bad} rows"
    return None
