"""The objective alone on the model's logits: scaled to large magnitudes (OBJ508) and in low
precision (OBJ509), each compared with float32 at the same scale.

Logits come from the real model on real text; the objective is then called directly with
logits * scale as float32, float16 and bfloat16 Tensors. A log-softmax without max subtraction
overflows exp() (float16 at logits > 11), MindSpore 2.10's nn.CrossEntropyLoss returns NaN in
float16 for vocabularies of 8000 and more. A scale whose logits float16 cannot hold (> 65504) is
not tried in float16: the overflow would be the cast's, not the objective's. Needs the split form
(a model that returns logits): the end-to-end form is skipped.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.context import Context
from objdebug.engine.datasets import text_samples
from objdebug.findings import Check, Condition, Verdict
from objdebug.settings import Settings
from objdebug.stages.stress_cases._common import (OBJECTIVE_ON_LOGITS, error_line, objective_on_logits,
                                                  packed, rel_diff)

_FP16_MAX = 65504.0
_END_TO_END = ("the end-to-end form (no [model]) does not expose logits, so the objective cannot "
               "be fed scaled or low-precision logits")


def logits_batch(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    """The model's float32 logits [batch_size, T, V] on real samples, and their labels."""
    def build():
        rows = text_samples(ctx, ctx.engine.batch_size)
        rows = rows + [rows[0]] * (ctx.engine.batch_size - len(rows))  # fill with copies
        ids, labels = packed(ctx, rows, ctx.engine.bucket(max(s.length for s in rows)))
        return ctx.engine.logits(ids).astype(np.float32), labels
    return ctx.provide(logits_batch, build)


def reference_ce(logits: np.ndarray, labels: np.ndarray, ignore: int) -> float:
    """Reference (not a verdict): masked mean cross-entropy in float64."""
    x = logits.astype(np.float64).reshape(-1, logits.shape[-1])
    y = labels.reshape(-1)
    keep = y != ignore
    x = x - x.max(-1, keepdims=True)
    logp = x - np.log(np.exp(x).sum(-1, keepdims=True))
    nll = -logp[np.arange(len(y)), np.where(keep, y, 0)]
    return float(nll[keep].mean()) if keep.any() else 0.0


def _scales(th: dict[str, Any]) -> list[float]:
    return [1.0] + [float(s) for s in th["logit_scales"] if float(s) != 1.0]


def _fp32_losses(ctx: Context, th: dict[str, Any]) -> dict[str, Any]:
    import mindspore as ms

    def build():
        logits, labels = logits_batch(ctx)
        out = {}
        for s in _scales(th):
            scaled = logits * np.float32(s)
            out[s] = {"scale": s, "max_abs_logit": float(np.abs(scaled).max()),
                      "loss": objective_on_logits(ctx, ms.Tensor(scaled, ms.float32), labels,
                                                  name=f"{OBJECTIVE_ON_LOGITS}.float32"),
                      "reference_ce": reference_ce(scaled, labels, ctx.config.data.label_pad_id)}
        return out
    return ctx.provide(_fp32_losses, build)


class ExtremeLogits(Check):
    name = "extreme-logits"
    stage = "stress"

    def skip_reason(self, ctx: Context) -> str | None:
        return _END_TO_END if ctx.target.end_to_end else None

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        logits, _ = logits_batch(ctx)
        rows = list(_fp32_losses(ctx, th).values())
        return {"shape": list(logits.shape), "rows": rows}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        def judge(v):
            shown = "; ".join(f"x{r['scale']:g} (max |logit| {r['max_abs_logit']:.3g}): loss "
                              f"{r['loss']:.5g} (reference CE {r['reference_ce']:.5g})" for r in v["rows"])
            bad = [r for r in v["rows"] if not math.isfinite(r["loss"])]
            msg = f"objective on float32 logits {v['shape']}: {shown}"
            if bad:
                return Verdict.FAIL, msg + f"; NaN/Inf from x{bad[0]['scale']:g} on: the loss overflows", \
                    float(bad[0]["scale"])
            return Verdict.PASS, msg + "; all finite", float(v["rows"][-1]["scale"])

        return [Condition("OBJ508", "scaled_logits_finite", judge)]


class LowPrecision(Check):
    name = "low-precision"
    stage = "stress"

    def skip_reason(self, ctx: Context) -> str | None:
        return _END_TO_END if ctx.target.end_to_end else None

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        import mindspore as ms

        logits, labels = logits_batch(ctx)
        fp32 = _fp32_losses(ctx, th)
        out: dict[str, Any] = {}
        for name in th["low_precision_dtypes"]:
            dtype = getattr(ms, name, None)
            if dtype is None:
                out[name] = {"skipped": f"mindspore has no dtype '{name}'"}
                continue
            rows = []
            for s, ref in fp32.items():
                if name == "float16" and ref["max_abs_logit"] > _FP16_MAX:
                    rows.append({"scale": s, "skipped": f"max |logit| {ref['max_abs_logit']:.3g} > "
                                 f"float16 max {_FP16_MAX:g}"})
                    continue
                try:
                    x = ms.Tensor(logits * np.float32(s), ms.float32).astype(dtype)
                    # a graph of its own per dtype: one that raised refuses every later call
                    loss = objective_on_logits(ctx, x, labels, name=f"{OBJECTIVE_ON_LOGITS}.{name}")
                except Exception as exc:  # e.g. a kernel without this dtype on this device
                    lines = [ln.strip(" -") for ln in str(exc).splitlines()]
                    why = next((ln for ln in lines if "unsupported" in ln.lower()), error_line(exc))
                    out[name] = {"skipped": f"{name} does not run here: {type(exc).__name__}: {why[:160]}"}
                    break
                rows.append({"scale": s, "loss": loss, "fp32_loss": ref["loss"],
                             "rel_diff": rel_diff(loss, ref["loss"])})
            else:
                out[name] = {"rows": rows}
        return {"shape": list(logits.shape), "dtypes": out}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        rtols = th["low_precision_rtol"]  # default.toml has float16 and bfloat16; a profile adds dtypes

        def judge_dtype(name: str):
            if name not in rtols:  # a dtype the profile added without its tolerance
                from objdebug.errors import InputError

                raise InputError(f"For '[stress.low_precision_rtol] {name}', a tolerance is required for "
                                 f"every dtype in low_precision_dtypes, but got none.")
            tol = float(rtols[name])

            def judge(v):
                r = v["dtypes"].get(name, {"skipped": "not measured"})
                if "skipped" in r:
                    return Verdict.SKIP, f"{name}: {r['skipped']}", None
                ran = [x for x in r["rows"] if "loss" in x]
                parts = [f"x{x['scale']:g}: {x['loss']:.5g} vs {x['fp32_loss']:.5g} (rel {x['rel_diff']:.2g})"
                         if "loss" in x else f"x{x['scale']:g}: skipped ({x['skipped']})" for x in r["rows"]]
                msg = f"objective on {name} logits vs float32: " + "; ".join(parts)
                if not ran:
                    return Verdict.SKIP, msg, None
                worst = max(ran, key=lambda x: x["rel_diff"] if math.isfinite(x["rel_diff"]) else math.inf)
                nonfinite = [x for x in ran if not math.isfinite(x["loss"])]
                if nonfinite:
                    also = all(not math.isfinite(x["fp32_loss"]) for x in nonfinite)
                    return Verdict.FAIL, msg + (f"; NaN/Inf in {name}" + (" (float32 too, see OBJ508)"
                                                if also else " where float32 is finite")), worst["rel_diff"]
                if worst["rel_diff"] > tol:
                    return Verdict.WARN, msg + f"; relative difference above {tol:g}", worst["rel_diff"]
                return Verdict.PASS, msg + f"; within {tol:g}", worst["rel_diff"]
            return judge

        names = th["low_precision_dtypes"]
        return [Condition("OBJ509", f"{n}_matches_float32", judge_dtype(n)) for n in names]
