"""All padding: a batch in which every label is `label_pad_id` (an empty batch after filtering).

Loss and gradients through the real model and objective. A masked mean that divides by the number
of scored positions gives 0/0 = NaN here (MindSpore 2.10's nn.CrossEntropyLoss does), and a
`where(count > 0, sum / count, 0)` guard still leaks NaN into the gradient. Code OBJ503.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.pipeline.context import Context
from objdebug.core.findings import Check, Condition, Verdict
from objdebug.core.settings import Settings
import objdebug.stages.stress.task_cases as task_cases
from objdebug.stages.stress._common import loss_and_grad, short_length
from objdebug.engine import kinds, position_limit


class AllPadding(Check):
    name = "all-padding"
    stage = "stress"
    kinds = task_cases.ALL  # embeddings: empty texts, finiteness only (task_cases.py)

    def skip_reason(self, ctx: Context) -> str | None:
        return task_cases.no_rows(ctx)

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        if task_cases.is_task(ctx):  # the kind's one row of padding, same measurement
            return task_cases.all_padding(ctx, th)
        cfg = ctx.config.data
        length = position_limit.cap(short_length(th), ctx)  # within the model's positions
        ids = ctx.engine.padding.only((1, length))  # mask all 0 when the model takes one
        labels = np.full((1, length), cfg.label_pad_id, np.int32)
        out = loss_and_grad(ctx, ids, labels)
        out.pop("grads")
        return {"length": length, "pad_id": cfg.pad_id, "label_pad_id": cfg.label_pad_id, **out}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        tol = float(th["all_pad_tolerance"])

        def judge(v):
            x, bad, n = v["loss"], v["nonfinite_params"], v["n_params"]
            case = v.get("case", kinds.IGNORED_LABELS)
            texts = (f"{v['rows']} rows whose every text is {v['length']} pad ids ({v['pad_id']})"
                     if case == kinds.EMPTY_TEXTS else
                     f"{v['rows']} rows of {v['length']} pad ids ({v['pad_id']}), their labels kept"
                     if case == kinds.PADDING_INPUT else
                     f"batch of 1x{v['length']} padding (ids {v['pad_id']}, every label {v['label_pad_id']})")
            what = (f"{texts}: loss {x:.4g}, gradient norm {v['grad_norm']:.3g}, "
                    f"{bad}/{n} parameters with NaN/Inf gradients")
            if bad:
                return Verdict.FAIL, (what + "; one such batch turns every weight into NaN at the "
                                      "next optimizer step"), x
            if not math.isfinite(x):
                return Verdict.FAIL, (what + "; a NaN/Inf loss poisons loss averages, loss scaling "
                                      "and the NaN guards that skip steps or stop the run"), x
            if case == kinds.EMPTY_TEXTS:  # no label to mask: no loss it must equal
                return Verdict.PASS, what + "; finite (an empty text has no label to mask)", x
            if case == kinds.PADDING_INPUT:  # real labels on an empty input: any finite loss
                return Verdict.PASS, what + "; finite (no label of this kind is ignored)", x
            if abs(x) > tol:
                return Verdict.FAIL, (what + f"; a batch with nothing to score must cost 0 "
                                      f"(|loss| <= {tol:g}): the objective scores padding"), x
            return Verdict.PASS, what + f"; |loss| <= {tol:g}", x

        return [Condition("OBJ503", "all_padding_loss_zero_and_finite", judge)]
