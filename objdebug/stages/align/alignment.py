"""OBJ101-OBJ104, alignment: the loss of good / medium / bad answers to the same prompt per row,
their gap (OBJ101), their order (OBJ102), a paired test of bad > good (OBJ103) and finiteness
(OBJ104). A row out of order that the model's own likelihood puts out of order the same way is the
model's (model_ranking.py): OBJ102 judges the objective on the rest."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.core.findings import Check, Condition, Verdict, band, listing
from objdebug.core.locations import data_row
from objdebug.core.settings import Settings
from objdebug.core.stats import mean_std, paired_greater
from objdebug.pipeline.context import Context
from objdebug.pipeline.datasets import align_rows
from objdebug.stages.align._common import _no_align_data
from objdebug.stages.align.model_ranking import model_ranking


class AlignmentLoss(Check):
    """Loss of good / medium / bad answers per row: gap, ordering, significance, finiteness."""

    name = "alignment"
    stage = "align"
    # ranking answers is learned; finiteness (OBJ104) is mechanics and is judged on any model
    needs_trained = ("OBJ101", "OBJ102", "OBJ103")

    def enabled(self, th: dict[str, Any]) -> bool:
        return bool(th["judge_rows"])

    def skip_reason(self, ctx: Context) -> str | None:
        return _no_align_data(ctx)

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        rows = align_rows(ctx)
        flat = [(i, k, s) for i, r in enumerate(rows) for k, s in r["samples"].items()]
        values = ctx.engine.evaluate([s for _, _, s in flat], label="align: scoring answers")[:, 0]
        losses: list[dict[str, float]] = [{} for _ in rows]
        for (i, kind, _), v in zip(flat, values):
            losses[i][kind] = float(v)

        per_row, gaps, violations, pair_ok, order_ok, out_of_order = [], [], [], 0, 0, []
        for i, (r, lo) in enumerate(zip(rows, losses)):
            gap = lo["bad"] - lo["good"]
            ordered = lo["bad"] > lo.get("medium", lo["good"]) > lo["good"] if "medium" in lo \
                else lo["bad"] > lo["good"]
            pair_ok += int(lo["bad"] > lo["good"])
            order_ok += int(bool(ordered))
            if not ordered:
                violations.append(r["id"])
                out_of_order.append(i)
            gaps.append(gap)
            per_row.append({"id": r["id"], "line": r["line"], **lo, "gap": gap, "ordered": bool(ordered),
                            "synthetic": r["synthetic"], "response_tokens": {
                                k: len(s.response) for k, s in r["samples"].items()}})
        g = np.array(gaps, dtype=np.float64)
        finite = np.isfinite(g)
        n = len(rows)
        diffs = g[finite]
        p_wilcoxon, p_ttest = paired_greater(diffs)  # scale-free, quiet (core/stats.py)
        kinds = sorted({k for lo in losses for k in lo})
        with np.errstate(all="ignore"):  # an inf loss makes an inf (or NaN) mean: listed below
            mean_by_kind = {k: float(np.mean([lo[k] for lo in losses if k in lo])) for k in kinds}
        nonfinite = [{"id": r["id"], "kind": k} for r, lo in zip(rows, losses)
                     for k, v in lo.items() if not math.isfinite(v)]
        imin = int(np.nanargmin(np.where(finite, g, np.nan))) if finite.any() else 0
        ranking = model_ranking(ctx, rows, losses, out_of_order)
        return {
            "n_rows": n,
            "synthetic_rows": sum(1 for r in rows if r["synthetic"]),
            "mean_loss": mean_by_kind,
            "mean_gap": mean_std(diffs)[0],
            "median_gap": float(np.median(diffs)) if len(diffs) else float("nan"),
            "min_gap": float(g[imin]) if n else float("nan"),
            "min_gap_id": rows[imin]["id"] if n else None,
            "order_accuracy": order_ok / n,
            "pair_accuracy": pair_ok / n,
            "violations": violations,
            # the objective's order where it differs from the model's own likelihood: rows out of
            # order the same way in the model's mean token NLL are the model's ranking, not the objective's
            "order_accuracy_vs_model": (order_ok + len(ranking["excused"])) / n if n else float("nan"),
            "model_ranking": ranking,
            "p_wilcoxon": p_wilcoxon,
            "p_ttest": p_ttest,
            "nonfinite": nonfinite,
            "rows": per_row,
            "file": ctx.config.data.align,
        }

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        gap_pass, gap_fail = th["gap_pass"], th["gap_fail"]
        ord_pass, ord_fail = th["order_pass"], th["order_fail"]
        p_pass, p_fail = th["p_pass"], th["p_fail"]
        min_rows = th["min_rows"]

        def gap(v):
            x = v["mean_gap"]
            verdict = band(x, pass_if=lambda a: a >= gap_pass, fail_if=lambda a: a < gap_fail)
            ml = v["mean_loss"]
            return verdict, (f"mean gap loss(bad)-loss(good) = {x:.3f} (min {v['min_gap']:.3f} at "
                             f"'{v['min_gap_id']}'; good {ml.get('good', float('nan')):.3f}, "
                             f"bad {ml.get('bad', float('nan')):.3f}) over {v['n_rows']} rows; "
                             f"pass >= {gap_pass}, fail < {gap_fail}"), x

        def order(v):
            x = v["order_accuracy"]
            verdict = band(x, pass_if=lambda a: a >= ord_pass, fail_if=lambda a: a < ord_fail)
            viol = v["violations"]
            shown = listing(viol)
            message = (f"{x:.0%} of rows ordered bad > medium > good, bad > good in "
                       f"{v['pair_accuracy']:.0%}" + (f"; out of order: {shown}" if viol else ""))
            ranking = v.get("model_ranking") or {}
            theirs = ranking.get("excused") or []
            if verdict is not Verdict.PASS and theirs:
                # the rows the model itself ranks so describe the model, not the objective
                x_obj = v["order_accuracy_vs_model"]
                verdict = band(x_obj, pass_if=lambda a: a >= ord_pass, fail_if=lambda a: a < ord_fail)
                if verdict is Verdict.PASS:
                    verdict = Verdict.INFO
                worst = [r for r in ranking["rows"] if r["excused"]][:3]
                pairs = "; ".join(
                    f"{r['id']} " + ", ".join(f"{hi} {r['nll'][hi]:.2f} <= {lo} {r['nll'][lo]:.2f}"
                                              for lo, hi in r["objective_pairs"]) for r in worst)
                message += (f"; {len(theirs)} of {len(viol)} are out of order the same way in the "
                            f"model's own likelihood (mean token NLL of each answer from the logits, "
                            f"float64 reference: {pairs}{', ...' if len(theirs) > len(worst) else ''}): "
                            f"the model's ranking (or the rows' labels), not the objective's, which "
                            f"orders {x_obj:.0%} of rows as the model does")
            elif verdict is not Verdict.PASS and viol and ranking.get("measured") is False:
                message += f"; the model's own ranking could not be read ({ranking.get('reason')})"
            return verdict, message + f"; pass >= {ord_pass:.0%}, fail < {ord_fail:.0%}", x

        def significance(v):
            n, p = v["n_rows"], v["p_wilcoxon"]
            if n < min_rows:
                return Verdict.ERROR, (f"only {n} rows: too few for a paired test of bad > good "
                                       f"(profile min_rows = {min_rows}); add rows"), p
            verdict = band(p, pass_if=lambda a: a < p_pass, fail_if=lambda a: a >= p_fail)
            return verdict, (f"paired Wilcoxon bad > good: p = {p:.2g} (t-test p = {v['p_ttest']:.2g}, "
                             f"n = {n}); pass < {p_pass}, fail >= {p_fail}"), p

        def finite(v):
            bad = v["nonfinite"]
            if bad:
                shown = listing([f"{b['id']}/{b['kind']}" for b in bad])
                return Verdict.FAIL, f"{len(bad)} non-finite losses (NaN/Inf): {shown}", float(len(bad))
            return Verdict.PASS, f"all {sum(len(r['response_tokens']) for r in v['rows'])} losses finite", 0.0

        def row_of(pick):  # the data row a finding points at: its JSONL line
            def locate(v):
                rid = pick(v)
                line = next((r.get("line") for r in v["rows"] if r["id"] == rid), None)
                return data_row(v.get("file"), line)
            return locate

        return [Condition("OBJ101", f"gap_not_less_than_{gap_pass}", gap,
                          row_of(lambda v: v["min_gap_id"])),
                Condition("OBJ102", f"order_accuracy_not_less_than_{ord_pass}", order,
                          row_of(_first_objective_violation)),
                Condition("OBJ103", f"p_value_less_than_{p_pass}", significance,
                          lambda v: data_row(v.get("file"), None)),
                Condition("OBJ104", "losses_finite", finite,
                          row_of(lambda v: (v["nonfinite"] or [{}])[0].get("id")))]


def _first_objective_violation(v: dict[str, Any]) -> str | None:
    """The first row out of order by the objective's doing (else the first out of order)."""
    theirs = set((v.get("model_ranking") or {}).get("excused") or [])
    ours = [r for r in v["violations"] if r not in theirs]
    return (ours or v["violations"] or [None])[0]
