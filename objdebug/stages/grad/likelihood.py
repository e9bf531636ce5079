"""Likelihood shape (OBJ208): is the objective's gradient w.r.t. the logits a likelihood's?

Numpy float64 references, reported as such; the objective's own gradient comes from MindSpore
(the grad stage's logit probe). At a scored token t with softmax p_t and label y_t:

    r_t = p_t - onehot(y_t)            a mean cross-entropy's gradient direction (times 1/n)
    s_t = onehot(y_t) - 1/V            what label smoothing adds (CE toward (1-ε) onehot + ε/V)
    e_t = p_t * (log p_t + H(p_t))     what an entropy bonus adds (-dH/dlogits)
    z_t = lse_t * p_t                  what a z-loss adds (d(lse_t^2)/dlogits / 2; lse_t = log Z_t of
                                       the raw logits, PaLM / OLMo)

A healthy likelihood objective's gradient is g ~ α r + β s + γ e + ζ z with ONE set of
coefficients for all tokens: a masked mean CE (β = γ = ζ = 0), label smoothing ε = β/α,
"ce - λ·entropy" (λ = γ/α), "ce + w·mean(lse²)" (w = ζ/2α). The fit is global least squares over the scored positions (flattened), so:

- `cosine_ce`: cos(g, r) flattened, the plain comparison (label smoothing and entropy terms
  lower it on a confident model, where they are most of the gradient by design);
- `cosine_family`: cos(g, fit): what no likelihood with smoothing/entropy explains is a
  different direction (squared error on probabilities at wrong-confident tokens, a hinge ...);
- `reweighted_share`: per token, the weight of g_t along r_t after the fitted smoothing and
  entropy parts, relative to the global CE coefficient (1 for every token of the family); the
  share of tokens with a weight outside [1/band, band]. A focal loss or squared error on
  probabilities points each token the right way but weights tokens by confidence: the direction
  per token agrees, the mix does not.

The fit keeps to plausible regularisers (0 <= smoothing <= max_smoothing, |entropy| <=
max_entropy, 0 <= z-loss weight <= max_zloss): near a uniform softmax r, s and e are almost collinear and a free fit would
"explain" other shapes with absurd coefficients.
"""

from __future__ import annotations

from typing import Any

import numpy as np


_CONFIDENCE_BINS = ((0.0, 0.1), (0.1, 0.5), (0.5, 0.9), (0.9, 1.01))
_MIN_R = 1e-4  # |p - onehot| below this is float32 rounding in the objective's own gradient


def softmax64(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    p = np.exp(x)
    return p / p.sum(axis=-1, keepdims=True)


_PAIRS = ("gg", "rr", "ss", "ee", "gr", "gs", "ge", "rs", "re", "se", "zz", "gz", "rz", "sz", "ez")
_CHUNK_ELEMENTS = 1 << 22  # float64 working set per chunk: a few x 32 MiB, whatever the vocabulary


def token_dots(g: np.ndarray, logits: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Per scored token, the dot products among g, r, s, e (module docstring) and p(label).

    Rows [n, V] in chunks: nothing of size n x V in float64 is kept, so a 32k vocabulary over a
    few thousand tokens costs tens of MiB, not GiBs. With onehot o: r = p - o, s = o - 1/V,
    sum(e) = 0, so the dot products with o and with the constant are closed forms.
    """
    n, vocab = g.shape
    out = {k: np.empty(n) for k in _PAIRS + ("p_label",)}
    step = max(1, _CHUNK_ELEMENTS // vocab)
    for lo in range(0, n, step):
        sl = slice(lo, min(n, lo + step))
        gc = g[sl].astype(np.float64)
        x = logits[sl].astype(np.float64)
        p = softmax64(x)
        logp = np.log(np.maximum(p, 1e-300))
        top = x.max(-1)
        lse = top + np.log(np.exp(x - top[:, None]).sum(-1))  # log Z of the raw logits (z = lse p)
        e = p * (logp + (-(p * logp).sum(-1, keepdims=True)))
        rows = np.arange(gc.shape[0])
        yc = y[sl]
        p_y, g_y, e_y = p[rows, yc], gc[rows, yc], e[rows, yc]
        pp = (p * p).sum(-1)
        out["p_label"][sl] = p_y
        out["gg"][sl] = (gc * gc).sum(-1)
        out["rr"][sl] = pp - 2 * p_y + 1
        out["ss"][sl] = 1 - 1 / vocab
        out["ee"][sl] = (e * e).sum(-1)
        out["gr"][sl] = (gc * p).sum(-1) - g_y
        out["gs"][sl] = g_y - gc.sum(-1) / vocab
        out["ge"][sl] = (gc * e).sum(-1)
        out["rs"][sl] = p_y - 1
        out["re"][sl] = (p * e).sum(-1) - e_y
        out["se"][sl] = e_y
        pe = (p * e).sum(-1)
        out["zz"][sl] = lse * lse * pp
        out["gz"][sl] = lse * (gc * p).sum(-1)
        out["rz"][sl] = lse * (pp - p_y)
        out["sz"][sl] = lse * (p_y - 1 / vocab)
        out["ez"][sl] = lse * pe
    return out


def _ratio(x: float, y: float) -> float:
    return x / y if y > 0 else float("nan")


def analyse(grad: np.ndarray, logits: np.ndarray, labels: np.ndarray, label_pad_id: int,
            band: float = 2.0, max_smoothing: float = 0.3, max_entropy: float = 0.2,
            cosine_min: float = 0.99, reweighted_max: float = 0.1, max_zloss: float = 0.0
            ) -> dict[str, Any]:
    """Compare the objective's logit gradient [B, T, V] with the likelihood family (see module)."""
    scored = labels != label_pad_id
    vocab = int(logits.shape[-1])
    g = grad[scored]
    n = int(g.shape[0])
    out: dict[str, Any] = {"scored_tokens": n, "vocab": vocab, "band": band}
    if n == 0:
        return {**out, "shape": "no scored tokens"}
    nonfinite = int((~np.isfinite(g)).sum())
    if nonfinite:
        return {**out, "nonfinite": nonfinite, "shape": "non-finite gradient"}
    d = token_dots(g, logits[scored], labels[scored].astype(np.int64))
    p_label = d["p_label"]
    tot = {k: float(d[k].sum()) for k in _PAIRS}
    g_norm = float(np.sqrt(tot["gg"]))
    out.update(gradient_norm=g_norm, nonfinite=0,
               label_probability={"p10": float(np.quantile(p_label, 0.1)),
                                  "median": float(np.median(p_label)),
                                  "p90": float(np.quantile(p_label, 0.9))})
    if g_norm == 0.0:
        return {**out, "shape": "no gradient", "cosine_ce": 0.0, "cosine_family": 0.0}

    # plain comparison with a mean cross-entropy, overall and per token
    norms = np.sqrt(d["gg"] * d["rr"])
    live = norms > 0
    per_token = d["gr"][live] / norms[live]
    out.update(cosine_ce=_ratio(tot["gr"], np.sqrt(tot["gg"] * tot["rr"])),
               per_token={"tokens": int(live.sum()),
                          "median": float(np.median(per_token)) if live.any() else float("nan"),
                          "p10": float(np.quantile(per_token, 0.1)) if live.any() else float("nan")})

    # the likelihood family: global least squares g ~ a r + b s + c e + z·zeta, the best admissible fit
    a, b, c, zeta, cos_fit = _family_fit(tot, max_smoothing, max_entropy, max_zloss)
    out.update(coefficients={"ce": a, "smoothing": b, "entropy": c, "z_loss": zeta},
               smoothing=b / a if a != 0 else float("nan"),
               entropy_weight=c / a if a != 0 else float("nan"),
               z_loss_weight=zeta / (2 * a) if a != 0 else float("nan"),
               cosine_family=cos_fit)

    # per-token weight of the likelihood part: what is left of g_t after the fitted smoothing and
    # entropy parts, along r_t, relative to the global a (1 for every token of the family).
    # Tokens where |r_t| is below float32 resolution of p - onehot are left out (noise).
    use = d["rr"] > _MIN_R ** 2
    w = ((d["gr"] - b * d["rs"] - c * d["re"] - zeta * d["rz"])[use] / (a * d["rr"][use])) if a != 0 \
        else np.array([])
    if w.size:
        off = (w < 1 / band) | (w > band)
        out.update(weighted_tokens=int(w.size), reweighted_share=float(off.mean()),
                   weight_vs_confidence=_spearman(w, p_label[use]),
                   weight_quantiles={"p10": float(np.quantile(w, 0.1)), "median": float(np.median(w)),
                                     "p90": float(np.quantile(w, 0.9))})
    else:
        out.update(weighted_tokens=0, reweighted_share=float("nan"),
                   weight_vs_confidence=float("nan"))
    # median weight along r (relative to CE) by the probability on the label: a focal loss is
    # largest on the hardest tokens, a squared error on probabilities starves confidently wrong
    # ones (the softmax Jacobian vanishes there)
    ce_w = d["gr"] / np.maximum(d["rr"], 1e-300)
    by_conf = {}
    for lo, hi in _CONFIDENCE_BINS:
        sel = use & (p_label >= lo) & (p_label < hi)
        if sel.any():
            by_conf[f"{lo:g}-{hi:g}"] = {"tokens": int(sel.sum()), "weight": float(np.median(ce_w[sel]))}
    out["ce_weight_by_label_probability"] = by_conf
    out["shape"] = name_shape(out, cosine_min, reweighted_max)
    return out


def _family_fit(tot: dict[str, float], max_smoothing: float, max_entropy: float,
                max_zloss: float = 0.0):
    """(a, b, c, zeta, cosine): the best cosine among CE alone and CE with any of smoothing,
    entropy and (when max_zloss > 0) z-loss, from the summed dot products (normal equations),
    keeping only fits with a > 0, 0 <= b/a <= max_smoothing, |c/a| <= max_entropy and
    0 <= zeta/2a <= max_zloss (the z-loss weight w in ce + w·mean(lse²)).

    Near a uniform softmax r, s and e are almost collinear and a free 3-term fit can explain
    other shapes with absurd coefficients (smoothing 0.98); the bounds keep the family to the
    regularisers people use.
    """
    gram = np.array([[tot["rr"], tot["rs"], tot["re"], tot["rz"]],
                     [tot["rs"], tot["ss"], tot["se"], tot["sz"]],
                     [tot["re"], tot["se"], tot["ee"], tot["ez"]],
                     [tot["rz"], tot["sz"], tot["ez"], tot["zz"]]])
    rhs = np.array([tot["gr"], tot["gs"], tot["ge"], tot["gz"]])
    subsets = [[0], [0, 1], [0, 2], [0, 1, 2]]
    if max_zloss > 0:
        subsets += [cols + [3] for cols in subsets]
    best = None
    for cols in subsets:
        sub = np.ix_(cols, cols)
        coef_sub, *_ = np.linalg.lstsq(gram[sub], rhs[cols], rcond=None)
        coef = np.zeros(4)
        coef[cols] = coef_sub
        a, b, c, zeta = (float(x) for x in coef)
        if len(cols) > 1 and (not a > 0 or not 0 <= b / a <= max_smoothing or abs(c / a) > max_entropy
                              or not 0 <= zeta / (2 * a) <= max_zloss):
            continue
        fit_sq = float(coef @ gram @ coef)
        score = _ratio(float(coef @ rhs), np.sqrt(tot["gg"] * fit_sq)) if fit_sq > 0 else float("nan")
        if best is None or score > best[4] + 1e-12:
            best = (a, b, c, zeta, score)
    return best


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    if x.size < 3 or np.all(x == x[0]) or np.all(y == y[0]):
        return float("nan")
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


def name_shape(v: dict[str, Any], cosine_min: float = 0.99, reweighted_max: float = 0.1) -> str:
    """A name for what the gradient looks like (descriptive; the verdict uses profile thresholds)."""
    if v.get("shape") in ("no gradient", "non-finite gradient", "no scored tokens"):
        return v["shape"]
    if not v["coefficients"]["ce"] > 0:
        return "not a likelihood (pushes probability away from the labels)"
    if v["cosine_family"] >= cosine_min and not v["reweighted_share"] > reweighted_max:
        parts = []
        if v["smoothing"] >= 1e-3:
            parts.append(f"label smoothing ε ≈ {v['smoothing']:.3g}")
        if abs(v["entropy_weight"]) >= 1e-3:
            parts.append(f"entropy bonus λ ≈ {v['entropy_weight']:.3g} in ce - λ·entropy")
        if v.get("z_loss_weight", 0.0) >= 1e-5:
            parts.append(f"z-loss w ≈ {v['z_loss_weight']:.3g} in ce + w·mean(lse²)")
        return "likelihood (cross-entropy" + (", " + ", ".join(parts) if parts else "") + ")"
    if v["per_token"]["median"] >= 0.9:  # each token points the likelihood's way; the mix differs
        weights = [b["weight"] for b in v.get("ce_weight_by_label_probability", {}).values()]
        band = v.get("band", 2.0)
        if len(weights) >= 2 and max(weights) > 0:
            top = max(weights)
            if weights[0] < top / band:  # the least confident tokens get a fraction of the peak
                return ("squared error on probabilities (confidently wrong tokens get little gradient, "
                        "most weight goes to middling confidence)")
            if weights[-1] < top / band:
                return "focal-like (down-weights confident tokens)"
        return "a re-weighted likelihood (token weights vary)"
    return "not a likelihood (a different direction per token)"
