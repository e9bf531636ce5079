"""OBJ706 token weighting under gradient accumulation / data parallel.

A training loop that splits a batch into K micro-batches (gradient accumulation) or K ranks (data
parallel) computes the objective on each part and averages the K gradients. For an objective that
averages over its own micro-batch's tokens, a token then weighs 1 / (K · n_k), with n_k the scored
tokens of its micro-batch, instead of 1 / n as in one batch: short sequences count more
(transformers PR 34191 / 34373, torchtitan PR 2206). Measured on the batch's real rows and lengths:
the logit gradient of the whole batch against the mean of the K micro-batch gradients; a scored
token's effective weight is the ratio of its gradient norms (accumulated / whole batch), reported
as max/min with the cosine of the two gradients. Then the normalization that makes them equal:
each micro-batch's loss weighted by n_k / n (its share of the scored tokens; equivalently a summed
loss divided by the global token count), applied to the same micro-batch gradients.

For a per-batch mean cross-entropy the unequal weighting is its documented nature, not a bug: the
verdict is the profile's `token_weighting` (default "info"); a training setup that relies on
accumulation being equivalent to one batch sets it to "warn" or "fail". A config that declares the
trainer's accumulation (`[run] grad_accumulation_steps = K`: the loop averages K micro-batch
losses per step) is measured at those K micro-batches and FAILs beyond the tolerance: that loop
then trains the mis-weighted objective (transformers #34191), whatever the profile's note says.

Graphs: `objective.logit_grad` at the batch shape (shared) and at the micro-batch
shape (shared with OBJ704 and OBJ710).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.pipeline.context import Context
from objdebug.core.findings import Check, Condition, Verdict
from objdebug.core.settings import Settings
from objdebug.stages.invariants._common import (accumulation_steps, base, batch, declared_accumulation, micro_batches,
    micro_probes, scored, skip_end_to_end)


def _weights(acc: np.ndarray, full: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Per scored token: |accumulated gradient| / |whole-batch gradient| (tokens with a gradient)."""
    a = np.sqrt((acc.astype(np.float64) ** 2).sum(-1))[keep]
    f = np.sqrt((full.astype(np.float64) ** 2).sum(-1))[keep]
    # confident positions (gradient norm < 1% of the largest) carry the float32 cancellation of
    # p_y - 1 and would show noise, not weighting
    use = f >= 1e-2 * max(float(f.max()), 1e-30)
    return a[use] / f[use]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return float((a * b).sum() / (na * nb)) if na > 0 and nb > 0 else float("nan")


class TokenWeighting(Check):
    """Whole-batch gradient vs the mean of K micro-batch gradients: effective token weights."""

    name = "token-weighting"
    stage = "invariants"

    def skip_reason(self, ctx: Context) -> str | None:
        return skip_end_to_end(ctx, "micro-batches (other batch shapes)")

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        b, full = batch(ctx), base(ctx).grad
        keep = scored(ctx, b.labels)
        ranges, micro = micro_batches(ctx), micro_probes(ctx)
        k = len(ranges)
        acc = np.zeros(full.shape, np.float64)
        fixed = np.zeros(full.shape, np.float64)
        n_total = int(keep.sum())
        counts = []
        for (s, e), p in zip(ranges, micro):
            n_k = int(keep[s:e].sum())
            counts.append(n_k)
            acc[s:e] = p.grad / k                      # what the loop does: mean of K gradients
            fixed[s:e] = p.grad * (n_k / max(n_total, 1))  # weighted by the share of tokens
        out = {"micro_batches": k, "rows_per_micro_batch": ranges[0][1] - ranges[0][0],
               "tokens_per_micro_batch": counts, "scored": n_total,
               "declared": accumulation_steps(ctx),
               "declared_as": "run.{}".format(*declared_accumulation(ctx)) if declared_accumulation(ctx) else None}
        if not (np.isfinite(full).all() and np.isfinite(acc).all()) or n_total == 0:
            out.update(finite=False)
            return out
        for key, g in (("mean", acc), ("token_share", fixed)):
            w = _weights(g, full, keep)
            out[key] = {"max_min": float(w.max() / w.min()) if w.size and w.min() > 0 else float("nan"),
                        "cosine": _cosine(g, full),
                        "scale": float(np.median(w)) if w.size else float("nan")}
        out["finite"] = True
        return out

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        tol = float(th["token_weight_tolerance"])
        verdict = Verdict.from_setting(th["token_weighting"], "[invariants] token_weighting")

        def judge(v):
            if not v.get("finite"):
                return Verdict.SKIP, "not judged: a gradient is not finite or nothing is scored", None
            m, f = v["mean"], v["token_share"]
            declared = v.get("declared")
            key = v.get("declared_as") or "run.grad_accumulation_steps"
            value = declared if key == "run.grad_accumulation_steps" else v["rows_per_micro_batch"]
            said = f" ({key} = {value}: the trainer averages them)" if declared else ""
            what = (f"{v['micro_batches']} micro-batches{said} of {v['rows_per_micro_batch']} row(s) "
                    f"({min(v['tokens_per_micro_batch'])}-{max(v['tokens_per_micro_batch'])} scored "
                    f"tokens each, {v['scored']} in all), gradients averaged as accumulation or data "
                    f"parallel does: effective token weight max/min {m['max_min']:.4g}, cosine with "
                    f"the whole batch {m['cosine']:.6f}")
            if m["max_min"] - 1.0 <= tol:
                return Verdict.PASS, what + f"; tokens weigh equally (within {tol:.0e})", m["max_min"]
            fix = (f"; weighting each micro-batch's loss by its share of scored tokens n_k/n (sum the "
                   f"token losses, divide by the global token count) gives max/min {f['max_min']:.4g}, "
                   f"cosine {f['cosine']:.6f}")
            if f["max_min"] - 1.0 > tol:
                fix += " (not equal either: the objective weighs tokens by more than its micro-batch's count)"
            if declared:  # the declared loop trains this weighting: a failure, not a note
                return Verdict.FAIL, (what + fix + "; the declared accumulation trains a different "
                                      "objective than one batch of the same rows"), m["max_min"]
            return verdict, what + fix, m["max_min"]

        return [Condition("OBJ706", f"token_weights_equal_within_{tol}", judge)]
