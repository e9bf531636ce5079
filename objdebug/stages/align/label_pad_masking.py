"""OBJ105, label-pad masking: does the objective score positions whose label is `label_pad_id`?
Probed on all-masked rows."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.core.findings import Check, Condition, Verdict
from objdebug.core.locations import config_key
from objdebug.core.settings import Settings
from objdebug.pipeline.context import Context
from objdebug.pipeline.datasets import align_rows, text_samples
from objdebug.stages.align._common import _no_align_data


class LabelPadMasking(Check):
    """Does the objective score positions whose label is `label_pad_id`? Probed on all-masked rows."""

    name = "label-pad-masking"
    stage = "align"

    def skip_reason(self, ctx: Context) -> str | None:
        d = ctx.config.data
        if d.align or d.text:  # masking is mechanics: a plain corpus is enough to probe it
            return None
        return _no_align_data(ctx)

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        if ctx.config.data.align:
            samples = [s for r in align_rows(ctx) for s in r["samples"].values()]
        else:
            samples = text_samples(ctx)
        lengths = [s.length for s in samples]
        length = ctx.engine.bucket(max(lengths)) if lengths else ctx.engine.bucket(1)
        rejected = None
        try:
            masked = float(ctx.engine.masked_probe(length)[0])
        except Exception as exc:  # e.g. GatherD: label_pad_id is out of range for the objective
            from objdebug.engine.compile_errors import compile_error

            if compile_error(exc) is not None:  # a graph that does not compile is not an answer
                raise
            masked = float("nan")
            rejected = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
        # Share of the bucket's positions that are real response targets: how much a leak dilutes.
        resp = [len(s.response) for s in samples]
        return {"label_pad_id": ctx.config.data.label_pad_id, "masked_loss": masked, "length": length,
                "rejected": rejected,
                "response_share": float(np.mean(resp) / length) if resp else float("nan"),
                "config_location": config_key(ctx.config.source, "data.label_pad_id")}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        tol = th["masked_tolerance"]

        def judge(v):
            x, pid = v["masked_loss"], v["label_pad_id"]
            if v.get("rejected"):
                return Verdict.FAIL, (
                    f"the objective rejects label_pad_id={pid}: on a fully masked sample it raises "
                    f"({v['rejected']}); the data pipeline pads labels with {pid}, which is not the "
                    f"objective's ignore_index and not a valid class; set the objective's "
                    f"ignore_index to {pid}, or data.label_pad_id to the objective's ignore_index"), x
            if math.isnan(x):  # a NaN measurement never passes: 0/0, but it would hide a leak too
                return Verdict.WARN, (
                    f"cannot tell whether positions labelled label_pad_id={pid} are scored: a fully "
                    f"masked sample gives NaN (0/0 when nothing is scored, but a NaN hides a scored "
                    f"position as well); a sample with nothing to score must give 0: divide by "
                    f"max(count, 1) (OBJ503 and OBJ710 judge the NaN itself)"), x
            if abs(x) <= tol:
                return Verdict.PASS, (f"positions labelled label_pad_id={pid} are not scored: a fully "
                                      f"masked sample gives {x:.3g}"), x
            return Verdict.FAIL, (
                f"the objective scores positions labelled label_pad_id={pid}: a fully masked sample "
                f"gives loss {x:.4g} instead of 0; prompt and padding enter the loss and dilute the "
                f"good/bad gap (response targets are {v['response_share']:.0%} of the {v['length']} "
                f"positions); the objective's ignore_index must equal data.label_pad_id"), x

        return [Condition("OBJ105", "label_pad_not_scored", judge, lambda v: v.get("config_location"))]
