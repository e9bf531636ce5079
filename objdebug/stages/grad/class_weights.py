"""Grad for `[task] kind = "classification"` / `"tagging"` (issue 47).

- OBJ220 class weights, measured: the objective's own gradient w.r.t. the logits (`task.logit_grad`)
  on a probe of one row per class at logits 0 (every class equally likely, so no row is fitted
  and every row's gradient is large). For a class-weighted cross-entropy, row c's gradient is
  w_c (softmax(0) - onehot(c)) / S (S = the sum of the batch's weights for a weighted mean, 1 for a
  sum): its projection on the standard cross-entropy direction (a numpy float64 reference) reads
  the weight the objective gives class c. The measured weights, normalised, are compared with the
  declared ones (`[task] class_weight`, the objective's kwargs or its Cell's `weight`), class by
  class, as shares of their sum: a scale every class shares (a sum reduction, label smoothing's
  1 - eps, a loss multiplier) is not a weight.
- OBJ221 a row (classification) or a tag position (tagging) labelled `label_pad_id` must receive
  exactly zero gradient, at random logits (a term whose gradient vanishes at logits 0, label
  smoothing's, would hide there): the OBJ105 probe for labels and tags. Only where the kind's batches carry
  that label (engine/kinds.py): a tagger's always, a classifier's when its objective declares an
  ignore_index (a sequence classifier has no ignored rows).
- OBJ201-OBJ204 (gradient-health, the same measurement as the causal LM's): the model's parameter
  gradient on the kind's gradient batch, through `task.logit_grad` and the shared `model.vjp`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.core.findings import Check, Condition, Verdict, listing
from objdebug.core.settings import Settings
from objdebug.engine import kinds
from objdebug.engine.gradients import layer_of, max_mean_ratio
from objdebug.pipeline import task_kind

KINDS = kinds.labelled()  # the kinds whose rows carry a class per row or per token


def _probe(kind: str, c: int, labels: np.ndarray):
    """Logits 0 for `labels` in the kind's shape: [N, C] / [N] or [1, N, K] / [1, N]."""
    import mindspore as ms

    n = len(labels)
    shape = (n, c) if kind == "classification" else (1, n, c)
    return (ms.Tensor(np.zeros(shape, np.float32)),
            ms.Tensor(labels.reshape(shape[:-1]).astype(np.int32)))


def _names(ctx, c: int) -> list[str]:
    names = ctx.config.task.labels
    return list(names) if names and len(names) == c else [str(k) for k in range(c)]


class ClassWeights(Check):
    """The per-class weight read off the objective's gradient against the declared class_weight."""

    name = "class-weights"
    stage = "grad"
    kinds = KINDS

    def skip_reason(self, ctx) -> str | None:
        if list(ctx.target.objective.trainable_params()):
            return ("the objective has parameters of its own (a CRF's transitions): its gradient "
                    "is not a per-class weight times a cross-entropy's (the CRF checks, OBJ222-OBJ225)")
        return None

    def measure(self, ctx, th: Settings) -> dict[str, Any]:
        from objdebug.engine import tasks

        c = task_kind.classes(ctx)
        names = _names(ctx, c)
        x, y = _probe(ctx.config.task.kind, c, np.arange(c))
        outputs, g = tasks.logit_grad(ctx.engine, x, y)
        g = g.reshape(c, c)
        ref = np.full((c, c), 1.0 / c) - np.eye(c)  # reference: a standard CE's direction at logits 0
        r = (g * ref).sum(1) / (ref * ref).sum(1)
        resid = np.linalg.norm(g - r[:, None] * ref, axis=1) / np.maximum(np.linalg.norm(g, axis=1), 1e-30)
        declared, source = tasks.declared_class_weight(ctx.config, ctx.target.objective, c)
        total = float(r.sum())
        mean_reduced = abs(total - 1.0) <= 1e-3
        return {"classes": names, "measured": r.tolist(), "measured_sum": total,
                "reduction": "mean" if mean_reduced else "sum",
                "residual": float(resid.max()), "loss": float(outputs[0]),
                "declared": None if declared is None else declared.tolist(),
                "declared_source": source}

    def conditions(self, th: Settings) -> list[Condition]:
        rtol = float(th["class_weight_rtol"])

        def judge(v):
            r = np.asarray(v["measured"])
            names = v["classes"]
            if not np.all(np.isfinite(r)):
                return Verdict.FAIL, f"the objective's logit gradient is not finite at logits 0: {r.tolist()}", None
            if v["residual"] > 0.05:
                return (Verdict.SKIP, f"the objective's gradient at logits 0 is not a weighted "
                                      f"cross-entropy's (off its direction by {v['residual']:.2g}): "
                                      f"per-class weights are not measured", None)
            if np.any(r <= 0):
                bad = [names[k] for k in np.nonzero(r <= 0)[0]]
                return Verdict.FAIL, (f"classes {listing(bad)} get no or a negative weight "
                                      f"(measured {r.tolist()}): the objective does not train them"), 1.0
            declared = v["declared"]
            src = v["declared_source"]
            d = np.ones_like(r) if declared is None else np.asarray(declared, np.float64)
            if d.size != r.size:
                return Verdict.FAIL, (f"{src} declares {d.size} weights for {r.size} classes"), 1.0
            # a scale is not a weight: a sum reduction, label smoothing (1 - eps), a loss
            # multiplier all scale every class alike, so the shares (ratios) are compared
            m, e = r / r.sum(), d / d.sum()
            what = "share of the weight"
            rel = np.abs(m - e) / e
            off = np.nonzero(rel > rtol)[0]
            pairs = ", ".join(f"{names[k]}: measured {m[k]:.3g}, declared {e[k]:.3g}" for k in off[:6])
            said = f"declared by {src}" if declared is not None else \
                "expected without a declared weight (uniform: nothing declares one)"
            if len(off):
                inverted = declared is not None and len(r) > 1 and np.ptp(m) > 0 and \
                    np.ptp(e) > 0 and np.corrcoef(m, e)[0, 1] < -0.5
                return Verdict.FAIL, (
                    f"class weights read off the objective's gradient ({v['reduction']} reduction) "
                    f"differ from those {said} for {len(off)} of {len(r)} classes: {pairs}"
                    + ("; the order is inverted (frequent classes up-weighted?)" if inverted else "")
                    + (f"; the objective ignores the declared weight" if declared is not None
                       and np.ptp(r) <= rtol * r.mean() and np.ptp(d) > 0 else "")), float(rel.max())
            return Verdict.PASS, (f"class weights read off the objective's gradient match those "
                                  f"{said} for all {len(r)} classes ({what}, max relative "
                                  f"difference {rel.max():.2g}; {v['reduction']} reduction)"), float(rel.max())

        return [Condition("OBJ220", "class_weights_as_declared", judge)]


class IgnoredLabel(Check):
    """Rows / tags labelled label_pad_id get exactly zero gradient (and the objective takes them)."""

    name = "ignored-label"
    stage = "grad"
    kinds = kinds.with_ignored_label()

    def skip_reason(self, ctx) -> str | None:
        ignored, why = kinds.ignores_labels(ctx.config, ctx.target.objective)
        if not ignored:  # a sequence classifier's rows are never ignored: no -100 to feed it
            return f"no label is ignored on this kind: {why} (set ignore_index to have it checked)"
        return None

    def measure(self, ctx, th: Settings) -> dict[str, Any]:
        from objdebug.engine import tasks

        c = task_kind.classes(ctx)
        pid = ctx.engine.padding.label_pad_id
        labels = np.array(list(range(c)) + [pid, pid], np.int64)
        x, y = _probe(ctx.config.task.kind, c, labels)
        # random logits, not 0: a term whose gradient vanishes at the uniform prediction (label
        # smoothing's -sum_k log p_k left unmasked) still trains the ignored positions elsewhere
        import mindspore as ms

        x = ms.Tensor(np.random.default_rng(0).normal(0.0, 1.0, x.shape).astype(np.float32))
        try:
            outputs, g = tasks.logit_grad(ctx.engine, x, y)
        except Exception as exc:  # GatherD rejects it: the objective does not know the ignore label
            from objdebug.engine.compile_errors import first_line

            return {"label_pad_id": pid, "rejected": f"{type(exc).__name__}: {first_line(str(exc))}"}
        g = g.reshape(len(labels), c)
        norms = np.linalg.norm(g, axis=1)
        return {"label_pad_id": pid, "rejected": None, "ignored_norm": float(norms[c:].max()),
                "scored_norm": float(norms[:c].min()), "loss": float(outputs[0])}

    def conditions(self, th: Settings) -> list[Condition]:
        tol = float(th["ignored_tolerance"])

        def judge(v):
            pid = v["label_pad_id"]
            if v["rejected"]:
                return Verdict.FAIL, (f"the objective rejects label_pad_id = {pid}: on a batch with "
                                      f"ignored rows / tags it raises ({v['rejected']}); set its "
                                      f"ignore_index to {pid}"), None
            x = v["ignored_norm"]
            if not math.isfinite(x) or x > tol:
                return Verdict.FAIL, (f"positions labelled label_pad_id = {pid} receive gradient: "
                                      f"logit-gradient norm {x:.4g} there (tolerance {tol:g}; a scored "
                                      f"position gets >= {v['scored_norm']:.4g}): the objective trains "
                                      f"on them, e.g. as class 0"), x
            if v["scored_norm"] <= 0:
                return Verdict.FAIL, (f"no position gets gradient, scored ones included (norm "
                                      f"{v['scored_norm']:.4g})"), 0.0
            return Verdict.PASS, (f"positions labelled label_pad_id = {pid} get zero gradient (max "
                                  f"norm {x:.3g}; scored positions >= {v['scored_norm']:.3g})"), x

        return [Condition("OBJ221", "ignored_label_not_trained", judge)]


def reference_ce_cotangent(out: np.ndarray, labels: np.ndarray, label_pad_id: int) -> np.ndarray | None:
    """dL/d(model output) of a plain mean cross-entropy over the scored labels (float64 numpy, a
    reference): (softmax - onehot) / N at each scored row or position ([B, C] with labels [B], or
    [B, T, K] with labels [B, T]); None when nothing is scored or a label is outside the classes."""
    x = np.asarray(out, np.float64)
    y = np.asarray(labels).reshape(-1)
    flat = x.reshape(-1, x.shape[-1])
    if flat.shape[0] != y.shape[0]:
        return None
    scored = (y != label_pad_id) & (y >= 0)
    if not scored.any() or (y[scored] >= flat.shape[1]).any():
        return None
    z = flat - flat.max(-1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    g = np.zeros_like(flat)
    g[scored] = p[scored]
    g[np.flatnonzero(scored), y[scored]] -= 1.0
    return (g / scored.sum()).reshape(x.shape)


def health_measure(ctx, th: Settings) -> dict[str, Any]:
    """gradient-health's measurement (OBJ201-OBJ204, judged by its conditions) on a task
    kind's gradient batch: `task.logit_grad`, then the shared `model.vjp`."""
    import mindspore as ms

    from objdebug.engine import tasks

    rows = task_kind.grad_rows(ctx)
    pid = ctx.engine.padding.label_pad_id
    length = tasks.bucket(max(len(r.ids) for r in rows))
    ids = tasks.pad([r.ids for r in rows], ctx.engine.padding.pad_id, length)
    out = tasks.forward(ctx.engine, ids)
    if ctx.config.task.kind == "classification":
        labels = np.array([r.target for r in rows], np.int32)
    else:
        labels = tasks.pad([r.target for r in rows], pid, length, fill=pid)
    outputs, g = tasks.logit_grad(ctx.engine, out, ms.Tensor(labels))
    names, grads = tasks.param_grad(ctx.engine, ids, g)
    params = []
    for n, gr in zip(names, grads):
        size = gr.size
        params.append({"name": n, "layer": layer_of(n), "size": int(size),
                       "norm": float(np.linalg.norm(gr)), "max_abs": float(np.abs(gr).max()),
                       "zero_share": float((gr == 0).sum() / size),
                       "nonfinite": int((~np.isfinite(gr)).sum())})
    norms = np.array([p["norm"] for p in params])
    ratio, imax, mean = max_mean_ratio(norms)
    # the same model's gradient scale under a plain mean cross-entropy on the same batch (a numpy
    # float64 reference cotangent through the same `model.vjp` graph: no compile of its own), so
    # OBJ201 can tell the model's scale from the objective's (TaskGradientHealth)
    ref = reference_ce_cotangent(out.asnumpy(), labels, pid)
    ref_mean = None
    if ref is not None:
        _, ref_grads = tasks.param_grad(ctx.engine, ids, ref)
        ref_mean = float(max_mean_ratio(np.array([np.linalg.norm(x) for x in ref_grads]))[2])
    layers: dict[str, dict[str, Any]] = {}
    for p in params:
        lay = layers.setdefault(p["layer"], {"layer": p["layer"], "params": 0, "sq": 0.0})
        lay["params"] += 1
        lay["sq"] += p["norm"] ** 2
    return {
        "loss": float(outputs[0]), "outputs": outputs.tolist(),
        "batch": {"rows": len(rows), "length": int(length), "data_rows": len(rows), "filled_rows": 0},
        "n_params": len(params), "global_norm": float(np.sqrt((norms ** 2).sum())),
        "mean_param_norm": mean, "max_param_norm": float(norms[imax]), "max_param": names[imax],
        "reference_mean_param_norm": ref_mean,
        "max_mean_ratio": ratio if mean > 0 else float("inf"),
        "nonfinite_total": int(sum(p["nonfinite"] for p in params)),
        "nonfinite_params": [p["name"] for p in params if p["nonfinite"]],
        "disconnected": [p["name"] for p in params if p["zero_share"] == 1.0],
        "params": params,
        "layers": [{"layer": v["layer"], "params": v["params"], "norm": math.sqrt(v["sq"])}
                   for v in layers.values()],
    }
