"""The objective alone on the model's logits: scaled to large magnitudes (OBJ508) and in low
precision (OBJ509), each compared with float32 at the same scale.

Logits come from the real model on real text; the objective is then called directly with
logits * scale as float32, float16 and bfloat16 Tensors. A log-softmax without max subtraction
overflows exp() (float16 at logits > 11), MindSpore 2.10's nn.CrossEntropyLoss returns NaN in
float16 for vocabularies of 8000 and more. A scale whose logits float16 cannot hold (> 65504) is
not tried in float16: the overflow would be the cast's, not the objective's. A library model as
the end-to-end target runs its own loss on its own batch, its output head's logits replaced by the
scaled ones and handed on in the dtype (engine/library_logits.py); another end-to-end Cell is skipped.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.pipeline.context import Context
from objdebug.engine.data import filled_rows
from objdebug.pipeline.datasets import text_samples
from objdebug.pipeline.run_data import grad_probe, library_logits, logit_checks_skip
from objdebug.core.findings import Check, Condition, Verdict
from objdebug.core.settings import Settings
import objdebug.stages.stress.task_cases as task_cases
from objdebug.stages.stress._common import (OBJECTIVE_ON_LOGITS, error_line, objective_on_logits,
    packed, rel_diff)

_FP16_MAX = 65504.0


def _batch(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    """batch_size real rows (filled with copies) at their length bucket: ids and labels."""
    def build():
        rows = text_samples(ctx, ctx.engine.batch_size)
        return packed(ctx, filled_rows(rows, ctx.engine.batch_size),
                      ctx.engine.bucket(max(s.length for s in rows)))
    return ctx.provide(_batch, build)


def logits_batch(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    """The model's float32 logits [batch_size, T, V] on real samples, and their labels (a library
    model as the end-to-end target: its output head's logits and the labels they are scored
    against, engine/library_logits.py)."""
    def build():
        ids, labels = _batch(ctx)
        if ctx.target.end_to_end:
            out = library_logits(ctx).run(ids, labels)
            return out["logits"], out["labels"]
        return ctx.engine.logits(ids).astype(np.float32), labels
    return ctx.provide(logits_batch, build)


def loss_on(ctx: Context, scaled: np.ndarray, labels: np.ndarray, dtype: str) -> float:
    """The objective alone on `scaled` logits in `dtype`; the end-to-end form: the library's own
    loss on its batch with its head's output replaced by them, handed on in `dtype`."""
    import mindspore as ms

    if ctx.target.end_to_end:
        ids, input_labels = _batch(ctx)
        seen, _ = logits_batch(ctx)
        out = library_logits(ctx).run(ids, input_labels, delta=scaled - seen,
                                      dtype=None if dtype == "float32" else dtype)
        return float(out["outputs"][0])
    if dtype == "float32":
        # the grad stage's objective-on-logits graph (`objective.logit_grad`, the same [B, T, V]
        # batch shape where the data allows): its first output is the loss
        outputs, _, _ = grad_probe(ctx).logits(scaled, labels)
        return float(outputs[0])
    x = ms.Tensor(scaled, ms.float32)
    if dtype != "float32":
        x = x.astype(getattr(ms, dtype))
    # a graph of its own per dtype: one that raised refuses every later call
    return objective_on_logits(ctx, x, labels, name=f"{OBJECTIVE_ON_LOGITS}.{dtype}")


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
    def build():
        logits, labels = logits_batch(ctx)
        out = {}
        for s in _scales(th):
            scaled = logits * np.float32(s)
            out[s] = {"scale": s, "max_abs_logit": float(np.abs(scaled).max()),
                      "loss": loss_on(ctx, scaled, labels, "float32"),
                      "reference_ce": reference_ce(scaled, labels, ctx.config.data.label_pad_id)}
        return out
    return ctx.provide(_fp32_losses, build)


class ExtremeLogits(Check):
    name = "extreme-logits"
    stage = "stress"
    kinds = task_cases.ALL

    def skip_reason(self, ctx: Context) -> str | None:
        return task_cases.no_rows(ctx) if task_cases.is_task(ctx) else logit_checks_skip(ctx)

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        if task_cases.is_task(ctx):  # the kind's outputs (logits, emissions, embeddings) scaled
            return {"shape": task_cases.shape(ctx), "rows": list(task_cases.scaled_losses(ctx, _scales(th)).values())}
        logits, _ = logits_batch(ctx)
        rows = list(_fp32_losses(ctx, th).values())
        return {"shape": list(logits.shape), "rows": rows}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        def judge(v):
            shown = "; ".join(f"x{r['scale']:g} (max |logit| {r['max_abs_logit']:.3g}): loss "
                              f"{r['loss']:.5g}" + (f" (reference CE {r['reference_ce']:.5g})"
                                                    if "reference_ce" in r else "") for r in v["rows"])
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
    kinds = task_cases.ALL

    def skip_reason(self, ctx: Context) -> str | None:
        return task_cases.no_rows(ctx) if task_cases.is_task(ctx) else logit_checks_skip(ctx)

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        import mindspore as ms

        if task_cases.is_task(ctx):  # the kind's outputs (one per text for embeddings) in each dtype
            outputs, labels = task_cases.outputs_batch(ctx)
            logits, fp32 = outputs[0], task_cases.scaled_losses(ctx, _scales(th))

            def measured(s, name):
                return task_cases.loss_on(ctx, [o * np.float32(s) for o in outputs], labels, name)
        else:
            logits, labels = logits_batch(ctx)
            fp32 = _fp32_losses(ctx, th)

            def measured(s, name):
                return loss_on(ctx, logits * np.float32(s), labels, name)
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
                    loss = measured(s, name)
                except Exception as exc:  # e.g. a kernel without this dtype on this device
                    lines = [ln.strip(" -") for ln in str(exc).splitlines()]
                    why = next((ln for ln in lines if "unsupported" in ln.lower()), error_line(exc))
                    out[name] = {"skipped": f"{name} does not run here: {type(exc).__name__}: {why[:160]}"}
                    break
                rows.append({"scale": s, "loss": loss, "fp32_loss": ref["loss"],
                             "rel_diff": rel_diff(loss, ref["loss"])})
            else:
                out[name] = {"rows": rows}
        run = ctx.config.run  # the precision the model is trained at: the others are forecasts
        trained = run.amp_dtype if run.amp_level != "O0" else "float32"
        return {"shape": list(logits.shape), "dtypes": out, "amp_level": run.amp_level,
                "trained_dtype": trained}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        rtols = th["low_precision_rtol"]  # default.toml has float16 and bfloat16; a profile adds dtypes
        forecast = Verdict.from_setting(th["low_precision_forecast"], "[stress] low_precision_forecast")

        def as_forecast(name: str, judged):
            """A WARN/FAIL at a dtype the model is not trained at: the profile's forecast verdict,
            the message saying what would happen at O2/O3."""
            def judge(v):
                verdict, msg, key = judged(v)
                trained = v.get("trained_dtype", name)
                if verdict in (Verdict.WARN, Verdict.FAIL) and trained != name and forecast is not verdict:
                    level = v.get("amp_level", "O0")
                    msg += (f"; a forecast: the model is trained in {trained} ([run] amp_level "
                            f"{level!r}), so this is what amp_level O2/O3 with amp_dtype {name!r} would "
                            f"do, not what this training does")
                    return forecast if forecast.rank < verdict.rank else verdict, msg, key
                return verdict, msg, key
            return judge

        def judge_dtype(name: str):
            if name not in rtols:  # a dtype the profile added without its tolerance
                from objdebug.core.errors import InputError

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
        return [Condition("OBJ509", f"{n}_matches_float32", as_forecast(n, judge_dtype(n))) for n in names]


# --------------------------------------------------------------------------- trained precision
# [run] amp_level / amp_objective / loss_scale (objdebug/engine/precision.py): the target as
# trained against a float32 twin of itself (same factories and checkpoint, amp_level "O0").
_AMP_FORWARD = "precision.forward.trained"
_FP32_FORWARD = "precision.forward.float32"
_AMP_GRAD = "precision.grad.trained"
_FP32_GRAD = "precision.grad.float32"


def _float32_target(ctx: Context):
    from objdebug.engine.target import float32_twin

    return ctx.provide(_float32_target, lambda: float32_twin(ctx.target))


def _precision_batch(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    """batch_size real rows (filled with copies), packed at their length bucket: the rows of
    `logits_batch` (OBJ508/OBJ509), so the model's logits come from the same graph."""
    def build():
        rows = text_samples(ctx, ctx.engine.batch_size)
        return packed(ctx, filled_rows(rows, ctx.engine.batch_size),
                      ctx.engine.bucket(max(s.length for s in rows)))
    return ctx.provide(_precision_batch, build)


def _forward(ctx: Context, target, name: str, ids: np.ndarray, labels: np.ndarray) -> float:
    import mindspore as ms

    from objdebug.engine.cells import BatchObjective

    cell = ctx.engine.cell(name, lambda: BatchObjective(target))
    total, _ = ctx.engine.call(name, cell, ms.Tensor(ids, ms.int32), ms.Tensor(labels, ms.int32))
    return float(total.asnumpy())


def _locate(ctx: Context, ids: np.ndarray, labels: np.ndarray, logits_finite: bool) -> dict[str, Any] | None:
    """The first non-finite intermediate of the user's code at the trained precision (PyNative
    replay): in the model when its logits are not finite, else in the objective on those logits."""
    import mindspore as ms

    from objdebug.engine import precision
    from objdebug.engine.cells import call_on_logits

    target = ctx.target
    x, y = ms.Tensor(ids, ms.int32), ms.Tensor(labels, ms.int32)
    if target.model is None:
        return precision.first_nonfinite(target.objective, x, y)
    if not logits_finite:
        return precision.first_nonfinite(target.model, x)
    logits = target.model(x)
    flat = ctx.config.objective.call == "flat"
    return precision.first_nonfinite(lambda: call_on_logits(target.objective, flat, logits, y))


class TrainedPrecision(Check):
    """OBJ514: the objective at the trained precision ([run] amp_level) vs float32."""

    name = "trained-precision"
    stage = "stress"

    def skip_reason(self, ctx: Context) -> str | None:
        from objdebug.engine import precision

        if not precision.enabled(ctx.config):
            return ("run.amp_level is 'O0': the target runs in float32; set [run] amp_level (and "
                    "amp_objective) as the model is trained to compare that precision with float32")
        return None

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        from objdebug.engine import precision

        ids, labels = _precision_batch(ctx)
        fp32 = _float32_target(ctx)
        out: dict[str, Any] = {"precision": precision.label(ctx.config), "shape": list(ids.shape),
                               "objective_converted": precision.describe(ctx.config)["objective_converted"],
                               "loss": _forward(ctx, ctx.target, _AMP_FORWARD, ids, labels),
                               "fp32_loss": _forward(ctx, fp32, _FP32_FORWARD, ids, labels)}
        out["rel_diff"] = rel_diff(out["loss"], out["fp32_loss"])
        logits_finite = True
        if ctx.target.model is not None:  # the rows of OBJ508's batch: the model.forward graph is shared
            logits = logits_batch(ctx)[0]
            finite = np.isfinite(logits)
            logits_finite = bool(finite.all())
            out["logits"] = {"nonfinite": int((~finite).sum()),
                             "max_abs": float(np.abs(logits[finite]).max()) if finite.any() else None}
        if not math.isfinite(out["loss"]):
            out["first_nonfinite"] = _locate(ctx, ids, labels, logits_finite)
            out["where"] = "model" if not logits_finite else "objective"
        return out

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        from objdebug.engine.precision import where_text

        tol = float(th["amp_loss_rtol"])
        atol = float(th["amp_loss_atol"])

        def judge(v):
            lg = v.get("logits")
            logits = ((f"; logits {lg['nonfinite']} non-finite" if lg["nonfinite"] else
                       f"; logits finite, max |x| {lg['max_abs']:.3g}")) if lg else ""
            msg = (f"loss at {v['precision']} {v['loss']:.6g} vs float32 {v['fp32_loss']:.6g} "
                   f"(rel {v['rel_diff']:.2g}) on {v['shape']}{logits}")
            if not math.isfinite(v["loss"]):
                path = ("the model's forward overflows at this precision" if v.get("where") == "model"
                        else "the logits are finite: the overflow is in the objective's path")
                also = " (float32 too)" if not math.isfinite(v["fp32_loss"]) else " where float32 is finite"
                return Verdict.FAIL, (f"{msg}: NaN/Inf at {v['precision']}{also}; {path}; "
                                      f"{where_text(v.get('first_nonfinite'))}"), v["rel_diff"]
            # both: a near-zero loss (memorized rows) has a large relative but no real difference
            if v["rel_diff"] > tol and abs(v["loss"] - v["fp32_loss"]) > atol:
                return Verdict.WARN, msg + f"; above rel {tol:g} and abs {atol:g}", v["rel_diff"]
            return Verdict.PASS, msg + f"; within rel {tol:g} or abs {atol:g}", v["rel_diff"]

        return [Condition("OBJ514", "trained_precision_matches_float32", judge)]


def _build_scaled_grad(target, scale: float):
    import mindspore as ms
    from mindspore import nn, ops

    from objdebug.engine.cells import BatchObjective

    class ScaledLossAndGrad(nn.Cell):
        """Gradients of scale * loss (a training step's static loss scale), in the graph."""

        def __init__(self):
            super().__init__(auto_prefix=False)  # keep the user's parameter names
            self.params = ms.ParameterTuple(target.trainable_params())
            self.inner = BatchObjective(target)
            self.scale = scale
            self.grad_fn = ms.value_and_grad(self.scaled, None, self.params)

        def scaled(self, input_ids, labels):
            total, _ = self.inner(input_ids, labels)
            return total * self.scale

        def construct(self, input_ids, labels):
            loss, grads = self.grad_fn(input_ids, labels)
            out = []
            for g in grads:  # a plain loop: graph mode's support for generator expressions varies
                out.append(ops.cast(g, ms.float32))
            return loss, tuple(out)

    return ScaledLossAndGrad()


def _grads(ctx: Context, target, name: str, scale: float, ids, labels) -> tuple[float, dict[str, np.ndarray]]:
    import mindspore as ms

    cell = ctx.engine.cell(name, lambda: _build_scaled_grad(target, scale))
    loss, grads = ctx.engine.call(name, cell, ms.Tensor(ids, ms.int32), ms.Tensor(labels, ms.int32))
    names = [p.name for p in cell.params]
    return float(loss.asnumpy()), {n: g.asnumpy().astype(np.float64) for n, g in zip(names, grads)}


class LossScaleGradient(Check):
    """OBJ515: gradients of loss_scale * loss at the trained precision, unscaled, vs float32."""

    name = "loss-scale-gradient"
    stage = "stress"

    def skip_reason(self, ctx: Context) -> str | None:
        from objdebug.engine import precision

        if not precision.enabled(ctx.config) and ctx.config.run.loss_scale is None:
            return ("run.amp_level is 'O0' and no run.loss_scale: the gradients are float32, as "
                    "the grad stage measures them")
        return None

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        from objdebug.engine import precision

        scale = ctx.config.run.loss_scale or 1.0
        ids, labels = _precision_batch(ctx)
        loss, scaled = _grads(ctx, ctx.target, _AMP_GRAD, scale, ids, labels)
        fp32_loss, ref = _grads(ctx, _float32_target(ctx), _FP32_GRAD, 1.0, ids, labels)
        common = [n for n in ref if n in scaled]
        g = np.concatenate([scaled[n].ravel() for n in common]) / scale
        r = np.concatenate([ref[n].ravel() for n in common])
        finite = np.isfinite(g)
        bad_params = [n for n in common if not np.isfinite(scaled[n]).all()]
        out = {"precision": precision.label(ctx.config), "loss_scale": scale, "scaled_loss": loss,
               "fp32_loss": fp32_loss, "n_params": len(common), "nonfinite_params": len(bad_params),
               "first_nonfinite_param": bad_params[0] if bad_params else None,
               "nonfinite_elements": int((~finite).sum()),
               "fp32_finite": bool(np.isfinite(r).all()), "grad_norm": float(np.linalg.norm(r)),
               # elements float32 sees but the trained precision flushed to zero (loss scale too small)
               "underflow_fraction": float(((g == 0) & (r != 0)).sum() / max(int((r != 0).sum()), 1))}
        if finite.all():
            out["rel_diff"] = float(np.linalg.norm(g - r) / max(np.linalg.norm(r), 1e-30))
            out["cosine"] = float(g @ r / max(np.linalg.norm(g) * np.linalg.norm(r), 1e-30))
        return out

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        tol = float(th["amp_grad_rtol"])

        def judge(v):
            head = (f"gradient of {v['loss_scale']:g} x loss at {v['precision']} (scaled loss "
                    f"{v['scaled_loss']:.6g}), unscaled, vs float32 (loss {v['fp32_loss']:.6g}, |g| "
                    f"{v['grad_norm']:.4g})")
            if v["nonfinite_params"]:
                also = "" if v["fp32_finite"] else " (float32 too)"
                why = ("the loss itself is NaN/Inf at this precision (see OBJ514)"
                       if not math.isfinite(v["scaled_loss"]) else "the scaled backward overflows")
                return Verdict.FAIL, (f"{head}: {v['nonfinite_elements']} NaN/Inf elements in "
                                      f"{v['nonfinite_params']} of {v['n_params']} parameters{also}, first "
                                      f"{v['first_nonfinite_param']}: {why}"), None
            msg = (f"{head}: relative L2 difference {v['rel_diff']:.3g}, cosine {v['cosine']:.6f}, "
                   f"{100 * v['underflow_fraction']:.2g}% of elements flushed to 0")
            if v["rel_diff"] > tol:
                return Verdict.WARN, msg + f"; above {tol:g}", v["rel_diff"]
            return Verdict.PASS, msg + f"; within {tol:g}", v["rel_diff"]

        return [Condition("OBJ515", "unscaled_gradient_matches_float32", judge)]
