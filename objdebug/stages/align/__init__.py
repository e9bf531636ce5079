"""Stage 1, align: the objective must rank good < medium < bad answers to the same prompt.

Each answer is scored by the user's objective on prompt + answer, with prompt and padding
positions labelled `label_pad_id` as the user's data pipeline would label them. Codes OBJ1xx.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.pipeline.context import Context
from objdebug.pipeline.datasets import _synthesize, align_rows, encoder, text_samples
from objdebug.core.findings import Check, Condition, Verdict, band, listing
from objdebug.core.settings import Settings
from objdebug.core.stats import mean_std, paired_greater
from objdebug.core.locations import config_key, data_row


def _finite(x: float) -> bool:
    return x is not None and math.isfinite(x)


# --------------------------------------------------------------------------- checks
def _no_align_data(ctx: Context) -> str | None:
    if not ctx.config.data.align:
        return "no align data: set data.align to a JSONL of {id, prompt, good, medium, bad} rows"
    return None


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

        per_row, gaps, violations, pair_ok, order_ok = [], [], [], 0, 0
        for r, lo in zip(rows, losses):
            gap = lo["bad"] - lo["good"]
            ordered = lo["bad"] > lo.get("medium", lo["good"]) > lo["good"] if "medium" in lo \
                else lo["bad"] > lo["good"]
            pair_ok += int(lo["bad"] > lo["good"])
            order_ok += int(bool(ordered))
            if not ordered:
                violations.append(r["id"])
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
            return verdict, (f"{x:.0%} of rows ordered bad > medium > good, bad > good in "
                             f"{v['pair_accuracy']:.0%}" + (f"; out of order: {shown}" if viol else "")
                             + f"; pass >= {ord_pass:.0%}, fail < {ord_fail:.0%}"), x

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
                          row_of(lambda v: (v["violations"] or [None])[0])),
                Condition("OBJ103", f"p_value_less_than_{p_pass}", significance,
                          lambda v: data_row(v.get("file"), None)),
                Condition("OBJ104", "losses_finite", finite,
                          row_of(lambda v: (v["nonfinite"] or [{}])[0].get("id")))]


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


class SynthesizedSanity(Check):
    """Clean text vs the same text shuffled and vs uniformly random tokens (OBJ106).

    Needs no labelled answers: any text of the target (a plain corpus is enough). Once a model has
    seen a few hundred steps, the objective must already give clean text a lower loss than its
    shuffled and random counterparts. At step 0 nothing can tell them apart, so on a model measured
    untrained the check is a note and is not evaluated at all.
    """

    name = "synthesized-sanity"
    stage = "align"
    needs_trained = ("OBJ106",)

    def enabled(self, th: dict[str, Any]) -> bool:
        return bool(th["sanity"])

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        from objdebug.pipeline import model_state
        from objdebug.engine.data import Sample

        reason = model_state.untrained_reason(ctx)
        if reason:  # step 0: skip the evaluation, say why
            return {"untrained": reason}
        samples = text_samples(ctx, int(th["sanity_samples"]))
        rng = np.random.default_rng(int(th["seed"]))
        vocab, pad = encoder(ctx).id_range, ctx.config.data.pad_id
        kinds = {"clean": None, "shuffled": "shuffled", "random": "random"}
        flat = []
        for s in samples:
            for kind, how in kinds.items():
                resp = s.response if how is None else _synthesize(s.response, how, rng, vocab, pad)
                flat.append(Sample(id=s.id, prompt=s.prompt, response=resp, kind=kind))
        values = ctx.engine.evaluate(flat, label="align: clean vs synthesized text")[:, 0]
        loss = {k: values[i::len(kinds)].astype(np.float64) for i, k in enumerate(kinds)}
        ok = (loss["clean"] < loss["shuffled"]) & (loss["clean"] < loss["random"])
        with np.errstate(invalid="ignore"):
            return {"n": len(samples), "mean_loss": {k: float(np.mean(v)) for k, v in loss.items()},
                    "gap_random": float(np.mean(loss["random"] - loss["clean"])),
                    "gap_shuffled": float(np.mean(loss["shuffled"] - loss["clean"])),
                    "order_accuracy": float(ok.mean()),
                    "out_of_order": [s.id for s, good in zip(samples, ok) if not good]}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        gap_pass, gap_fail = th["sanity_gap_pass"], th["sanity_gap_fail"]
        ord_pass, ord_fail = th["sanity_order_pass"], th["sanity_order_fail"]

        def judge(v):
            if "untrained" in v:
                return Verdict.INFO, (f"{v['untrained']}: not evaluated — at step 0 no model tells "
                                      f"clean text from shuffled or random tokens; rerun after a few "
                                      f"hundred steps"), None
            g, acc = v["gap_random"], v["order_accuracy"]
            gap_v = band(g, pass_if=lambda a: a >= gap_pass, fail_if=lambda a: a < gap_fail)
            ord_v = band(acc, pass_if=lambda a: a >= ord_pass, fail_if=lambda a: a < ord_fail)
            verdict = max(gap_v, ord_v, key=lambda x: x.rank)
            ml = v["mean_loss"]
            return verdict, (
                f"loss clean {ml['clean']:.3f} < shuffled {ml['shuffled']:.3f} and < random "
                f"{ml['random']:.3f} in {acc:.0%} of {v['n']} texts (gap random-clean {g:.3f}, "
                f"shuffled-clean {v['gap_shuffled']:.3f} nats)"
                + (f"; out of order: {listing(v['out_of_order'])}" if v["out_of_order"] else "")
                + f"; pass: gap >= {gap_pass} and >= {ord_pass:.0%} ordered, fail: gap < {gap_fail} "
                  f"or < {ord_fail:.0%}"), g

        return [Condition("OBJ106", f"clean_text_beats_synthesized_{gap_pass}", judge)]


def checks() -> list[Check]:
    from objdebug.stages.align.classification import ClassRanking  # [task] kinds (issue 47)
    from objdebug.stages.align.task_order import PairRanking, TagRanking

    return [AlignmentLoss(), LabelPadMasking(), SynthesizedSanity(), ClassRanking(), TagRanking(),
            PairRanking()]
