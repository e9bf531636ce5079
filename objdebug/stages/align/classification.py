"""Align for `[task] kind = "classification"` (issue 47), OBJ110: the objective ranks the true
label below a near miss below a far one.

On each align row the model gets right, the user's objective is called on that row alone (a batch
of one, `task.objective`) with three labels: the row's own, the near miss (the class the model
scores second, the one most similar to the truth in the model's eyes) and the far one (the class
it scores last). A correct classification objective costs least on the truth and most on the
class the model finds least likely; an objective that ignores or permutes the label, or rewards
the wrong class, breaks the order. Rows the model gets wrong are left out: on them the order
measures the model, not the objective.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.core.findings import Check, Condition, Verdict, band, listing
from objdebug.core.settings import Settings
from objdebug.pipeline import task_kind


class ClassRanking(Check):
    """loss(true) < loss(near miss) < loss(far) on the rows the model classifies correctly."""

    name = "class-ranking"
    stage = "align"
    kinds = ("classification",)

    def skip_reason(self, ctx) -> str | None:
        if not ctx.config.data.align:
            return ("no align data: set data.align to a JSONL of {id, text, label} rows "
                    "(classification)")
        return None

    def measure(self, ctx, th: Settings) -> dict[str, Any]:
        import mindspore as ms

        from objdebug.engine import tasks

        rows = task_kind.align_rows(ctx)
        logits = task_kind.outputs_of(ctx, rows)
        c = logits.shape[-1]
        names = ctx.config.task.labels or [str(k) for k in range(c)]
        pred = logits.argmax(-1)
        table, bad = [], []
        for k, row in enumerate(rows):
            if pred[k] != row.target:
                continue
            order = np.argsort(-logits[k], kind="stable")
            near, far = int(order[1]), int(order[-1])
            x = ms.Tensor(np.repeat(logits[k:k + 1], 3, 0).astype(np.float32))
            y = ms.Tensor(np.array([row.target, near, far], np.int32))
            losses = tasks.per_row(ctx.engine, x, y)
            ok = bool(losses[0] < losses[1] < losses[2])
            table.append({"id": row.id, "line": row.line, "label": names[row.target],
                          "near": names[near], "far": names[far],
                          "loss": [float(v) for v in losses], "ordered": ok})
            if not ok:
                bad.append(row.id)
        finite = all(math.isfinite(v) for r in table for v in r["loss"])
        return {"rows": len(rows), "correct": len(table), "accuracy": len(table) / max(len(rows), 1),
                "ordered_share": (sum(r["ordered"] for r in table) / len(table)) if table else float("nan"),
                "finite": finite, "disordered": bad, "table": table,
                "mean_loss": [float(np.mean([r["loss"][i] for r in table])) if table else float("nan")
                              for i in range(3)]}

    def conditions(self, th: Settings) -> list[Condition]:
        return [order_condition("OBJ110", ("true", "near miss", "far"), "classifies correctly", th,
                                name="class_order")]


def order_condition(code: str, names: tuple[str, str, str], right: str, th: Settings,
                    gap: float | None = None, name: str | None = None) -> Condition:
    """The kinds' order judgement (OBJ110-OBJ112): the share of the rows the model gets right
    (`right` says how) whose losses are ordered true < near < far (each step up by more than `gap`
    x the larger loss, where given); a NaN/Inf loss fails; no row right: SKIP (the order would
    measure the model)."""
    lo, hi = th["task_order_fail"], th["task_order_pass"]
    true, near, far = names

    def judge(v):
        if not v["correct"]:
            return (Verdict.SKIP, f"the model gets none of the {v['rows']} align rows right ({right}): "
                                  f"the order would measure the model, not the objective", None)
        x = v["ordered_share"]
        verdict = Verdict.FAIL if not v["finite"] else band(x, pass_if=lambda a: a >= hi,
                                                            fail_if=lambda a: a < lo)
        t, n, f = v["mean_loss"]
        step = "" if gap is None else f" each step up by > {gap:g} relative"
        return verdict, (
            f"loss({true}) < loss({near}) < loss({far}){step} on {x:.0%} of the {v['correct']} rows "
            f"the model gets right ({v['accuracy']:.0%} of {v['rows']}); mean loss {true} {t:.4g}, "
            f"{near} {n:.4g}, {far} {f:.4g}; pass >= {hi:.0%}, fail < {lo:.0%}"
            + (f"; out of order: {listing(v['disordered'])}" if v["disordered"] else "")
            + ("" if v["finite"] else "; a loss is NaN/Inf")), x

    return Condition(code, f"{name or code.lower() + '_order'}_at_least_{hi}", judge)


def checks() -> list[Check]:
    return [ClassRanking()]
