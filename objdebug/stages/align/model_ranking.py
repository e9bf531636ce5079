"""Whose order is it? The model's own ranking of the rows the objective puts out of order (OBJ102).

OBJ102 asks whether the objective ranks each row's answers bad > medium > good. A row can come
out of order for two reasons: the objective rewards something other than the answer's
likelihood (a sum over tokens, padding scored, a sign), or the model itself finds the worse
answer likelier (an over-confident model that gives a word-swapped "medium" answer 13 nats per
token and a word-salad "bad" one 10). The first is the objective's; the second describes the
model (or the row's labels) and holds for every objective trained on that model, so it is a note.

The model's ranking is measured, not assumed: for each answer of a row out of order, its mean
negative log-likelihood per labelled token from the model's logits (numpy float64,
`run_data.mean_token_nll`: a reference measurement of the model, reported as such, never the
objective re-implemented). A row is the model's when every pair the objective orders wrongly the
model's likelihood orders wrongly too; any other disorder stays the objective's. Measured only
for rows out of order, so a run whose rows are all in order costs nothing more.
"""

from __future__ import annotations

from typing import Any

from objdebug.core import crash
from objdebug.core.errors import InputError
from objdebug.pipeline.context import Context
from objdebug.pipeline.run_data import logit_checks_skip, mean_token_nll

# (lower, higher): each pair the order bad > medium > good asks for, the loss of `higher` above
PAIRS = (("good", "medium"), ("medium", "bad"), ("good", "bad"))


def wrong_pairs(values: dict[str, float]) -> list[tuple[str, str]]:
    """The pairs of `PAIRS` that `values` (answer kind -> loss or NLL) do not order (ties and
    NaN included: they are not 'higher')."""
    return [(lo, hi) for lo, hi in PAIRS if lo in values and hi in values
            and not values[hi] > values[lo]]


def model_ranking(ctx: Context, rows: list[dict[str, Any]], losses: list[dict[str, float]],
                  out_of_order: list[int]) -> dict[str, Any]:
    """For the rows `out_of_order` (indices into `rows` / `losses`): the model's mean token NLL
    of each answer, the pairs the objective and the model order wrongly, and whether the row's
    disorder is the model's (`excused`). A model without logits (or a crash reading them) leaves
    `measured` False and the reason: the objective is then judged on its own order."""
    if not out_of_order:
        return {"measured": True, "rows": [], "excused": []}
    unreadable = logit_checks_skip(ctx)  # an end-to-end target without an output head to read
    if unreadable:
        return {"measured": False, "reason": unreadable, "rows": [], "excused": []}
    flat = [(i, kind, s) for i in out_of_order for kind, s in rows[i]["samples"].items()]
    try:
        nll = mean_token_nll(ctx, [s for _, _, s in flat])
    except InputError:
        raise
    except Exception as exc:  # the reference is a cross-check: without it, no excuse
        return {"measured": False, "reason": crash.summary(exc), "rows": [], "excused": []}
    by_row: dict[int, dict[str, float]] = {}
    for (i, kind, _), v in zip(flat, nll):
        by_row.setdefault(i, {})[kind] = float(v)
    out, excused = [], []
    for i in out_of_order:
        objective_wrong = wrong_pairs(losses[i])
        model_wrong = wrong_pairs(by_row[i])
        theirs = bool(objective_wrong) and set(objective_wrong) <= set(model_wrong)
        out.append({"id": rows[i]["id"], "nll": by_row[i], "objective_pairs": objective_wrong,
                    "model_pairs": model_wrong, "excused": theirs})
        if theirs:
            excused.append(rows[i]["id"])
    return {"measured": True, "rows": out, "excused": excused}
