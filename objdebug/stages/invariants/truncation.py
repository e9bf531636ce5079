"""OBJ709 rows with no supervised token after truncation, OBJ710 the objective's value on them.

OBJ709: every data row (align "good" answers, scored responses) is cut to `[invariants]
max_length` tokens, as a training pipeline truncates, and its labels rebuilt with the configured
shift; rows left with zero supervised tokens (a prompt as long as the limit) are named (trl 6548).
With `max_length = 0` (not configured) the check reports the shortest prompt, the limit at which
the first row would be emptied, and skips.

OBJ710: such a row reaches the objective as a micro-batch (or a row of a batch) whose labels are
all label_pad_id. The configured objective is run on the first micro-batch with every label
ignored, and on the whole batch with that micro-batch's rows ignored: loss and logit gradient must
be finite (a mean over zero tokens is 0/0 = NaN and one such step ruins the weights).

Graphs: `objective.logit_grad` at the micro-batch and the batch shape (both shared).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.pipeline.context import Context
from objdebug.engine.data import build_labels
from objdebug.pipeline.datasets import text_samples
from objdebug.core.findings import Check, Condition, Verdict, listing
from objdebug.core.settings import Settings
from objdebug.stages.invariants._common import (batch, fmt, logits, micro_batches, probe,
    skip_end_to_end)


def supervised_after(sample, max_length: int, pad: int, shift: bool) -> int:
    ids = (sample.prompt + sample.response)[:max_length]
    prompt = sample.prompt[:max_length]
    labels = build_labels(prompt, ids[len(prompt):], pad, shift)
    return int((labels != pad).sum())


class EmptyAfterTruncation(Check):
    """Rows emptied by truncation named; the objective finite on rows with no supervised token."""

    name = "empty-after-truncation"
    stage = "invariants"

    def skip_reason(self, ctx: Context) -> str | None:
        return skip_end_to_end(ctx, "micro-batches with every label ignored (other batch shapes)")

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        cfg = ctx.config.data
        limit = int(th["max_length"])
        samples = text_samples(ctx)
        empty = [s.id + (f"/{s.kind}" if s.kind else "") for s in samples
                 if limit and supervised_after(s, limit, cfg.label_pad_id, cfg.shift) == 0]
        b, x = batch(ctx), logits(ctx)
        start, end = micro_batches(ctx)[0]
        ignored = np.full_like(b.labels[start:end], cfg.label_pad_id)
        alone = probe(ctx).run(x[start:end], ignored)
        mixed_labels = b.labels.copy()
        mixed_labels[start:end] = cfg.label_pad_id
        mixed = probe(ctx).run(x, mixed_labels)
        return {"max_length": limit, "rows": len(samples), "empty": empty,
                "shortest_prompt": min(len(s.prompt) for s in samples),
                "micro_rows": end - start, "loss_empty": alone.loss,
                "grad_empty_finite": bool(np.isfinite(alone.grad).all()),
                "grad_empty_max": float(np.abs(alone.grad).max()) if np.isfinite(alone.grad).all() else float("nan"),
                "loss_mixed": mixed.loss, "grad_mixed_finite": bool(np.isfinite(mixed.grad).all()),
                "batch_rows": int(b.labels.shape[0])}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        verdict = Verdict.from_setting(th["empty_rows"], "[invariants] empty_rows")

        def rows(v):
            if not v["max_length"]:
                return Verdict.SKIP, (f"no truncation configured ([invariants] max_length = 0); the "
                                      f"shortest prompt of the {v['rows']} rows has "
                                      f"{v['shortest_prompt']} tokens: max_length <= "
                                      f"{v['shortest_prompt']} would leave a row with nothing to learn"), None
            n = len(v["empty"])
            what = f"{n} of {v['rows']} rows have no supervised token after truncation to {v['max_length']} tokens"
            if n:
                return verdict, what + f": {listing(v['empty'])}; they only add a 0 (or NaN) to the loss", float(n)
            return Verdict.PASS, what, 0.0

        def finite(v):
            what = (f"{v['micro_rows']}-row micro-batch with every label ignored: loss "
                    f"{fmt(v['loss_empty'])}, logit gradient {'finite' if v['grad_empty_finite'] else 'NaN/Inf'}"
                    f" (max |g| {fmt(v['grad_empty_max'])}); batch of {v['batch_rows']} rows with those "
                    f"{v['micro_rows']} ignored: loss {fmt(v['loss_mixed'])}, gradient "
                    f"{'finite' if v['grad_mixed_finite'] else 'NaN/Inf'}")
            loss_ok = np.isfinite(v["loss_empty"]) and np.isfinite(v["loss_mixed"])
            grad_ok = v["grad_empty_finite"] and v["grad_mixed_finite"]
            if not (loss_ok and grad_ok):
                what_bad = " and ".join(x for x, ok in (("the loss", loss_ok), ("the gradient", grad_ok))
                                        if not ok)
                return Verdict.FAIL, (what + f": {what_bad} of a row emptied by truncation is not "
                                      "finite (0/0): a training loop that sums, logs, scales or "
                                      "clips by it turns NaN; divide by max(count, 1)"), 1.0
            return Verdict.PASS, what, 0.0

        return [Condition("OBJ709", "no_row_empty_after_truncation", rows),
                Condition("OBJ710", "objective_finite_on_empty_rows", finite)]
