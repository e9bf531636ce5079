"""Stage 5, correlate: per-sample loss of the user's objective against human quality scores.

Each scored response is evaluated by the user's objective (prompt + response, prompt and padding
labelled `label_pad_id`, as in align), giving one loss per row. Lower loss should mean a higher
human score, so a healthy objective has a clearly negative Pearson r. Spearman rho and Kendall
tau-b are reported beside it (human ratings are ordinal and full of ties), with a seeded paired
bootstrap interval for r (BCa by default). Codes OBJ4xx.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.core import stats
from objdebug.pipeline.context import Context
from objdebug.pipeline.datasets import score_rows
from objdebug.core.findings import Check, Condition, Verdict, band, listing
from objdebug.core.settings import Settings

_SHOWN = 8


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(x, spec)


def response_losses(ctx: Context) -> dict[str, Any]:
    """Per-row loss of the scored responses (shared with any stage that needs it)."""
    def compute() -> dict[str, Any]:
        rows = score_rows(ctx)
        values = ctx.engine.evaluate([r["sample"] for r in rows],
                                     label="correlate: scoring responses")[:, 0]
        return {"rows": rows, "losses": np.asarray(values, dtype=np.float64)}
    return ctx.provide(response_losses, compute)


def _aspects(aspects: list[dict[str, float]], losses: np.ndarray, finite: np.ndarray) -> dict[str, Any]:
    names = sorted({a for row in aspects for a in row})
    out = {}
    for name in names:
        have = np.array([name in row for row in aspects]) & finite
        scores = np.array([row.get(name, np.nan) for row in aspects])[have]
        c = stats.correlations(losses[have], scores)
        out[name] = {**c.to_dict(), "constant_score": stats.is_constant(scores)}
    return out


def check_settings(settings: dict[str, Any], source: str) -> None:
    """The bootstrap settings of the profile's [correlate] section; a bad value is an InputError."""
    from objdebug.core.errors import InputError

    method = settings["ci_method"]
    if method not in stats.CI_METHODS:
        raise InputError(f"For '[correlate] ci_method', the value must be in {list(stats.CI_METHODS)}, "
                         f"but got {method!r}.", source=source)
    level = settings["ci_level"]
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise InputError(f"For '[correlate] ci_level', the value must be in (0, 1), but got {level!r}.",
                         source=source)
    for key, low in (("bootstrap_resamples", 1), ("seed", 0), ("min_samples", 3)):
        value = settings[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InputError(f"For '[correlate] {key}', the value must be an integer >= {low}, but got "
                             f"{value!r}.", source=source)


def measure_vectors(ids: list[str], losses, scores, lengths, aspects: list[dict[str, float]] | None = None,
                    settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """The correlate measurement from plain vectors (one entry per scored row).

    `settings` is the profile's [correlate] section (bootstrap_resamples, ci_level, ci_method,
    seed; default: checks/default.toml's). Non-finite losses are listed and left out of every
    statistic.
    """
    if settings is None:
        from objdebug.pipeline.profile import load_profile

        settings = load_profile("default").section("correlate")
    level = float(settings["ci_level"])
    method = str(settings["ci_method"])
    resamples = int(settings["bootstrap_resamples"])
    seed = int(settings["seed"])
    losses = np.asarray(losses, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    lengths = np.asarray(lengths, dtype=np.float64)
    aspects = aspects if aspects is not None else [{} for _ in ids]
    finite = np.isfinite(losses)
    lf, sf, nf = losses[finite], scores[finite], lengths[finite]

    corr = stats.correlations(lf, sf)
    ci = stats.bootstrap_pearson_ci(lf, sf, n_resamples=resamples, level=level, seed=seed,
                                    method=method)
    length_corr = stats.correlations(lf, nf)
    partial_r, partial_p = stats.partial_pearson(lf, sf, nf)
    slope, intercept = stats.linear_fit(sf, lf)
    return {
        "n_rows": len(ids),
        **corr.to_dict(),
        "ci": ci.to_dict(),
        "fisher_ci": list(stats.fisher_ci(corr.pearson_r, corr.n, level)),
        "constant_loss": stats.is_constant(lf),
        "constant_score": stats.is_constant(sf),
        "mean_loss": stats.mean_std(lf)[0],
        "std_loss": stats.mean_std(lf)[1],
        "nonfinite": [i for i, ok in zip(ids, finite) if not ok],
        "length": {
            "loss_pearson_r": length_corr.pearson_r,
            "loss_spearman_rho": length_corr.spearman_rho,
            "score_pearson_r": stats.correlations(sf, nf).pearson_r,
            "partial_r": partial_r,
            "partial_p": partial_p,
            "constant_length": stats.is_constant(nf),
            "mean_tokens": float(nf.mean()) if nf.size else float("nan"),
        },
        "aspects": _aspects(aspects, losses, finite),
        "fit": {"slope": slope, "intercept": intercept},  # loss = slope * score + intercept
        # a value of the run's own scale beyond float64 (a slope of losses ~1 over scores ~1e-300):
        # named, and the finding says so (issue 46)
        "out_of_range": [k for k, v in (("fit.slope", slope), ("fit.intercept", intercept))
                         if math.isinf(v)],
        # the scatter's points: report/figures.py draws it from the report alone
        "points": [{"id": i, "loss": float(lo), "score": float(s), "length": int(n)}
                   for i, lo, s, n in zip(ids, losses, scores, lengths)],
    }


# --------------------------------------------------------------------------- checks
class ScoreCorrelation(Check):
    """Loss vs human score: Pearson with a bootstrap interval, Spearman, Kendall, length, aspects."""

    name = "score-correlation"
    stage = "correlate"
    # tracking human judgement is learned; finiteness (OBJ402) is judged on any model
    needs_trained = ("OBJ401", "OBJ403", "OBJ404")
    kinds = ("causal-lm", "classification", "tagging", "embedding")  # task_rows.py: the other kinds' losses

    def skip_reason(self, ctx: Context) -> str | None:
        if not ctx.config.data.scores:
            return "no human scores: set data.scores to a JSONL file of {response, score} rows"
        return None

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        settings = th
        check_settings(settings, ctx.profile.source)
        if ctx.config.task.kind != "causal-lm":  # one loss per row of the kind, same statistics
            from objdebug.stages.correlate import task_rows

            return measure_vectors(*task_rows.vectors(ctx), None, settings)
        data = response_losses(ctx)
        rows = data["rows"]
        return measure_vectors([r["id"] for r in rows], data["losses"], [r["score"] for r in rows],
                               [len(r["sample"].response) for r in rows],
                               [r["aspects"] for r in rows], settings)

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        r_pass, r_fail = th["r_pass"], th["r_fail"]
        min_samples = th["min_samples"]
        len_warn, ratio = th["length_corr_warn"], th["partial_ratio"]
        aspect_warn = th["aspect_r_warn"]

        def pearson(v):
            n, r = v["n"], v["pearson_r"]
            left_out = f" ({len(v['nonfinite'])} non-finite losses left out, see OBJ402)" \
                if v["nonfinite"] else ""
            if n < min_samples:
                return Verdict.ERROR, (f"only {n} scored samples with a finite loss{left_out}: too "
                                       f"few for a meaningful correlation interval (profile "
                                       f"min_samples = {min_samples}); add scored rows"), r
            if v["constant_score"]:
                return Verdict.ERROR, (f"all {n} human scores are equal: nothing "
                                       f"to correlate; the scores file needs varied ratings"), r
            if v["constant_loss"]:
                return Verdict.FAIL, (f"the objective gives all {n} responses the same loss "
                                      f"({v['mean_loss']:.4g}): it does not depend on the response, "
                                      f"so it cannot track quality{left_out}"), r
            ci = v["ci"]
            verdict = band(r, pass_if=lambda a: a <= r_pass, fail_if=lambda a: a > r_fail)
            note = ""
            if v.get("out_of_range"):  # r is scale-free; the fitted line in the scores' units is not
                left_out += (f"; {' and '.join(v['out_of_range'])} of the fitted line is beyond "
                             f"float64 (the scores' scale), out of range: not drawn")
            ci_ok = math.isfinite(ci["low"]) and math.isfinite(ci["high"])
            if verdict == Verdict.PASS and (not ci_ok or ci["low"] <= 0 <= ci["high"]):
                verdict = Verdict.WARN
                note = "; the interval contains 0, so the correlation is not established: not a pass"
            return verdict, (
                f"Pearson r(loss, score) = {_fmt(r)} ({ci['level']:.0%} {ci['method']} CI "
                f"[{_fmt(ci['low'])}, {_fmt(ci['high'])}], p = {_fmt(v['pearson_p'], '.2g')}), "
                f"Spearman rho = {_fmt(v['spearman_rho'])}, Kendall tau-b = "
                f"{_fmt(v['kendall_tau_b'])}, n = {n}{left_out}; pass <= {r_pass}, "
                f"fail > {r_fail}{note}"), r

        def finite(v):
            bad = v["nonfinite"]
            if bad:
                return Verdict.FAIL, (f"{len(bad)} of {v['n_rows']} scored responses have a "
                                      f"non-finite loss (NaN/Inf): {listing(bad, _SHOWN)}"), float(len(bad))
            return Verdict.PASS, f"all {v['n_rows']} response losses finite", 0.0

        def length(v):
            ln, r = v["length"], v["pearson_r"]
            rl, partial = ln["loss_pearson_r"], ln["partial_r"]
            if v["n"] < min_samples:
                return Verdict.SKIP, f"too few samples ({v['n']} < min_samples = {min_samples})", rl
            if ln["constant_length"]:
                return Verdict.PASS, (f"all responses have {ln['mean_tokens']:g} tokens: "
                                      f"length cannot confound"), rl
            if not (math.isfinite(rl) and math.isfinite(partial) and math.isfinite(r)):
                return Verdict.PASS, (f"corr(loss, length) = {_fmt(rl)}, partial r = {_fmt(partial)}: "
                                      f"undefined, no confound measurable"), rl
            confounded = abs(rl) >= len_warn and abs(partial) < ratio * abs(r)
            return (Verdict.WARN if confounded else Verdict.PASS), (
                f"corr(loss, response length) = {rl:.3f} (Spearman {_fmt(ln['loss_spearman_rho'])}), "
                f"corr(score, length) = {_fmt(ln['score_pearson_r'])}; r(loss, score) = {r:.3f}, "
                f"partial r controlling for length = {partial:.3f} (p = {_fmt(ln['partial_p'], '.2g')})"
                + ("; the objective tracks length more than quality" if confounded else "")
                + f"; warn when |corr(loss, length)| >= {len_warn} and |partial| < {ratio} * |r|"), rl

        def aspects(v):
            asp = v["aspects"]
            if not asp:
                return Verdict.SKIP, "no per-aspect ratings (rows carry no 'scores' object)", None
            parts, weak, worst = [], [], -math.inf
            for name, a in asp.items():
                r = a["pearson_r"]
                parts.append(f"{name} r = {_fmt(r)} rho = {_fmt(a['spearman_rho'])} "
                             f"tau-b = {_fmt(a['kendall_tau_b'])} (n = {a['n']})")
                if a["n"] < min_samples or a["constant_score"]:
                    continue  # not judged: too few ratings or no variation in this aspect
                if not math.isfinite(r) or r > aspect_warn:
                    weak.append(name)
                worst = max(worst, r) if math.isfinite(r) else math.inf
            verdict = Verdict.WARN if weak else Verdict.PASS
            lead = f"the objective misses aspect(s) {', '.join(weak)}: " if weak else ""
            key = worst if math.isfinite(worst) else None
            return verdict, (lead + "; ".join(parts) + f"; warn when an aspect's r > {aspect_warn}"), key

        return [Condition("OBJ401", f"pearson_r_not_greater_than_{r_pass}", pearson),
                Condition("OBJ402", "losses_finite", finite),
                Condition("OBJ403", f"length_not_confounding_{len_warn}", length),
                Condition("OBJ404", f"aspect_r_not_greater_than_{aspect_warn}", aspects)]


def checks() -> list[Check]:
    return [ScoreCorrelation()]
