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

A composite objective (`objective.components` declared: outputs (total, term, ...)) is judged on
its primary term, the one the temperature and the similarity belong to: a norm penalty added to
a cosine InfoNCE makes the total depend on the norm by design, the InfoNCE term does not.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.core.config import TASK_FORMULAS
from objdebug.core.findings import Check, Condition, Verdict, listing
from objdebug.core.settings import Settings
from objdebug.engine.tasks import NEGATIVE_UNUSED
from objdebug.pipeline import task_kind
from objdebug.engine import kinds as task_kinds


FLOAT32_ROUNDING = 16 * 2.0 ** -23  # a few float32 roundings of the loss's largest term, relative


def _setting(cfg, cell, *names):
    for n in names:
        v = cfg.objective.kwargs.get(n, getattr(cell, n, None))
        if v is not None and not isinstance(v, bool):
            return n, v
    return None, None


def _metric(value) -> str | None:
    """A declared similarity or distance by its name in the objective (a string, an enum member's
    name, a function such as sentence-transformers' `cos_sim`) -> "cosine" / "dot" /
    "euclidean"; None when it names none of them."""
    if value is None:
        return None
    name = getattr(value, "__name__", None) or getattr(value, "name", None) or str(value)
    name = name.lower()
    for key, metric in (("cos", "cosine"), ("dot", "dot"), ("euclid", "euclidean")):
        if key in name:
            return metric
    return None


def _judged_term(cfg) -> tuple[int, str]:
    """(the index among the objective's outputs of the term the contrastive checks judge, its
    name): the primary component of a declared composite (outputs total, components...), else
    the total (index 0)."""
    comps = list(cfg.objective.components or [])
    if not comps:
        return 0, "the loss"
    primary = cfg.objective.primary or comps[0]
    return 1 + comps.index(primary), f"its primary term '{primary}'"


def _cos(a, b):
    a = a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=-1, keepdims=True), 1e-12)
    return a @ b.T


def _lse(x):
    m = x.max(1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(1, keepdims=True)))[:, 0]


def _sims(sim: str | None) -> list[str]:
    return [sim] if sim else ["cosine", "dot"]


def pair_forms(A, P, tau: float, sim: str | None) -> tuple[dict[str, float], float]:
    """The in-batch family's closed forms at temperature tau (numpy float64 references), per
    similarity (the declared one, else cosine and dot): InfoNCE anchor -> positives (van den Oord
    et al. 2018; sentence-transformers' MultipleNegativesRankingLoss), and its symmetric form
    (the mean of both directions: CLIP, OpenCLIP's ClipLoss); and the largest logit (rounding)."""
    forms, scale = {}, 0.0
    for s in _sims(sim):
        x = (_cos(A, P) if s == "cosine" else A @ P.T) / tau
        a2p = float(-np.mean(np.diag(x) - _lse(x)))
        p2a = float(-np.mean(np.diag(x) - _lse(x.T)))
        forms[f"infonce/{s}"] = a2p
        forms[f"symmetric-infonce/{s}"] = (a2p + p2a) / 2
        scale = max(scale, float(np.abs(x).max()))
    return forms, scale


def triplet_forms(A, P, N, margin: float, sim: str | None) -> tuple[dict[str, float], float]:
    """The margin family's closed forms (numpy float64 references), per distance (the declared
    one, else euclidean and cosine): the triplet loss mean max(0, d(a, p) - d(a, n) + m) (Schroff
    et al. 2015; sentence-transformers' TripletLoss), and the margin contrastive loss of the
    (anchor, positive) and (anchor, negative) pairs, the mean over the 2B pairs of 0.5 (label
    d^2 + (1 - label) max(0, m - d)^2) (Hadsell et al. 2006; sentence-transformers'
    ContrastiveLoss); and the largest term."""
    forms, scale = {}, 0.0
    for s in _sims(sim) if sim else ["euclidean", "cosine"]:
        if s == "cosine":
            def d(x, y):
                return 1 - np.sum(x * y, -1) / np.linalg.norm(x, axis=-1) / np.linalg.norm(y, axis=-1)
        else:
            def d(x, y):
                return np.linalg.norm(x - y, axis=-1)
        dp, dn = d(A, P), d(A, N)
        forms[f"triplet/{s}"] = float(np.maximum(dp - dn + margin, 0).mean())
        # the mean over the 2B pairs of 0.5 (label d^2 + (1 - label) relu(m - d)^2)
        forms[f"contrastive-margin/{s}"] = float((0.25 * (dp ** 2 + np.maximum(margin - dn, 0) ** 2)).mean())
        t = float(max(dp.max(), dn.max()) + abs(margin))
        scale = max(scale, t, t * t)
    return forms, scale


FORMULAS = TASK_FORMULAS  # [task] formula


class Contrastive(Check):
    """The contrastive loss vs its closed form, its setting used, norm invariance, duplicates."""

    name = "contrastive"
    stage = "grad"
    kinds = task_kinds.unlabelled()

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
        term, term_name = _judged_term(cfg)

        def value_of(outputs) -> float:
            values = outputs.asnumpy()
            return float(values[term] if values.size > term else values[0])

        loss = value_of(tasks.pair_objective(engine, a, p, n))
        A, P = a.asnumpy().astype(np.float64), p.asnumpy().astype(np.float64)
        out: dict[str, Any] = {"rows": len(rows), "form": "triplet" if triplet else "pairs", "loss": loss,
                               "negatives_unused": any(r.meta.get("negative_unused") for r in rows),
                               "term": term_name}
        key, value = _setting(cfg, cell, "margin") if triplet else \
            _setting(cfg, cell, "temperature", "tau", "scale", "logit_scale")
        _, sim = _setting(cfg, cell, "distance", "distance_metric") if triplet else \
            _setting(cfg, cell, "similarity", "similarity_fct")
        sim = _metric(sim)
        out.update(setting=key, value=value, similarity=sim, declared=cfg.task.formula)
        if value is not None:  # the family's closed forms on the measured embeddings (numpy float64)
            if triplet:
                N = n.asnumpy().astype(np.float64)
                forms, scale = triplet_forms(A, P, N, float(value), sim)
            else:
                tau = 1.0 / float(value) if key in ("scale", "logit_scale") else float(value)
                forms, scale = pair_forms(A, P, tau, sim)
            out["forms"] = forms
            ref = min(forms.values(), key=lambda x: abs(x - loss))
            out["closest"] = next(f for f, x in forms.items() if x == ref)
            declared = [f for f in forms if f.split("/")[0] == cfg.task.formula]
            if declared:  # the user's own formula is the one compared with
                ref = min((forms[f] for f in declared), key=lambda x: abs(x - loss))
                out["closest"] = next(f for f in declared if forms[f] == ref)
            out["reference"] = ref
            # the loss is a difference of terms this large (logits s / tau, distances + margin):
            # float32 rounds each to ~eps * scale, however small the difference (a trained encoder's
            # InfoNCE is 3e-4 nats from logits of 20), so that much is rounding, not a defect
            out["rounding"] = FLOAT32_ROUNDING * scale
            # OBJ227: the objective rebuilt with the setting doubled
            kwargs = {**cfg.objective.kwargs, key: float(value) * 2}
            try:
                variant = _call_factory(cfg.objective.factory, kwargs, "objective", cfg.base_dir)
                out["doubled_loss"] = value_of(tasks.pair_objective_of(
                    engine, variant, "task.objective.variant", a, p, n))
            except Exception as exc:  # a factory that does not take the key: not measured
                out["doubled_error"] = f"{type(exc).__name__}: {exc}"
        if sim == "cosine":  # OBJ228: a cosine loss does not see the embeddings' norm
            out["scaled_loss"] = value_of(tasks.pair_objective(engine, a * 3.0, p, n))
        texts = [tuple(r.positive) for r in rows]
        out["duplicates"] = sorted({rows[i].id for i in range(len(rows)) if texts.count(texts[i]) > 1})
        return out

    def conditions(self, th: Settings) -> list[Condition]:
        rtol = float(th["contrastive_rtol"])

        def closed_form(v):
            unused = ("; " + NEGATIVE_UNUSED) if v.get("negatives_unused") else ""
            if v.get("reference") is None:
                return (Verdict.SKIP, f"the objective names no {'margin' if v['form'] == 'triplet' else 'temperature or scale'} "
                                      f"(kwargs or attribute): no closed form to compare with{unused}", None)
            x, ref, form = v["loss"], v["reference"], v["closest"]
            rel = abs(x - ref) / max(abs(ref), 1e-6)
            rounding = v.get("rounding", 0.0)
            name, sim = form.split("/")
            what = f"{name} at {v['setting']} = {v['value']:g} ({sim})"
            if math.isfinite(x) and abs(x - ref) <= rtol * abs(ref) + rounding:
                return Verdict.PASS, (f"loss {x:.6g} = {what}: {ref:.6g} (reference, relative difference {rel:.2g}, "
                                      f"absolute {abs(x - ref):.2g} within {rtol:g} relative + float32 rounding "
                                      f"{rounding:.2g}){unused}"), rel
            tried = ", ".join(f"{f} {r:.6g}" for f, r in v["forms"].items())
            if v.get("declared"):  # the user's own formula: a mismatch is a defect
                return Verdict.FAIL, (f"loss {x:.6g} on {v['rows']} rows, but the declared formula "
                                      f"task.formula = \"{v['declared']}\", {what}, on the measured "
                                      f"embeddings is {ref:.6g} (reference; relative difference "
                                      f"{rel:.3g} > {rtol:g}, beyond float32 rounding {rounding:.2g}): "
                                      f"temperature applied twice, the positive left out of the "
                                      f"denominator, or the anchor compared with itself?{unused}"), rel
            # one member of a family with many correct forms (soft targets, a learned
            # temperature, hard-negative weighting ...): not matching the textbook ones is a note
            return Verdict.INFO, (f"loss {x:.6g} on {v['rows']} rows is none of the closed forms "
                                  f"compared ({tried}; float64 references): a form of its own, not "
                                  f"judged (set task.formula to one of {list(FORMULAS)} to have it "
                                  f"checked){unused}"), rel

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
                return Verdict.SKIP, (f"the objective claims {v['similarity']}, not cosine" if v["similarity"]
                                      else "the objective declares no similarity (kwargs or attribute)"), None
            x, y = v["loss"], v["scaled_loss"]
            rel = abs(x - y) / max(abs(x), 1e-6)
            if rel > rtol:
                return Verdict.FAIL, (f"the objective claims cosine similarity but the anchors scaled by 3 "
                                      f"change {v.get('term', 'the loss')} {x:.6g} -> {y:.6g}: the "
                                      f"embeddings are not normalised"), rel
            return Verdict.PASS, (f"cosine: the anchors scaled by 3 leave {v.get('term', 'the loss')} "
                                  f"at {y:.6g}"), rel

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
