"""OBJ835: a completion truncated to nothing, ratios far outside the clip, float16 logits: finite.
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


class Stress(PolicyCheck):
    """A completion truncated to nothing, ratios far outside the clip, float16 logits: finite, or a clear error."""

    name = "policy-stress"

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        s = session(ctx)
        b = s.batches[0]
        point = s.rollout_inputs(b)  # the rollouts' stored old log-probs where they carry them
        logits, old, ref = point["logits"], point["old"], point["ref"]
        cases = {}

        def run(name, fn):
            try:
                out = fn()
                cases[name] = {"loss": out["loss"], "finite": bool(math.isfinite(out["loss"])
                                                                   and np.all(np.isfinite(out["dlogits"])))}
            except Exception as exc:  # noqa: BLE001  (a clear error is an accepted outcome)
                cases[name] = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"}

        def empty():
            ids, mask = b.ids.copy(), b.mask.copy()
            ids[0][mask[0]] = ctx.config.data.pad_id  # row 0's completion truncated to nothing
            mask[0] = False
            return s.evaluate(b, logits, b.advantages, np.where(mask, old, 0.0), np.where(mask, ref, 0.0),
                              mask=mask, ids=ids)

        def far():  # set ratios, whatever the rollouts stored: far outside any clip by design
            ratio = np.where(np.arange(b.ids.size).reshape(b.ids.shape) % 2 == 0, 1e-6, 1e6)
            return s.point(b, logits, ratio=ratio, delta=5.0)

        def half():
            return s.evaluate(b, logits.astype(np.float16), b.advantages, old, ref)

        run("a completion truncated to nothing", empty)
        run("ratios 1e-6 / 1e6, reference 5 nats off", far)
        run("float16 logits", half)
        return {"cases": cases, "old_logps": point["source"]}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        def judge(v):
            bad = [k for k, c in v["cases"].items() if "error" not in c and not c["finite"]]
            shown = "; ".join(f"{k}: " + (f"raises {c['error']}" if "error" in c else
                                          f"loss {c['loss']:.4g}" + ("" if c["finite"] else " (NaN/inf in loss or gradient)"))
                              for k, c in v["cases"].items())
            shown += f" (old log-probs: {v['old_logps']})"
            if bad:
                return Verdict.FAIL, f"non-finite results: {shown}", float(len(bad))
            return Verdict.PASS, f"finite or a clear error: {shown}", 0.0

        return [Condition("OBJ835", "finite_under_stress", judge)]
