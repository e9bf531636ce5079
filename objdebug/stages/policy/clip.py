"""OBJ827 / OBJ828: the clip's measured bounds against the declared epsilon, and its shape (min, a
dual clip, or max).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.core.findings import Condition, Verdict
from objdebug.core.settings import Settings
from objdebug.pipeline.context import Context
from objdebug.stages.policy._common import RATIO_LOW, RATIO_HIGH, RATIO_DUAL, _base, _informative
from objdebug.stages.policy.base import PolicyCheck
from objdebug.stages.policy.session import read_token_gradients, session


class Clip(PolicyCheck):
    """The clip range measured: the ratio at which positive / negative-advantage tokens lose their gradient."""

    name = "policy-clip"

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        s = session(ctx)
        b = s.batches[0]
        base = _base(s, b)
        logits, g0 = base["logits"], base["gz"]["g"]
        info = _informative(s, b, th)
        pos = info & (b.advantages[:, None] > 0)
        neg = info & (b.advantages[:, None] < 0)
        ref = np.abs(base["pol"]["g"][info])
        floor = float(th["gradient_floor"]) * max(float(ref.max()) if ref.size else 0.0, 1e-30)
        calls = [0]

        def live(ratio: float, which: np.ndarray) -> float:
            """share of `which` tokens with a policy gradient at this ratio (old = lp - log ratio)."""
            calls[0] += 1
            out = s.point(b, logits, ratio=ratio)
            g = read_token_gradients(out["dlogits"], logits, b.ids, b.mask)["g"] - g0
            return float(np.mean(np.abs(g[which]) > floor)) if which.any() else math.nan

        shape = {"pos_high": live(RATIO_HIGH, pos), "pos_low": live(RATIO_LOW, pos),
                 "neg_low": live(RATIO_LOW, neg), "neg_high": live(RATIO_HIGH, neg)}
        if not (pos.any() and neg.any()):
            kind = "unmeasured"
        elif shape["pos_high"] == 0 and shape["neg_low"] == 0 and shape["pos_low"] == 1 and shape["neg_high"] == 1:
            kind = "min"
        elif shape["pos_high"] == 1 and shape["neg_low"] == 1 and shape["pos_low"] == 1 and shape["neg_high"] == 1:
            kind = "none"
        elif (shape["pos_high"] == 0 and shape["neg_low"] == 0 and shape["pos_low"] == 1 and shape["neg_high"] == 0
              and live(RATIO_DUAL, neg) == 1):
            # a dual clip (Ye et al. 2019; verl's clip_ratio_c, OpenRLHF's dual_clip): the min, and
            # negative-advantage tokens lose their gradient again beyond a bound c > 1 + epsilon
            kind = "dual-clip"
        elif shape["pos_low"] == 0 and shape["neg_high"] == 0:
            kind = "max"
        else:
            kind = "other"
        high = low = dual = None
        if kind == "dual-clip":
            lo, hi = RATIO_DUAL, RATIO_HIGH
            for _ in range(int(th["clip_bisections"])):
                mid = 0.5 * (lo + hi)
                lo, hi = (mid, hi) if live(mid, neg) == 1 else (lo, mid)
            dual = 0.5 * (lo + hi)
        if kind in ("min", "dual-clip"):
            steps = int(th["clip_bisections"])
            lo, hi = 1.0, RATIO_HIGH
            for _ in range(steps):
                mid = 0.5 * (lo + hi)
                lo, hi = (mid, hi) if live(mid, pos) == 1 else (lo, mid)
            high = 0.5 * (lo + hi) - 1.0
            lo, hi = RATIO_LOW, 1.0
            for _ in range(steps):
                mid = 0.5 * (lo + hi)
                lo, hi = (lo, mid) if live(mid, neg) == 1 else (mid, hi)
            low = 1.0 - 0.5 * (lo + hi)
        dlo, dhi = s.epsilons()
        return {"shape": kind, "probes": shape, "epsilon_low": low, "epsilon_high": high, "dual_clip": dual,
                "declared_low": dlo, "declared_high": dhi, "calls": calls[0],
                "reads_old": s.takes("old_per_token_logps"),
                "positive_tokens": int(pos.sum()), "negative_tokens": int(neg.sum())}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        atol = float(th["epsilon_atol"])

        def bounds(v):
            dlo, dhi, kind = v["declared_low"], v["declared_high"], v["shape"]
            declared = dlo is not None or dhi is not None
            if kind == "unmeasured":
                return Verdict.SKIP, "not judged: the first batch lacks positive or negative advantages", None
            if kind == "none":
                if declared:
                    return Verdict.FAIL, (f"no clip measured (tokens keep their gradient at ratios {RATIO_LOW} and "
                                          f"{RATIO_HIGH}), but epsilon = {dlo if dlo is not None else dhi:g} is declared: "
                                          "the setting is never read"), None
                return Verdict.PASS, ("no clip measured and none declared (an on-policy loss"
                                      + ("" if v["reads_old"] else " that reads no old log-probs") + ")"), None
            if kind not in ("min", "dual-clip"):
                return Verdict.SKIP, f"not judged: the clip's shape is '{kind}' (see OBJ828)", None
            lo, hi = v["epsilon_low"], v["epsilon_high"]
            what = f"clip measured at ratios [1 - {lo:.4f}, 1 + {hi:.4f}]"
            if not declared:
                return Verdict.INFO, what + " (no epsilon declared in kwargs)", hi
            bad = [f"{n} {m:.4f} vs declared {d:g}" for n, m, d in (("low", lo, dlo), ("high", hi, dhi))
                   if d is not None and abs(m - d) > atol]
            if not bad:
                return Verdict.PASS, what + f", as declared (epsilon low {dlo:g}, high {dhi:g})", hi
            return Verdict.FAIL, what + ": " + "; ".join(bad) + ": the loss clips at another range than its setting", hi

        def shape(v):
            kind, p = v["shape"], v["probes"]
            what = (f"share of tokens with a gradient at ratio {RATIO_HIGH} / {RATIO_LOW}: positive advantage "
                    f"{p['pos_high']:.2f} / {p['pos_low']:.2f}, negative {p['neg_high']:.2f} / {p['neg_low']:.2f}")
            if kind == "dual-clip":
                return Verdict.PASS, (what + ": the pessimistic min of the clipped and unclipped terms, with a "
                                      f"dual clip: negative-advantage tokens lose their gradient beyond ratio "
                                      f"{v['dual_clip']:.4g} (they keep it at {RATIO_DUAL:g})"), None
            if kind in ("min", "none"):
                return Verdict.PASS, what + (": the pessimistic min of the clipped and unclipped terms"
                                             if kind == "min" else ": no clip"), None
            if kind == "unmeasured":
                return Verdict.SKIP, "not judged: the first batch lacks positive or negative advantages", None
            if kind == "max":
                return Verdict.FAIL, (what + ": `max` where the pessimistic `min` belongs (the clip removes the "
                                      "gradient on the wrong side of the ratio)"), None
            return Verdict.WARN, what + ": not the shape of a PPO clip", None

        return [Condition("OBJ827", "clip_bounds_match_epsilon", bounds),
                Condition("OBJ828", "clip_is_pessimistic", shape)]
