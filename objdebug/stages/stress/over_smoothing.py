"""Over-smoothing probe: the mean top-5 probability of the model's predictions at scored positions
of real samples (OBJ512). The source procedure warns below 0.3: heavy label smoothing (or an
objective that flattens the distribution) leaves no token a clear winner and lets filler win.
This measures the MODEL: it tells about the objective only through a checkpoint trained with it,
and an untrained model always sits near 5/V.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.pipeline.context import Context
from objdebug.pipeline.datasets import text_samples
from objdebug.core.findings import Check, Condition, Verdict
from objdebug.core.settings import Settings
from objdebug.pipeline.run_data import logit_checks_skip, logits_of_rows


def _flat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0)


def _mean(x: np.ndarray) -> float:
    return float(x.mean()) if x.size else float("nan")


class OverSmoothing(Check):
    name = "over-smoothing"
    stage = "stress"
    needs_trained = ("OBJ512",)  # an untrained model is flat by nature: a note, not a warning

    def skip_reason(self, ctx: Context) -> str | None:
        # a library model as the end-to-end target: the logits of its probed output head
        return logit_checks_skip(ctx)

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        k = int(th["top_k"])
        samples = text_samples(ctx, int(th["smoothing_samples"]))
        pad = ctx.config.data.label_pad_id
        topk, top1, entropy = [], [], []
        for x, labels in logits_of_rows(ctx, samples):
            x = x[labels != pad]
            x -= x.max(-1, keepdims=True)
            p = np.exp(x)
            p /= p.sum(-1, keepdims=True)
            ps = np.sort(p, axis=-1)[:, ::-1]
            topk.append(ps[:, :k].sum(-1))
            top1.append(ps[:, 0])
            entropy.append(-(p * np.log(np.maximum(p, 1e-300))).sum(-1))
        topk_all = _flat(topk)
        vocab = ctx.engine.vocab_size()
        return {"k": k, "positions": int(topk_all.size), "samples": len(samples), "vocab": vocab,
                "mean_topk": _mean(topk_all), "mean_top1": _mean(_flat(top1)),
                "mean_entropy": _mean(_flat(entropy)), "uniform_topk": k / vocab}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        low = float(th["top5_min"])

        def judge(v):
            if not v["positions"]:  # a mean over nothing is NaN, and NaN < low is False: not a PASS
                return Verdict.SKIP, (f"no scored positions in {v['samples']} samples (every label "
                                      f"is label_pad_id): the top-{v['k']} probability is not measured"), None
            x = v["mean_topk"]
            msg = (f"mean top-{v['k']} probability {x:.3f} (top-1 {v['mean_top1']:.3f}, entropy "
                   f"{v['mean_entropy']:.3f} nats; uniform would be {v['uniform_topk']:.3f}) over "
                   f"{v['positions']} scored positions of {v['samples']} samples; warn below {low:g}")
            if x < low:
                return Verdict.WARN, msg + ": the predicted distribution is flat", x
            return Verdict.PASS, msg, x

        return [Condition("OBJ512", f"top5_probability_not_less_than_{low:g}", judge)]
