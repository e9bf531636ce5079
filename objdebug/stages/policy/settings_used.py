"""OBJ831: every numeric setting (beta, epsilon, ...) changes the loss.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.core.findings import Condition, Verdict, listing
from objdebug.core.settings import Settings
from objdebug.pipeline.context import Context
from objdebug.stages.policy._common import SETTING_RATIOS, _base
from objdebug.stages.policy.base import PolicyCheck
from objdebug.stages.policy.session import session


class Settings_(PolicyCheck):
    """Every numeric setting (beta, epsilon, ...) changes the loss at a point where it matters."""

    name = "policy-settings"

    def skip_reason(self, ctx: Context) -> str | None:
        reason = super().skip_reason(ctx)
        if reason is None and ctx.config.policy_objective.call == "policy-model":
            return ("not judged in the \"policy-model\" form: each variant would own the model and "
                    "compile a graph that holds it (the split form checks the settings)")
        return reason

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        s = session(ctx)
        b = s.batches[0]
        logits = _base(s, b)["logits"]
        # ratios either side of any usual clip range, and far above it (8: where a dual clip's
        # bound for negative advantages, verl's clip_ratio_c / OpenRLHF's dual_clip, acts)
        ratio = np.array(SETTING_RATIOS)[np.arange(b.ids.size).reshape(b.ids.shape) % len(SETTING_RATIOS)]
        lp = s.logps(b, logits)
        loss, changed = s.variants(b, logits, b.advantages, np.where(b.mask, lp - np.log(ratio), 0.0),
                                   np.where(b.mask, lp - 0.5, 0.0))
        rows = []
        for k, key in enumerate(s.cache["variant_keys"]):
            old, new, _ = s.changed_kwargs(key)
            rows.append({"setting": key, "value": old, "changed_to": new, "loss": loss,
                         "loss_changed": float(changed[k])})
        errors = {k: f"{type(e).__name__}: {e}" for k, e in s.cache.get("variant_errors", {}).items()}
        return {"settings": rows, "errors": errors, "loss": loss}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        rtol = float(th["setting_rtol"])

        def judge(v):
            if not v["settings"] and not v["errors"]:
                return Verdict.SKIP, "not judged: the objective declares no numeric setting in kwargs", None
            dead = [r for r in v["settings"]
                    if not abs(r["loss_changed"] - r["loss"]) > rtol * max(abs(r["loss"]), 1e-12)]
            shown = ", ".join(f"{r['setting']} {r['value']:g} -> {r['changed_to']:g}: loss {r['loss']:.6g} -> "
                              f"{r['loss_changed']:.6g}" for r in v["settings"])
            if v["errors"]:
                k, e = next(iter(v["errors"].items()))
                return Verdict.FAIL, f"the objective cannot be rebuilt with {k} changed: {e}", None
            if dead:
                return Verdict.FAIL, (f"setting(s) {listing([r['setting'] for r in dead])} change nothing "
                                      f"(at the reference 0.5 nats off, ratios {' / '.join(f'{x:g}' for x in SETTING_RATIOS)}): {shown}"), float(len(dead))
            return Verdict.PASS, f"every numeric setting changes the loss ({shown})", 0.0

        return [Condition("OBJ831", "settings_are_read", judge)]
