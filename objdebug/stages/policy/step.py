"""OBJ832: one SGD step on the real model raises positive-advantage completions over negative ones.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.core.findings import Condition, Verdict
from objdebug.core.settings import Settings
from objdebug.pipeline.context import Context
from objdebug.stages.policy.base import PolicyCheck
from objdebug.stages.policy.session import session


class Step(PolicyCheck):
    """One small SGD step on the real model raises positive-advantage completions' log-probs."""

    name = "policy-step"

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        import mindspore as ms

        from objdebug.engine.gradients import model_vjp

        s = session(ctx)
        model = ctx.target.model
        params = list(model.trainable_params())
        total = [np.zeros(p.shape, np.float64) for p in params]
        before, losses = [], []
        temperature = float(th["probe_temperature"])
        for b in s.batches:
            logits = s.probe_logits(b)  # the objective sees the logits / T: d/d raw logits is d/d them / T
            lp = s.logps(b, logits)
            ref = s.reference_logps(b) if s.reference_model is not None else lp
            out = s.evaluate(b, logits, b.advantages, np.where(b.mask, lp, 0.0), np.where(b.mask, ref, 0.0))
            losses.append(out["loss"])
            before.append(lp)
            _, grads = model_vjp(ctx.engine, ctx.target, ms.Tensor(b.model_ids, ms.int32),
                                 ms.Tensor((out["dlogits"] / np.float32(temperature)).astype(np.float32)))
            for k, gr in enumerate(grads):
                total[k] += gr.asnumpy().astype(np.float64)
        gnorm = math.sqrt(sum(float((g * g).sum()) for g in total))
        saved = [p.data.asnumpy().copy() for p in params]
        theta = math.sqrt(sum(float((x.astype(np.float64) ** 2).sum()) for x in saved))
        rel = float(th["step_rel"])
        after = []
        try:
            if gnorm > 0 and math.isfinite(gnorm):
                lr = rel * theta / gnorm
                for p, x, g in zip(params, saved, total):
                    p.set_data(ms.Tensor((x.astype(np.float64) - lr * g).astype(x.dtype)))
            for b in s.batches:
                after.append(s.logps(b, s.probe_logits(b)))
        finally:
            for p, x in zip(params, saved):
                p.set_data(ms.Tensor(x))
        rows = []
        for b, lb, la in zip(s.batches, before, after):
            for r in range(b.n):
                m = b.mask[r]
                if m.any():
                    rows.append({"row": f"{b.rows[r].group_id}/{b.rows[r].index}", "advantage": float(b.advantages[r]),
                                 "delta_logp": float((la[r][m] - lb[r][m]).mean())})
        eps = float(th["advantage_epsilon"])
        pos = [x["delta_logp"] for x in rows if x["advantage"] > eps]
        neg = [x["delta_logp"] for x in rows if x["advantage"] < -eps]
        score = float(sum(x["advantage"] * x["delta_logp"] for x in rows))
        return {"grad_norm": gnorm, "param_norm": theta, "step_rel": rel, "loss": float(np.mean(losses)),
                "positive_mean": float(np.mean(pos)) if pos else None,
                "negative_mean": float(np.mean(neg)) if neg else None,
                "advantage_weighted": score, "rows": rows}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        def judge(v):
            if not (v["grad_norm"] > 0 and math.isfinite(v["grad_norm"])):
                return Verdict.FAIL, f"the policy gets no usable gradient (|g| = {v['grad_norm']:.3g})", None
            if v["positive_mean"] is None or v["negative_mean"] is None:
                return Verdict.SKIP, "not judged: no completions with both positive and negative advantages", None
            what = (f"one step of {v['step_rel']:.0e} x |theta| along -gradient (|g| {v['grad_norm']:.3g}): mean "
                    f"token log-prob change {v['positive_mean']:+.3g} on positive-advantage completions, "
                    f"{v['negative_mean']:+.3g} on negative ones (sum of A x change {v['advantage_weighted']:+.3g})")
            if v["positive_mean"] > v["negative_mean"] and v["advantage_weighted"] > 0:
                return Verdict.PASS, what, v["advantage_weighted"]
            return Verdict.FAIL, what + ": the step trains toward the low-reward completions", v["advantage_weighted"]

        return [Condition("OBJ832", "step_follows_advantage", judge)]
