"""The grad stage's shared pieces: listing lengths, float32's epsilon, the settings section,
the SKIP reason of the checks that differentiate w.r.t. the parameters and the batch summary
the measured values carry."""

from __future__ import annotations

from typing import Any

from objdebug.core.settings import Settings
from objdebug.engine.gradients import Batch
from objdebug.pipeline.context import Context

_LISTED = 8
_F32_EPS = 2.0 ** -23


def _settings(ctx: Context) -> Settings:
    return ctx.profile.section("grad")


_NO_PARAMS = "the target has no trainable parameters: there are no parameter gradients to measure"


def _no_params(ctx: Context) -> str | None:
    """SKIP reason for the checks that differentiate w.r.t. the parameters."""
    return None if ctx.target.trainable_params() else _NO_PARAMS


def _batch_info(ctx: Context, batch: Batch) -> dict[str, Any]:
    pid = ctx.engine.padding.label_pad_id
    masked = (batch.labels == pid) | (batch.labels < 0)  # a pipeline's batch: -100 and its pad id
    return {"rows": int(batch.input_ids.shape[0]), "length": int(batch.input_ids.shape[1]),
            "data_rows": len(batch.samples), "filled_rows": batch.filled,
            "scored_positions": int((~masked).sum()), "masked_positions": int(masked.sum())}
