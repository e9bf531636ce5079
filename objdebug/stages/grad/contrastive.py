"""Grad for `[task] kind = "embedding"` (issue 47): a contrastive objective on the model's
embeddings of real (anchor, positive[, negative]) rows.

The objective's settings are read from its kwargs or attributes, as the preference closed forms
read `beta`: `temperature` (InfoNCE) or `margin` (triplet), `similarity` / `distance`.

- OBJ226 the loss against the closed form on the measured similarities (a numpy float64
  reference, labelled as such): in-batch InfoNCE at temperature tau, -mean_i log softmax_j(s(a_i,
  p_j) / tau)_i (the positive in the denominator, the anchor never compared with itself), or the
  triplet loss mean max(0, d(a, p) - d(a, n) + m). A temperature applied twice, a positive left
  out of the denominator, the anchor compared with itself: the loss leaves the closed form.
- OBJ227 the setting is used: the objective rebuilt from its factory with `temperature` (or
  `margin`) doubled gives another loss on the same embeddings (OBJ811's measurement, for these).
- OBJ228 a claimed cosine is norm-invariant: the anchors scaled by 3 give the same loss.
- OBJ229 duplicates of a row's positive among its in-batch negatives (the same positive text in
  two rows) are reported: a false negative the loss pushes away.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.core.findings import Check, Condition, Verdict, listing
from objdebug.core.settings import Settings
from objdebug.pipeline import task_kind


FLOAT32_ROUNDING = 16 * 2.0 ** -23  # a few float32 roundings of the loss's largest term, relative


def _setting(cfg, cell, *names):
    for n in names:
        v = cfg.objective.kwargs.get(n, getattr(cell, n, None))
        if v is not None and not isinstance(v, bool):
            return n, v
    return None, None


def _cos(a, b):
    a = a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=-1, keepdims=True), 1e-12)
    return a @ b.T


class Contrastive(Check):
    """The contrastive loss vs its closed form, its setting used, norm invariance, duplicates."""

    name = "contrastive"
    stage = "grad"
    kinds = ("embedding",)

    def skip_reason(self, ctx) -> str | None:
        if not (ctx.config.data.align or ctx.config.data.scores):
            return "no embedding rows: set data.align to a JSONL of {id, anchor, positive, negative?} rows"
        return None

    def measure(self, ctx, th: Settings) -> dict[str, Any]:
        from objdebug.engine import tasks
        from objdebug.engine.target import _call_factory

        cfg, engine, cell = ctx.config, ctx.engine, ctx.target.objective
        rows = task_kind.grad_rows(ctx)
        triplet = all(r.negative is not None for r in rows)
        pad = engine.padding.pad_id

        def embed(seqs):
            return tasks.forward(engine, tasks.pad(seqs, pad, tasks.bucket(max(map(len, seqs)))))

        a, p = embed([r.ids for r in rows]), embed([r.positive for r in rows])
        n = embed([r.negative for r in rows]) if triplet else None
        loss = float(tasks.pair_objective(engine, a, p, n).asnumpy()[0])
        A, P = a.asnumpy().astype(np.float64), p.asnumpy().astype(np.float64)
        out: dict[str, Any] = {"rows": len(rows), "form": "triplet" if triplet else "pairs", "loss": loss}
        key, value = _setting(cfg, cell, "margin") if triplet else _setting(cfg, cell, "temperature", "tau")
        _, sim = _setting(cfg, cell, "distance") if triplet else _setting(cfg, cell, "similarity")
        sim = sim or ("euclidean" if triplet else "cosine")
        out.update(setting=key, value=value, similarity=sim)
        if value is not None:  # the closed form on the measured embeddings (numpy float64 reference)
            if triplet:
                N = n.asnumpy().astype(np.float64)
                d = (lambda x, y: 1 - np.sum(x * y, -1) / np.linalg.norm(x, axis=-1) / np.linalg.norm(y, axis=-1)) \
                    if sim == "cosine" else (lambda x, y: np.linalg.norm(x - y, axis=-1))
                ref = float(np.maximum(d(A, P) - d(A, N) + float(value), 0).mean())
                scale = float(max(d(A, P).max(), d(A, N).max()) + abs(float(value)))
            else:
                s = (_cos(A, P) if sim == "cosine" else A @ P.T) / float(value)
                ref = float(-np.mean(np.diag(s) - (s.max(1) + np.log(np.exp(s - s.max(1, keepdims=True)).sum(1)))))
                scale = float(np.abs(s).max())
            out["reference"] = ref
            # the loss is a difference of terms this large (logits s / tau, distances + margin):
            # float32 rounds each to ~eps * scale, however small the difference (a trained encoder's
            # InfoNCE is 3e-4 nats from logits of 20), so that much is rounding, not a defect
            out["rounding"] = FLOAT32_ROUNDING * scale
            # OBJ227: the objective rebuilt with the setting doubled
            kwargs = {**cfg.objective.kwargs, key: float(value) * 2}
            try:
                variant = _call_factory(cfg.objective.factory, kwargs, "objective", cfg.base_dir)
                out["doubled_loss"] = float(tasks.pair_objective_of(
                    engine, variant, "task.objective.variant", a, p, n).asnumpy()[0])
            except Exception as exc:  # a factory that does not take the key: not measured
                out["doubled_error"] = f"{type(exc).__name__}: {exc}"
        if sim == "cosine":  # OBJ228: a cosine loss does not see the embeddings' norm
            out["scaled_loss"] = float(tasks.pair_objective(engine, a * 3.0, p, n).asnumpy()[0])
        texts = [tuple(r.positive) for r in rows]
        out["duplicates"] = sorted({rows[i].id for i in range(len(rows)) if texts.count(texts[i]) > 1})
        return out

    def conditions(self, th: Settings) -> list[Condition]:
        rtol = float(th["contrastive_rtol"])

        def closed_form(v):
            if v.get("reference") is None:
                return (Verdict.SKIP, f"the objective names no {'margin' if v['form'] == 'triplet' else 'temperature'} "
                                      f"(kwargs or attribute): no closed form to compare with", None)
            x, ref = v["loss"], v["reference"]
            rel = abs(x - ref) / max(abs(ref), 1e-6)
            rounding = v.get("rounding", 0.0)
            what = (f"InfoNCE at {v['setting']} = {v['value']:g} ({v['similarity']}, positive in the "
                    f"denominator, no self-similarity)" if v["form"] == "pairs" else
                    f"the triplet loss at margin {v['value']:g} ({v['similarity']})")
            if not math.isfinite(x) or abs(x - ref) > rtol * abs(ref) + rounding:
                return Verdict.FAIL, (f"loss {x:.6g} on {v['rows']} rows, but {what} on the measured "
                                      f"embeddings is {ref:.6g} (reference; relative difference "
                                      f"{rel:.3g} > {rtol:g}, beyond float32 rounding {rounding:.2g}): "
                                      f"temperature applied twice, the positive "
                                      f"left out of the denominator, or the anchor compared with itself?"), rel
            return Verdict.PASS, (f"loss {x:.6g} = {what}: {ref:.6g} (reference, relative difference {rel:.2g}, "
                                  f"absolute {abs(x - ref):.2g} within {rtol:g} relative + float32 rounding "
                                  f"{rounding:.2g})"), rel

        def used(v):
            if "doubled_loss" not in v:
                return (Verdict.SKIP, f"the setting is not measured: {v.get('doubled_error') or 'no temperature / margin'}",
                        None)
            x, y = v["loss"], v["doubled_loss"]
            if abs(y - x) <= 1e-7 * max(abs(x), 1.0):
                return Verdict.FAIL, (f"{v['setting']} = {v['value']:g} does nothing: doubled, the loss "
                                      f"stays {x:.6g} (stored but unused)"), 0.0
            return Verdict.PASS, f"{v['setting']} is used: doubled, the loss moves {x:.6g} -> {y:.6g}", abs(y - x)

        def norm_invariant(v):
            if "scaled_loss" not in v:
                return Verdict.SKIP, f"the objective claims {v['similarity']}, not cosine", None
            x, y = v["loss"], v["scaled_loss"]
            rel = abs(x - y) / max(abs(x), 1e-6)
            if rel > rtol:
                return Verdict.FAIL, (f"the objective claims cosine similarity but the anchors scaled by 3 "
                                      f"change the loss {x:.6g} -> {y:.6g}: the embeddings are not "
                                      f"normalised"), rel
            return Verdict.PASS, f"cosine: the anchors scaled by 3 leave the loss at {y:.6g}", rel

        def duplicates(v):
            d = v["duplicates"]
            if d:
                return Verdict.WARN, (f"{len(d)} rows share their positive with another row, so it is "
                                      f"also an in-batch negative of theirs: {listing(d)}"), float(len(d))
            return Verdict.PASS, f"no positive repeats among the {v['rows']} rows' in-batch negatives", 0.0

        return [Condition("OBJ226", "contrastive_closed_form", closed_form),
                Condition("OBJ227", "contrastive_setting_used", used),
                Condition("OBJ228", "cosine_norm_invariant", norm_invariant),
                Condition("OBJ229", "no_duplicate_positives", duplicates)]
