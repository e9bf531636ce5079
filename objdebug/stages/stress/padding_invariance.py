"""Padding invariance: one sample with 0, 10 and 500 extra padding tokens, loss and gradients.

The sample is `short_length - 10` tokens of real text, so "+10" shares the batch-1 graph of the
other short cases. Padding sits at the end, labelled `label_pad_id`; any change of the loss or
the gradients with the amount of padding proves that the objective (or the model) sees it.
Padding sits on `[data] padding_side`.

A model that takes an attention mask (`[model] inputs`) is held to the mask's promise too: the
sample left-padded with +10 / +500 tokens, once with pad_id and once with other tokens under the
same mask (0): a model that honours its mask cannot tell them apart. Same length, same positions,
so a model that counts positions itself is not blamed for it; right padding could not show this
on a causal model (padding after a token never reaches it), hence the left side.
A model that names no position limit and fails with a shape or index error at an extra after a
shorter one ran: that extra is not run, the finding names the error, and the longest length that
ran is the run's limit from then on (engine/position_limit.py). Code OBJ504.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.pipeline.context import Context
from objdebug.engine.model_inputs import fill_padding, takes_mask
from objdebug.core.findings import Check, Condition, Verdict
from objdebug.core.settings import Settings
import objdebug.stages.stress.task_cases as task_cases
from objdebug.stages.stress._common import (flat_grads, loss_and_grad, packed, rel_diff,
    short_length, text_sample, token_stream)
from objdebug.engine import position_limit


class PaddingInvariance(Check):
    name = "padding-invariance"
    stage = "stress"
    kinds = task_cases.ALL

    def skip_reason(self, ctx: Context) -> str | None:
        return task_cases.no_rows(ctx)

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        if task_cases.is_task(ctx):  # the kind's rows padded further, same measurement
            return task_cases.padding_invariance(ctx, th)
        base = max(position_limit.cap(short_length(th), ctx) - 10, 2)
        asked = [int(e) for e in th["pad_extra"]]
        # padding never goes past the model's position limit: an extra that would is cut to fit
        extras = [0] + sorted({position_limit.cap(base + e, ctx) - base for e in asked} - {0})
        capped = {e: position_limit.cap(base + e, ctx) - base for e in asked
                  if position_limit.cap(base + e, ctx) != base + e}
        sample = text_sample(ctx, base, "pad")
        rows, ref_loss, ref_grad = [], None, None
        not_run: dict[str, str] = {}
        for extra in extras:
            if not_run:  # a shorter extra failed past the model's unnamed limit: longer ones cannot run
                not_run[str(extra)] = "beyond the longest length that ran"
                continue
            ids, labels = packed(ctx, [sample], base + extra)
            try:
                out = loss_and_grad(ctx, ids, labels)
            except Exception as exc:
                why = position_limit.learnable(exc, ctx) if rows else None
                if why is None:
                    raise
                longest = max(r["length"] for r in rows)
                position_limit.learned(ctx, longest, base + extra, why)  # the limit for the rest of the run
                not_run[str(extra)] = (f"T={base + extra} fails with a shape error after T={longest} "
                                       f"ran: {why}")
                continue
            g = flat_grads(out["grads"])
            if ref_grad is None:
                ref_loss, ref_grad = out["loss"], g
            gdiff = float(np.linalg.norm(g - ref_grad) / max(np.linalg.norm(ref_grad), 1e-30)) \
                if np.all(np.isfinite(g)) and np.all(np.isfinite(ref_grad)) else float("nan")
            rows.append({"extra_pad": extra, "length": base + extra, "loss": out["loss"],
                         "grad_norm": out["grad_norm"], "loss_rel_diff": rel_diff(out["loss"], ref_loss),
                         "grad_rel_diff": gdiff})
        # np.max, not max(): a NaN at +500 must not hide behind a finite +10 row
        out = {"tokens": base, "rows": rows, **({"not_run": not_run} if not_run else {}),
               **({"capped": {str(e): c for e, c in capped.items()},
                   "limit": position_limit.limit(ctx), "limit_source": position_limit.source(ctx)}
                  if capped else {}),
               "max_loss_rel_diff": float(np.max([r["loss_rel_diff"] for r in rows])),
               "max_grad_rel_diff": float(np.max([r["grad_rel_diff"] for r in rows]))}
        masked = [e for e in extras if e > 0 and str(e) not in not_run]
        if takes_mask(ctx.config) and masked:
            out["mask_rows"] = [self._masked_content(ctx, sample, base + e) for e in masked]
            for key in ("loss_rel_diff", "grad_rel_diff"):
                out[f"max_mask_{key}"] = float(np.max([r[key] for r in out["mask_rows"]]))
        return out

    @staticmethod
    def _masked_content(ctx: Context, sample, length: int) -> dict[str, Any]:
        """Left-padded to `length`: pad_id vs other tokens under the same mask (0)."""
        ids, labels = packed(ctx, [sample], length, side="left")
        ref = loss_and_grad(ctx, ids, labels)
        other = np.asarray(token_stream(ctx, 2 * length)[length:][::-1], np.int64).reshape(ids.shape)
        out = loss_and_grad(ctx, fill_padding(ids, other), labels)
        g, ref_g = flat_grads(out["grads"]), flat_grads(ref["grads"])
        gdiff = float(np.linalg.norm(g - ref_g) / max(np.linalg.norm(ref_g), 1e-30)) \
            if np.all(np.isfinite(g)) and np.all(np.isfinite(ref_g)) else float("nan")
        return {"extra_pad": length - sample.length, "length": length, "side": "left",
                "loss": out["loss"], "loss_pad_id": ref["loss"],
                "loss_rel_diff": rel_diff(out["loss"], ref["loss"]), "grad_rel_diff": gdiff}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        ltol, gtol = float(th["pad_loss_rtol"]), float(th["pad_grad_rtol"])

        def judge(v):
            shown = "; ".join(f"+{r['extra_pad']}: loss {r['loss']:.6g} (rel {r['loss_rel_diff']:.2g}),"
                              f" grad rel {r['grad_rel_diff']:.2g}" for r in v["rows"][1:])
            lx, gx = v["max_loss_rel_diff"], v["max_grad_rel_diff"]
            msg = (f"{v['tokens']} tokens, padding +0: loss {v['rows'][0]['loss']:.6g}; {shown}; "
                   f"tolerance loss {ltol:g}, gradients {gtol:g} (relative)")
            if v.get("capped"):  # the profile's extra padding cut to the model's position limit
                msg += "; " + ", ".join(f"+{e} cut to +{c}" for e, c in v["capped"].items()) + (
                    f" to stay within the model's {v['limit']} positions ({v['limit_source']})")
            if v.get("not_run"):  # a model that names no position limit: found here (position_limit.py)
                msg += "; " + "; ".join(f"+{e} not run: {why}" for e, why in v["not_run"].items()) + (
                    v.get("not_run_note") or  # a [task] kind's objective (task_cases.py)
                    "; the model names no position limit, so the longest length that ran is taken as it "
                    "(set data.max_length to say it)")
            mask_ok = True
            if "mask_rows" in v:  # the model takes an attention mask: padding content under it
                mx, mg = v["max_mask_loss_rel_diff"], v["max_mask_grad_rel_diff"]
                msg += ("; other tokens under the mask (left): " + ", ".join(
                    f"+{r['extra_pad']}: loss {r['loss']:.6g} vs {r['loss_pad_id']:.6g} (rel "
                    f"{r['loss_rel_diff']:.2g}), grad rel {r['grad_rel_diff']:.2g}" for r in v["mask_rows"]))
                lx, gx = float(np.max([lx, mx])), float(np.max([gx, mg]))
                mask_ok = mx <= ltol and mg <= gtol
            if math.isnan(lx) or math.isnan(gx):
                return Verdict.FAIL, msg + "; non-finite loss or gradients", lx
            if lx <= ltol and gx <= gtol:
                return Verdict.PASS, msg, lx
            if not mask_ok:
                return Verdict.FAIL, msg + "; the model ignores its attention mask (tokens marked 0 " \
                                           "change the loss)", lx
            return Verdict.FAIL, msg + "; the objective or the model sees padding", lx

        return [Condition("OBJ504", f"padding_changes_nothing_rtol_{ltol:g}", judge)]
