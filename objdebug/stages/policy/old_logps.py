"""OBJ837: the rollouts' stored old log-probs carry no systematic mistake.

A rollout buffer stores, per completion token, the log-prob the *sampling* policy gave it
(`[data] rollouts` "old_logps"); the loss's importance ratio is exp(log pi - old). The sampler is
usually not this checkpoint: several optimizer steps run on one buffer, or a separate engine
(vLLM) sampled it, so the stored values differ from the checkpoint's own by design; that drift is
what the ratio and the clip exist for, and it is reported as a note (median and max |log ratio|,
the share of ratios outside the clip). What the stored values can show is a *systematic* mistake,
each with a signature a stale policy's unbiased noise does not have:

- tokens stored as 0 (the buffer's mask is not the completion mask): exact zeros where the policy
  is far from sure of the token;
- a one-token shift: the stored values match the next (or previous) completion token's log-probs;
- the whole vocabulary's argmax: they match max_v log p(v) per position, not the sampled token's;
- a sampling temperature: they match the policy's log-probs at another temperature (fitted);
- another tokenizer's ids: uncorrelated with the policy's, far lower;
- a top_p / top_k renormalisation (vLLM): slightly above the policy's, nearly all of one sign (a
  note: the sampler's truncated distribution, a known training-inference mismatch).

`[policy] old_logps_source = "this-checkpoint"` declares that this checkpoint sampled the buffer:
then the plain comparison applies (the ratio starts at 1) and a difference beyond `old_logp_fail`
FAILs, its cause named by the same signatures.

The policy's log-probs come from the shared `model.forward` graph (no graph of this check's own),
reduced on the host in float64; the signatures (a temperature fit, shifts, the argmax, a
correlation) are numpy on the same logits, references reported as such.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.core.findings import Condition, Verdict
from objdebug.core.settings import Settings
from objdebug.pipeline.context import Context
from objdebug.stages.policy.base import PolicyCheck
from objdebug.stages.policy.session import log_softmax64, session, token_logps

_LISTED = 4
_FIT_RANGE = (0.1, 10.0)  # the temperatures a fit may name
_DEFAULT_CLIP = 0.2       # the drift note's clip range when the objective declares none


def _tokens(batch, logits: np.ndarray, temperature: float) -> np.ndarray:
    """float64[B, T]: the policy's token log-probs at `temperature` ("inputs" layout)."""
    return token_logps(logits / np.float32(temperature), batch.ids, batch.mask)


def _argmax_logps(logits: np.ndarray, temperature: float) -> np.ndarray:
    """float64[B, T]: max_v log p(v) of the distribution that predicts token t (at t, "inputs")."""
    out = np.zeros(logits.shape[:2])
    out[:, 1:] = log_softmax64(logits[:, :-1] / np.float32(temperature)).max(-1)
    return out


def measure_old_logps(s, th: Settings) -> dict[str, Any]:
    """Stored vs the policy's own log-probs on every batch whose rows all carry `old_logps`, their
    drift, and each systematic mistake's signature (`_signatures`)."""
    temperature = float(s.policy.temperature)
    stored, own, probed, where = [], [], [], []
    for b in s.batches:
        old = s.stored_old(b)
        if old is None:
            continue
        logits = s.logits(b)  # the shared forward: the checkpoint as loaded
        real = np.zeros(b.mask.shape, bool)
        real[:b.n] = True
        scored = b.mask & real
        scored[:, 0] = False  # position 0 has no log-prob (nothing before it)
        lp = _tokens(b, logits, temperature)
        stored.append(old[scored])
        own.append(lp[scored])
        probed.append((b, logits, scored, old, lp))
        for r, t in zip(*np.nonzero(scored)):
            c = b.rows[r]
            where.append(f"{c.group_id}/{c.index} token {t - len(c.prompt)}")
    if not stored:
        return {"tokens": 0}
    old, lp = np.concatenate(stored), np.concatenate(own)
    diff = old - lp
    order = np.argsort(-np.abs(diff), kind="stable")
    lo, hi = s.epsilons()
    lo = _DEFAULT_CLIP if lo is None else float(lo)
    hi = lo if hi is None else float(hi)
    ratio = np.exp(-diff)  # pi / pi_old of each token at this checkpoint
    out = {"tokens": int(len(old)), "rows": int(sum(p[0].n for p in probed)), "temperature": temperature,
           "source": getattr(s.policy, "old_logps_source", "sampler"),
           "max_abs": float(np.max(np.abs(diff))), "mean_abs": float(np.mean(np.abs(diff))),
           "median_abs": float(np.median(np.abs(diff))), "mean": float(np.mean(diff)),
           "max_ratio": float(np.exp(np.max(np.abs(diff)))), "clip": (lo, hi),
           "outside_clip": float(np.mean((ratio < 1 - lo) | (ratio > 1 + hi))),
           "worst": [{"at": where[i], "stored": float(old[i]), "policy": float(lp[i])} for i in order[:_LISTED]]}
    if out["max_abs"] > float(th["old_logp_warn"]):  # the signatures recompute log-softmaxes
        out.update(_signatures(probed, old, lp, temperature, th))
    return out


def _signatures(probed: list, old: np.ndarray, lp: np.ndarray, temperature: float,
                th: Settings) -> dict[str, Any]:
    """numpy references on the same logits: the error of the stored values against each mistake's
    prediction (mean |difference|), to compare with their error against the policy's own."""
    from scipy.optimize import minimize_scalar

    def error_at(tau: float) -> np.ndarray:
        return old - np.concatenate([_tokens(b, x, tau)[m] for b, x, m, _, _ in probed])

    # the temperature the stored values fit best (log-spaced search, refined)
    grid = np.exp(np.linspace(math.log(_FIT_RANGE[0]), math.log(_FIT_RANGE[1]), 25))
    errs = [float(np.mean(np.abs(error_at(t)))) for t in grid]
    k = int(np.argmin(errs))
    a, c = math.log(grid[max(k - 1, 0)]), math.log(grid[min(k + 1, len(grid) - 1)])
    fit = minimize_scalar(lambda u: float(np.mean(np.abs(error_at(math.exp(u))))), bounds=(a, c),
                          method="bounded", options={"xatol": 1e-4})
    tau = float(math.exp(fit.x))
    fitted = error_at(tau)
    # one token off: each stored entry against the next / the previous completion token's
    shifts = {}
    for name, step in (("next", 1), ("previous", -1)):
        mine, theirs = [], []
        for b, _, m, old_b, lp_b in probed:
            for r in range(b.n):
                cols = np.nonzero(m[r])[0]
                if len(cols) < 2:
                    continue
                x, y = (cols[:-1], cols[1:]) if step == 1 else (cols[1:], cols[:-1])
                theirs.append(np.abs(old_b[r, x] - lp_b[r, y]))
                mine.append(np.abs(old_b[r, x] - lp_b[r, x]))
        shifts[name] = ((float(np.mean(np.concatenate(theirs))), float(np.mean(np.concatenate(mine))))
                        if theirs else (math.inf, math.inf))
    # the whole vocabulary's argmax, judged where the sampled token is not the argmax (elsewhere
    # the two are the same number)
    top = np.concatenate([_argmax_logps(x, temperature)[m] for b, x, m, _, _ in probed])
    apart = top - lp > float(th["old_logp_argmax_gap"])
    argmax = ((float(np.mean(np.abs(old[apart] - top[apart]))), float(np.mean(np.abs(old[apart] - lp[apart]))))
              if apart.sum() >= 2 else None)
    floor = float(th["old_logp_zero_floor"])
    zeros = (old == 0.0) & (lp < -floor)
    # a mask one token short or long zeroes the same place of every completion: its first or last
    # token stored as 0 in every row, where the policy is far from sure of at least one
    aligned = {}
    for name, pick in (("first", 0), ("last", -1)):
        at = [(old_b[r, np.nonzero(m[r])[0][pick]], lp_b[r, np.nonzero(m[r])[0][pick]])
              for b, _, m, old_b, lp_b in probed for r in range(b.n) if m[r].any()]
        if at and all(o == 0.0 for o, _ in at) and any(x < -floor for _, x in at):
            aligned[name] = (len(at), float(min(x for _, x in at)))
    corr = float(np.corrcoef(old, lp)[0, 1]) if old.std() > 0 and lp.std() > 0 else 0.0
    d = old - lp
    return {"fit_temperature": tau, "fit_mean_abs": float(np.mean(np.abs(fitted))),
            "fit_max_abs": float(np.max(np.abs(fitted))), "shift_mean_abs": shifts,
            "argmax_mean_abs": argmax, "argmax_positions": int(apart.sum()),
            "zeros": int(zeros.sum()), "aligned_zeros": aligned, "zeros_rest_max_abs": float(np.max(np.abs(d[~zeros]))) if (~zeros).any() else 0.0,
            "correlation": corr, "positive_share": float(np.mean(d > 0)), "median": float(np.median(d))}


def systematic(v: dict[str, Any], th: dict[str, Any]) -> tuple[str, str] | None:
    """(name, sentence) of the systematic mistake whose signature the stored values carry, else None."""
    if "zeros" not in v:
        return None
    gain = float(th["old_logp_signature_gain"])  # a signature explains the values this many times better
    plain = v["mean_abs"]
    share = v["zeros"] / max(v["tokens"], 1)
    if v["aligned_zeros"]:
        place, (n, low) = next(iter(v["aligned_zeros"].items()))
        return "zeros", (f"the {place} completion token of all {n} completions is stored as 0 (the policy's "
                         f"log-prob there as low as {low:.4g}): the buffer's mask is not the completion "
                         "mask (one token short or long)")
    if v["zeros"] >= 2 and share >= float(th["old_logp_zero_share"]):
        return "zeros", (f"{v['zeros']} completion tokens are stored as 0 where the policy's log-prob is "
                         f"below -{float(th['old_logp_zero_floor']):g} (the rest differ by at most "
                         f"{v['zeros_rest_max_abs']:.3g}): the buffer's mask is not the completion mask")
    for name, (theirs, mine) in v["shift_mean_abs"].items():
        if theirs * gain <= mine:
            return "shift", (f"the stored values are the {name} token's log-probs (mean |difference| "
                             f"{theirs:.3g} against it, {mine:.3g} against the token's own): gathered one "
                             "position off")
    if v["argmax_mean_abs"] is not None:
        theirs, mine = v["argmax_mean_abs"]
        if theirs * gain <= mine:
            return "argmax", (f"the stored values are the log-probs of the whole vocabulary's argmax (mean "
                              f"|difference| {theirs:.3g} against max_v log p(v) at the "
                              f"{v['argmax_positions']} positions whose sampled token is not the argmax, "
                              f"{mine:.3g} against the sampled token's): the sampled token's log-prob was "
                              "not gathered")
    if (abs(v["fit_temperature"] / v["temperature"] - 1) > float(th["old_logp_temperature_rtol"])
            and v["fit_mean_abs"] * gain <= plain):
        return "temperature", (f"they are the policy's log-probs at temperature {v['fit_temperature']:.3g} "
                               f"(mean |difference| {v['fit_mean_abs']:.2g}, max {v['fit_max_abs']:.2g}), the "
                               f"loss scores at {v['temperature']:g} ([policy] temperature): stored at the "
                               "sampler's temperature")
    if v["correlation"] < float(th["old_logp_min_correlation"]) and abs(v["mean"]) > float(th["old_logp_tokenizer_gap"]):
        side = "below" if v["mean"] < 0 else "above"
        return "tokenizer", (f"they are uncorrelated with the policy's (correlation {v['correlation']:.2f}) "
                             f"and {abs(v['mean']):.3g} nats {side} them on average: log-probs of other "
                             "tokens (another tokenizer's ids, or rows of another buffer)")
    return None


def _renormalised(v: dict[str, Any], th: dict[str, Any]) -> bool:
    """Slightly above the policy's and nearly all of one sign: a top_p / top_k renormalisation."""
    return ("positive_share" in v and v["positive_share"] >= float(th["old_logp_offset_share"])
            and v["median"] > 0)


class OldLogps(PolicyCheck):
    """The rollouts' stored old log-probs carry no systematic mistake (the policy's own, where this
    checkpoint sampled them)."""

    name = "policy-old-logps"

    def skip_reason(self, ctx: Context) -> str | None:
        reason = super().skip_reason(ctx)
        if reason:
            return reason
        if not any(c.old_logps is not None for c in session(ctx).rows):
            return "the rollouts carry no old_logps (nothing stored to compare with the policy's own)"
        return None

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        return measure_old_logps(session(ctx), th)

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        warn, fail = float(th["old_logp_warn"]), float(th["old_logp_fail"])

        def judge(v):
            if not v["tokens"]:
                return Verdict.SKIP, "not judged: no batch whose rollouts all carry old_logps", None
            lo, hi = v["clip"]
            drift = (f"stored old_logps vs this checkpoint's log-probs (temperature {v['temperature']:g}, "
                     f"{v['tokens']} completion tokens of {v['rows']} rollouts): |log ratio| median "
                     f"{v['median_abs']:.3g}, mean {v['mean_abs']:.3g}, max {v['max_abs']:.3g} nats; "
                     f"{v['outside_clip']:.0%} of ratios outside the clip [{1 - lo:g}, {1 + hi:g}]")
            if v["max_abs"] <= warn:
                return Verdict.PASS, drift + ": on-policy (the ratio starts at 1)", v["max_abs"]
            found = systematic(v, th)
            if found is not None:
                return Verdict.FAIL, f"{drift}: {found[1]}", v["max_abs"]
            worst = "; ".join(f"{w['at']}: stored {w['stored']:.4g}, policy {w['policy']:.4g}"
                              for w in v["worst"][:2])
            if v["source"] == "this-checkpoint":
                verdict = Verdict.WARN if v["max_abs"] <= fail else Verdict.FAIL
                return verdict, (f"{drift} (largest: {worst}), but [policy] old_logps_source = "
                                 "'this-checkpoint' declares this checkpoint sampled them (the ratio must "
                                 "start at 1): no temperature, shift, mask or argmax explains it (another "
                                 "checkpoint, or the completions scored with other padding or positions)"), v["max_abs"]
            if _renormalised(v, th):
                return Verdict.INFO, (f"{drift}; {v['positive_share']:.0%} of them above the policy's "
                                      f"(median offset {v['median']:.3g}): the sampler's top_p / top_k "
                                      "renormalisation (vLLM), a known training-inference mismatch"), v["max_abs"]
            return Verdict.INFO, (f"{drift} (largest: {worst}): the drift of the policy that sampled the "
                                  "buffer (no systematic mistake: no temperature, shift, mask, argmax or "
                                  "other tokens explains it)"), v["max_abs"]

        return [Condition("OBJ837", "stored_old_logps_carry_no_systematic_mistake", judge)]
