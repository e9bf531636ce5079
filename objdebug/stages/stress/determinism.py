"""Determinism: the same batch twice gives the same losses (OBJ510), and a sample's loss does not
depend on the other rows of its batch (OBJ511): each sample alone (its batch filled with copies of
itself, as the engine fills short batches) against the same sample among different rows. On a
`[task] kind` other than the causal LM the same measurement runs on the kind's rows (task_cases.py).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.pipeline.context import Context
from objdebug.pipeline.datasets import text_samples
from objdebug.core.findings import Check, Condition, Verdict
from objdebug.core.settings import Settings
import objdebug.stages.stress.task_cases as task_cases
from objdebug.stages.stress._common import max_rel, packed


class Determinism(Check):
    name = "determinism"
    stage = "stress"
    kinds = task_cases.ALL

    def skip_reason(self, ctx: Context) -> str | None:
        return task_cases.no_rows(ctx)

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        if task_cases.is_task(ctx):  # the kind's rows through its graphs, the same measurement
            return task_cases.determinism(ctx, th)
        b = ctx.engine.batch_size
        rows = text_samples(ctx, b)
        rows = rows + [rows[i % len(rows)] for i in range(b - len(rows))]
        length = ctx.engine.bucket(max(s.length for s in rows))
        ids, labels = packed(ctx, rows, length)
        first = ctx.engine.per_sample_raw(ids, labels)[:, 0]
        second = ctx.engine.per_sample_raw(ids, labels)[:, 0]
        n_alone = min(int(th["batch_samples"]), len(set(s.id for s in rows)))
        alone = []
        for j in range(n_alone):
            a_ids, a_labels = packed(ctx, [rows[j]] * b, length)
            alone.append(float(ctx.engine.per_sample_raw(a_ids, a_labels)[0, 0]))
        alone_arr = np.array(alone)
        return {"shape": [b, length], "repeat_first": first, "repeat_second": second,
                "repeat_max_rel": max_rel(second, first), "sample_ids": [s.id for s in rows[:n_alone]],
                "in_batch": first[:n_alone], "alone": alone_arr,
                "batch_max_rel": max_rel(alone_arr, first[:n_alone])}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        rtol = float(th["repeat_rtol"])
        btol, bfail = float(th["batch_rtol"]), float(th["batch_fail_rtol"])

        def repeat(v):
            x = v["repeat_max_rel"]
            msg = (f"batch {v['shape'][0]}x{v['shape'][1]} evaluated twice: largest relative difference "
                   f"{x:.2g} (first {v['repeat_first'][0]:.6g} vs {v['repeat_second'][0]:.6g}); pass <= {rtol:g}")
            if math.isnan(x) or x > rtol:
                return Verdict.FAIL, msg + "; the same input gives another loss", x
            return Verdict.PASS, msg, x

        def batch(v):
            x = v["batch_max_rel"]
            shown = ", ".join(f"{sid}: alone {a:.6g} vs in batch {b:.6g}"
                              for sid, a, b in zip(v["sample_ids"], v["alone"], v["in_batch"]))
            msg = f"{shown}; largest relative difference {x:.2g}; pass <= {btol:g}, fail > {bfail:g}"
            if math.isnan(x) or x > bfail:
                return Verdict.FAIL, msg + "; a sample's loss depends on the other rows", x
            if x > btol:
                return Verdict.WARN, msg, x
            return Verdict.PASS, msg, x

        return [Condition("OBJ510", f"repeat_rtol_{rtol:g}", repeat),
                Condition("OBJ511", f"batch_independent_rtol_{btol:g}", batch)]
