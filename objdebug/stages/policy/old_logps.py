"""OBJ837: the rollouts' stored old log-probs are the policy's own.

A rollout buffer stores, per completion token, the log-prob the sampling policy gave it
(`[data] rollouts` "old_logps"); the loss's importance ratio is exp(log pi - old). At the
checkpoint the rollouts were sampled from, the ratio starts at 1: the stored values must equal the
policy's log-probs of the same tokens, scored as the trainer scores them (`[policy] temperature`).
Known ways they do not: the buffer kept the sampler's log-probs at another temperature, built its
mask differently (tokens stored as 0), or gathered one token off.

The policy's log-probs come from the shared `model.forward` graph (no graph of this check's own),
reduced on the host in float64; the diagnosis (a temperature that fits, a shift that fits, tokens
stored as 0) is numpy on the same logits, a reference reported as such.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.core.findings import Condition, Verdict
from objdebug.core.settings import Settings
from objdebug.pipeline.context import Context
from objdebug.stages.policy.base import PolicyCheck
from objdebug.stages.policy.session import session, token_logps

_LISTED = 4
_FIT_RANGE = (0.1, 10.0)  # the temperatures a fit may name


def _tokens(batch, logits: np.ndarray, temperature: float) -> np.ndarray:
    """float64[B, T]: the policy's token log-probs at `temperature` ("inputs" layout)."""
    return token_logps(logits / np.float32(temperature), batch.ids, batch.mask)


def measure_old_logps(s, warn: float) -> dict[str, Any]:
    """Stored vs the policy's own log-probs on every batch whose rows all carry `old_logps`; a
    difference beyond `warn` nats is explained (`_diagnose`)."""
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
    out = {"tokens": int(len(old)), "rows": int(sum(p[0].n for p in probed)), "temperature": temperature,
           "max_abs": float(np.max(np.abs(diff))), "mean_abs": float(np.mean(np.abs(diff))),
           "max_ratio": float(np.exp(np.max(np.abs(diff)))),
           "worst": [{"at": where[i], "stored": float(old[i]), "policy": float(lp[i])} for i in order[:_LISTED]]}
    if out["max_abs"] > warn:  # the diagnosis recomputes log-softmaxes: only for a mismatch
        out.update(_diagnose(probed, old, lp))
    return out


def _diagnose(probed: list, old: np.ndarray, lp: np.ndarray) -> dict[str, Any]:
    """numpy references on the same logits: the temperature the stored values fit best, their
    error against the next / the previous completion token's log-probs, tokens stored as 0."""
    from scipy.optimize import minimize_scalar

    diff = old - lp

    def error_at(tau: float) -> np.ndarray:
        return old - np.concatenate([_tokens(b, x, tau)[m] for b, x, m, _, _ in probed])

    # which temperature the stored values fit best (numpy reference; log-spaced search, refined)
    grid = np.exp(np.linspace(math.log(_FIT_RANGE[0]), math.log(_FIT_RANGE[1]), 25))
    errs = [float(np.mean(np.abs(error_at(t)))) for t in grid]
    k = int(np.argmin(errs))
    lo, hi = math.log(grid[max(k - 1, 0)]), math.log(grid[min(k + 1, len(grid) - 1)])
    fit = minimize_scalar(lambda u: float(np.mean(np.abs(error_at(math.exp(u))))), bounds=(lo, hi),
                          method="bounded", options={"xatol": 1e-4})
    tau = float(math.exp(fit.x))
    # one token off: each stored entry against the next / the previous completion token's
    shifts = {}
    for name, step in (("next", 1), ("previous", -1)):
        errs_s = []
        for b, _, m, old_b, lp_b in probed:
            for r in range(b.n):
                cols = np.nonzero(m[r])[0]
                if len(cols) < 2:
                    continue
                a, c = (cols[:-1], cols[1:]) if step == 1 else (cols[1:], cols[:-1])
                errs_s.append(np.abs(old_b[r, a] - lp_b[r, c]))
        shifts[name] = float(np.max(np.concatenate(errs_s))) if errs_s else math.inf
    zeros = (old == 0.0) & (lp < 0.0)
    return {"fit_temperature": tau, "fit_max_abs": float(np.max(np.abs(error_at(tau)))),
            "shift_max_abs": shifts, "zeros": int(zeros.sum()),
            "zeros_rest_max_abs": float(np.max(np.abs(diff[~zeros]))) if (~zeros).any() else 0.0}


class OldLogps(PolicyCheck):
    """The rollouts' stored old log-probs equal the policy's own (the ratio starts at 1)."""

    name = "policy-old-logps"

    def skip_reason(self, ctx: Context) -> str | None:
        reason = super().skip_reason(ctx)
        if reason:
            return reason
        if not any(c.old_logps is not None for c in session(ctx).rows):
            return "the rollouts carry no old_logps (nothing stored to compare with the policy's own)"
        return None

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        return measure_old_logps(session(ctx), float(th["old_logp_warn"]))

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        warn, fail = float(th["old_logp_warn"]), float(th["old_logp_fail"])

        def cause(v) -> str:
            if v["zeros"] and v["zeros_rest_max_abs"] <= warn:
                return (f": {v['zeros']} completion tokens are stored as 0 where the policy's log-prob is "
                        "below 0 (the buffer's mask is not the completion mask)")
            shifted = [k for k, e in v["shift_max_abs"].items() if e <= warn]
            if shifted:
                return (f": the stored values are the {shifted[0]} token's log-probs (max difference "
                        f"{v['shift_max_abs'][shifted[0]]:.2g}): gathered one position off")
            if v["fit_max_abs"] <= warn and abs(v["fit_temperature"] / v["temperature"] - 1) > 0.01:
                return (f": they are the policy's log-probs at temperature {v['fit_temperature']:.3g} (max "
                        f"difference {v['fit_max_abs']:.2g}), the loss scores at {v['temperature']:g} "
                        "([policy] temperature): stored at another temperature")
            return (": no temperature, one-token shift or mask explains it (another checkpoint, or the "
                    "completions scored with other padding or positions)")

        def judge(v):
            if not v["tokens"]:
                return Verdict.SKIP, "not judged: no batch whose rollouts all carry old_logps", None
            worst = "; ".join(f"{w['at']}: stored {w['stored']:.4g}, policy {w['policy']:.4g}"
                              for w in v["worst"][:2])
            what = (f"stored old_logps vs the policy's own log-probs (temperature {v['temperature']:g}, "
                    f"{v['tokens']} completion tokens of {v['rows']} rollouts): max |difference| "
                    f"{v['max_abs']:.3g} nats, mean {v['mean_abs']:.3g} (the importance ratio, 1 at this "
                    f"checkpoint, off by a factor up to {v['max_ratio']:.6g})")
            if v["max_abs"] <= warn:
                return Verdict.PASS, what, v["max_abs"]
            verdict = Verdict.WARN if v["max_abs"] <= fail else Verdict.FAIL
            return verdict, f"{what} (largest: {worst}){cause(v)}", v["max_abs"]

        return [Condition("OBJ837", "stored_old_logps_are_the_policys", judge)]

