"""OBJ017 / OBJ018: where the prompt ends in each real row, and what its labels train.

The boundary comes from a column when the pipeline has one (`response_start`: the answer's first
index; `prompt_length`: the prompt's tokens from the first real one; `loss_mask`: 1 on the trained
labels, whose first 1 pairs with the answer's first token), else from matching the row to the
target's configured rows (align and scores prompts, framed as `[data] bos_id` says): a row whose
real tokens start with a known prompt has its answer right after it. Without either the check
SKIPs and says why. Given the boundary
and the labels' layout (`layout.py`):

- OBJ017: every position that predicts a prompt token carries a label the objective ignores
  (measured): a prompt left unmasked, or masked one token short, trains the model on the prompt;
- OBJ018: the position that predicts the answer's first token is trained: a prompt mask one
  token too long silently drops the first answer token of every row.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.core.findings import Check, Condition, Verdict
from objdebug.stages.batches.words import few
from objdebug.core.config import BOUNDARY_COLUMNS
from objdebug.stages.batches.audit import audit, has_labels, no_label_objective, real_batches


def _prompts(ctx: Any) -> list[list[int]]:
    """The configured rows' prompts (with and without BOS), longest first; [] without rows."""
    from objdebug.pipeline.datasets import text_samples

    d = ctx.config.data
    if not (d.align or d.scores) or _has_boundary(ctx):  # a column says it: no matching needed
        return []
    out = set()
    for s in text_samples(ctx):
        prompt = list(s.prompt)
        if d.bos_id is not None and prompt[:1] == [d.bos_id]:
            out.add(tuple(prompt[1:]))
        out.add(tuple(prompt))
    return sorted((list(p) for p in out if p), key=len, reverse=True)


def _boundary(real: np.ndarray, prompts: list[list[int]]) -> int | None:
    """The length of the longest known prompt the row's real tokens start with (None: none)."""
    for p in prompts:
        if len(p) < len(real) and real[:len(p)].tolist() == p:
            return len(p)
    return None


def _has_boundary(ctx: Any) -> bool:
    return any(set(BOUNDARY_COLUMNS) & set(b.columns) for b in real_batches(ctx).batches)


def _first_answer(batch, r: int, real_at: np.ndarray, prompts, offset: int) -> int | None:
    """The position whose label is the row's first answer token (None: unknown): the labels hold
    input_ids[t + offset] at t (the measured offset, `layout.py`)."""
    back = offset
    cols, start = batch.columns, int(real_at[0])
    if "response_start" in cols:
        return int(cols["response_start"][r]) - back
    if "prompt_length" in cols:
        return start + int(cols["prompt_length"][r]) - back
    if "loss_mask" in cols:
        on = np.nonzero(cols["loss_mask"][r] != 0)[0]
        return int(on[0]) if len(on) else None
    n = _boundary(batch.input_ids[r, real_at], prompts) if prompts else None
    return None if n is None else start + n - back


class PromptBoundary(Check):
    """OBJ017 / OBJ018: the prompt's labels ignored, the answer's first token trained."""

    name = "batch-prompt-boundary"
    stage = "batches"

    def skip_reason(self, ctx: Any) -> str | None:
        if no_label_objective(ctx):
            return no_label_objective(ctx)
        if not has_labels(ctx):
            return "the batches have no labels column: no prompt mask to check"
        if not (ctx.config.data.align or ctx.config.data.scores or _has_boundary(ctx)):
            return ("no prompt boundary: the batches carry no prompt length and the target has no "
                    "align or scores rows whose prompts could be matched to the batch rows")
        return None

    def measure(self, ctx: Any, th: Any) -> dict[str, Any]:
        a = audit(ctx, th)
        prompts = _prompts(ctx)
        ignored = a.ignored()
        matched, rows, prompt_trained, first_masked = 0, 0, [], []
        positions = 0
        for lay in a.layouts:
            labels = lay.batch.labels
            if labels is None or a.offset is None:
                continue
            ign = np.isin(labels, ignored)
            for r in range(len(labels)):
                rows += 1
                real_at = np.nonzero(~lay.padding[r])[0]
                if not len(real_at):
                    continue
                start = int(real_at[0])
                first = _first_answer(lay.batch, r, real_at, prompts, a.offset)
                if first is None or not start <= first < labels.shape[1]:
                    continue
                matched += 1
                prompt_at = np.arange(start, first)
                trained = prompt_at[~ign[r, prompt_at]]
                if len(trained):
                    positions += len(trained)
                    prompt_trained.append(f"batch {lay.batch.number} row {r}")
                if ign[r, first]:
                    first_masked.append(f"batch {lay.batch.number} row {r}")
        return {"source": a.source, "layout": a.layout, "offset": a.offset, "rows": rows, "matched": matched,
                "prompt_trained": prompt_trained, "positions": positions,
                "first_masked": first_masked, "ignored": ignored}

    def conditions(self, th: Any) -> list[Condition]:
        def skip(v):
            if v.get("offset") is None:
                return ("the labels follow the inputs at no single offset (OBJ013): no position "
                        "pairs with the answer's first token")
            if not v["matched"]:
                return (f"no prompt boundary: the batches carry no prompt length and none of the "
                        f"{v['rows']} rows read starts with a prompt of the target's align or scores rows")
            return None

        def prompt(v):
            if skip(v):
                return Verdict.SKIP, skip(v), None
            k = v["prompt_trained"]
            if k:
                return Verdict.FAIL, (
                    f"the prompt is trained in {len(k)} of {v['matched']} rows whose prompt is known "
                    f"({few(k, 3)}): {v['positions']} positions that predict a prompt token carry "
                    f"labels the objective learns (it ignores {few(v['ignored'], 4)})"), float(v["positions"])
            return Verdict.PASS, (f"the prompt's labels are ignored in all {v['matched']} rows whose "
                                  f"prompt is known (of {v['rows']})"), 0.0

        def first(v):
            if skip(v):
                return Verdict.SKIP, skip(v), None
            k = v["first_masked"]
            if k:
                return Verdict.FAIL, (
                    f"the answer's first token is not trained in {len(k)} of {v['matched']} rows "
                    f"whose prompt is known ({few(k, 3)}): its label is a value the objective "
                    f"ignores (a prompt mask one token too long)"), float(len(k))
            return Verdict.PASS, (f"the answer's first token is trained in all {v['matched']} rows "
                                  f"whose prompt is known"), 0.0

        return [Condition("OBJ017", "prompt_labels_ignored", prompt),
                Condition("OBJ018", "first_answer_token_trained", first)]
