"""OBJ836: the gradient accumulated over two micro-batches vs the whole batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.core.findings import Condition, Verdict
from objdebug.core.settings import Settings
from objdebug.pipeline.context import Context
from objdebug.stages.policy.base import PolicyCheck
from objdebug.stages.policy.session import session


class MicroBatches(PolicyCheck):
    """The gradient accumulated over two micro-batches of different completion lengths vs the whole batch."""

    name = "policy-micro-batches"

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        from objdebug.stages.policy.session import RolloutBatch

        s = session(ctx)
        b = s.batches[0]
        point = s.rollout_inputs(b)  # the rollouts' stored old log-probs where they carry them
        logits, old, ref = point["logits"], point["old"], point["ref"]
        whole = s.evaluate(b, logits, b.advantages, old, ref)
        order = np.argsort(b.mask.sum(1), kind="stable")  # short rows in one micro-batch, long in the other
        half = len(order) // 2
        acc = np.zeros(whole["dlogits"].shape, np.float64)
        tokens = []
        for part in (order[:half], order[half:]):
            sub = RolloutBatch([], 0, b.ids[part], b.model_ids[part], b.mask[part], b.advantages[part], [])
            out = s.evaluate(sub, logits[part], sub.advantages, old[part], ref[part])
            acc[part] += out["dlogits"].astype(np.float64) / 2.0  # loss / accumulation steps, as a trainer does
            tokens.append(int(sub.mask.sum()))
        w = whole["dlogits"].astype(np.float64)
        err = float(np.linalg.norm(acc - w) / max(np.linalg.norm(w), 1e-30))
        return {"relative_difference": err, "micro_batch_tokens": tokens, "declared": s.policy.aggregation,
                "loss": whole["loss"], "old_logps": point["source"]}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        rtol = float(th["aggregation_rtol"])

        def judge(v):
            e, (t1, t2) = v["relative_difference"], v["micro_batch_tokens"]
            what = (f"gradient accumulated over 2 micro-batches ({t1} and {t2} completion tokens; each loss / 2) "
                    f"vs the whole batch: relative difference {e:.3g} (old log-probs: {v['old_logps']})")
            if e <= rtol:
                return Verdict.PASS, what + ": accumulation gives the whole batch's gradient", e
            declared = v["declared"]
            if declared in ("sequence-mean", "sum") or (declared or "").startswith("constant:"):
                return Verdict.FAIL, (what + f": with '{declared}' declared, accumulation should not change the "
                                      "gradient"), e
            return Verdict.INFO, (what + ": each micro-batch normalises by its own token count (a token mean "
                                  "under accumulation weights tokens of short micro-batches more: normalise by "
                                  "the global token count)"), e

        return [Condition("OBJ836", "micro_batch_accumulation", judge)]
