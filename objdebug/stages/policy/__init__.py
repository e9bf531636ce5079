"""The policy stage: a policy-gradient objective (PPO, GRPO, DAPO, Dr. GRPO) with its KL term on
real rollouts, in graph mode, or a reward model's loss (`[objective] call = "reward"`: reward.py,
OBJ850-OBJ856). Opt-in: runs when `[objective] call` is "policy", "policy-model" or "reward".
Codes OBJ820-OBJ849:

- OBJ820 the zero point (on-policy, policy == reference, advantages 0): loss 0;
- OBJ821 the KL estimator measured (k1 / k2 / k3 from the loss at the reference moved by
  +-1 and +-0.5 nats), its sign and direction; OBJ829 a step along -gradient moves the policy
  back toward the reference;
- OBJ822-OBJ826 the token weights w_t read off d loss / d logits (policy term alone: the gradient at
  the real advantages minus the one at advantages 0): sign against the advantage, aggregation and
  length bias against the declared one, gradient on prompt / padding, a completion token (EOS
  included) without gradient, logits paired with the right token;
- OBJ827 the clip's measured bounds against the declared epsilon; OBJ828 its shape (min vs max);
- OBJ830 prompt and padding entries of old / reference log-probs change nothing;
- OBJ831 every numeric setting (beta, epsilon, ...) changes the loss;
- OBJ832 one SGD step on the real model raises positive-advantage completions over negative ones;
- OBJ833 / OBJ834 the user's group_advantages: equal rewards give finite zeros, groups apart;
- OBJ835 a completion truncated to nothing, ratios far outside the clip, float16 logits: finite;
- OBJ836 the gradient accumulated over two micro-batches vs the whole batch (a note for a token mean);
  OBJ835 and OBJ836 run on the rollouts' stored old log-probs where they carry them (on-policy else);
- OBJ837 the rollouts' stored old log-probs carry no systematic mistake (their drift from this
  checkpoint a note; the plain comparison where it is declared to have sampled them) (old_logps.py).

Every number comes from the user's objective run through MindSpore (session.py); objdebug's own
log-probs and the closed forms of the estimators are references, reported as such.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.core.findings import Check, Condition, Verdict, listing
from objdebug.core.policy_config import constant_divisor
from objdebug.core.settings import Settings
from objdebug.pipeline.context import Context
from objdebug.stages.policy.base import PolicyCheck
from objdebug.stages.policy.session import BETA_KEYS, read_token_gradients, session

# the KL estimators at delta = log pi - log ref (per token): the loss ratios L(d) / L(1) identify them
ESTIMATORS = {
    "k1": lambda d: d,
    "k2": lambda d: 0.5 * d * d,
    "k3": lambda d: math.exp(-d) + d - 1.0,
    "k3 with policy and reference exchanged": lambda d: math.exp(d) - d - 1.0,
}
DELTAS = (1.0, -1.0, 0.5, -0.5)
RATIO_LOW, RATIO_HIGH = 0.25, 4.0  # the clip probes: far outside any usual clip range
RATIO_DUAL = 2.0  # beyond the clip, below a dual clip's bound (> 1 + epsilon; verl's default 3)
SETTING_RATIOS = (0.6, 1.5, 8.0)  # the settings probe's ratios, token by token


def _base(s, batch) -> dict[str, Any]:
    """The on-policy, policy == reference point at advantages 0 and at the real ones (cached):
    their token gradients, and the policy term's alone (the difference)."""
    key = ("base", batch.start)
    if key not in s.cache:
        logits = s.probe_logits(batch)
        zero = s.point(batch, logits, adv=np.zeros(len(batch.ids)))
        real = s.point(batch, logits)
        gz = read_token_gradients(zero["dlogits"], logits, batch.ids, batch.mask)
        gr = read_token_gradients(real["dlogits"], logits, batch.ids, batch.mask)
        pol = read_token_gradients(real["dlogits"].astype(np.float64) - zero["dlogits"], logits,
                                   batch.ids, batch.mask)
        s.cache[key] = {"logits": logits, "zero": zero, "real": real, "gz": gz, "gr": gr, "pol": pol}
    return s.cache[key]


def _scorable(s, batch, th) -> np.ndarray:
    """bool[B, T]: completion tokens of real rows whose advantage is not ~0 (each must carry a
    policy gradient, unless its completion is dropped on purpose: `_dropped`)."""
    eps = float(th["advantage_epsilon"])
    rows = np.zeros(len(batch.ids), bool)
    rows[:batch.n] = np.abs(batch.advantages[:batch.n]) > eps
    # a token the model is certain of (p(token) = 1 in float32) carries no gradient in any loss
    unsure = 1.0 - np.exp(s.logps(batch, _base(s, batch)["logits"])) >= float(th["certainty_floor"])
    return batch.mask & rows[:, None] & unsure


def _truncated(s, batch) -> np.ndarray:
    """bool[B]: rows whose completion holds no `[data] eos_id` (cut at the sampler's max length);
    none when no EOS is declared."""
    eos = getattr(s.ctx.config.data, "eos_id", None)
    if eos is None:
        return np.zeros(len(batch.ids), bool)
    comps = [s.rows[k].completion for k in batch.filled[:len(batch.ids)]]
    return np.array([eos not in c for c in comps], bool)


def _dropped(s, batch, th) -> np.ndarray:
    """bool[B]: the truncated completions the loss drops on purpose (DAPO's overlong filtering,
    TRL's `mask_truncated_completions`): every truncated row with a scorable token carries no
    policy gradient at all, while the other rows do; then every truncated row is dropped (those
    with a zero advantage too: the filter is the loss's). Otherwise none (a missing gradient is
    OBJ825's)."""
    key = ("dropped", batch.start)
    if key not in s.cache:
        trunc = _truncated(s, batch)
        info = _scorable(s, batch, th)
        g = _base(s, batch)["pol"]["g"]
        scale = float(np.max(np.abs(g[info]))) if info.any() else 0.0
        carries = np.abs(g) > float(th["gradient_floor"]) * max(scale, 1e-30)
        tested = trunc & info.any(1)
        silent = ~(carries & info).any(1)
        kept = ~trunc & info.any(1)
        on = bool(tested.any() and silent[tested].all() and (~silent[kept]).any())
        s.cache[key] = trunc if on else np.zeros(len(batch.ids), bool)
    return s.cache[key]


def _informative(s, batch, th) -> np.ndarray:
    """bool[B, T]: the scorable tokens of the completions the loss keeps (they must carry a policy
    gradient)."""
    return _scorable(s, batch, th) & ~_dropped(s, batch, th)[:, None]


# --------------------------------------------------------------------------- zero point
class ZeroPoint(PolicyCheck):
    """On-policy, policy == reference, advantages 0: the loss is 0."""

    name = "policy-zero-point"

    def prepare(self, ctx: Context, th: Settings) -> None:
        """The rollouts read and the objective bound before any stage: a bad rollout file or a
        construct parameter that nothing binds ends the run with exit 2 here."""
        if self.skip_reason(ctx) is None:
            session(ctx)

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        s = session(ctx)
        losses, g0 = [], []
        for b in s.batches:
            base = _base(s, b)
            losses.append(base["zero"]["loss"])
            g0.append(float(np.max(np.abs(base["gz"]["g"][b.mask]))) if b.mask.any() else 0.0)
        return {"losses": losses, "max_abs_loss": float(np.max(np.abs(losses))), "batches": len(losses),
                "rollouts": len(s.rows), "groups": len(s.groups), "kl_gradient_max": float(max(g0)),
                "finite": bool(np.all(np.isfinite(losses)))}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        tol = float(th["zero_loss_tolerance"])

        def judge(v):
            what = (f"loss at the zero point (old := policy, reference := policy, advantages 0; "
                    f"{v['rollouts']} rollouts in {v['groups']} groups, {v['batches']} batches): max |loss| "
                    f"{v['max_abs_loss']:.3g}; the KL term's gradient there, per token log-prob: max "
                    f"{v['kl_gradient_max']:.3g} (beta x weight for k1, 0 for k2 / k3)")
            if v["finite"] and v["max_abs_loss"] <= tol:
                return Verdict.PASS, what, v["max_abs_loss"]
            return Verdict.FAIL, (what + f", expected 0 (tolerance {tol:.0e}): the loss does not vanish "
                                  "when the policy has not moved and no completion is better than "
                                  "another (a KL or ratio term computed against something else?)"), v["max_abs_loss"]

        return [Condition("OBJ820", "zero_point_loss_is_zero", judge)]


# --------------------------------------------------------------------------- KL estimator
class KLEstimator(PolicyCheck):
    """The KL term's estimator from the loss at the reference moved by delta nats per token."""

    name = "policy-kl-estimator"

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        s = session(ctx)
        b = s.batches[0]
        logits = _base(s, b)["logits"]
        zero = np.zeros(len(b.ids))
        losses = {d: s.point(b, logits, adv=zero, delta=d)["loss"] for d in DELTAS}
        grads = {}
        for d in (0.5, -0.5):
            out = s.point(b, logits, adv=zero, delta=d)
            g = read_token_gradients(out["dlogits"], logits, b.ids, b.mask)["g"][b.mask]
            grads[d] = float(np.mean(g)) if g.size else 0.0
        l1 = losses[1.0]
        tol = float(th["kl_ratio_tolerance"])
        best, err = None, math.inf
        if abs(l1) > float(th["zero_loss_tolerance"]) and math.isfinite(l1):
            got = np.array([losses[d] / l1 for d in DELTAS[1:]])
            for name, fn in ESTIMATORS.items():
                want = np.array([fn(d) / fn(1.0) for d in DELTAS[1:]])
                e = float(np.max(np.abs(got - want)))
                if e < err:
                    best, err = name, e
        kind = "none" if best is None else (best if err <= tol else "unknown")
        return {"losses": {str(d): losses[d] for d in DELTAS}, "estimator": kind, "closest": best,
                "ratio_error": err if best else None, "sign": (1 if l1 > 0 else -1) if kind != "none" else 0,
                "grad_mean_plus": grads[0.5], "grad_mean_minus": grads[-0.5], "beta": (s.setting(BETA_KEYS) or (None, None))[1]}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        def estimator(v):
            L = v["losses"]
            what = (f"loss at advantages 0, on-policy, reference := policy - delta per completion token: "
                    f"L(+1) {L['1.0']:.5g}, L(-1) {L['-1.0']:.5g}, L(+0.5) {L['0.5']:.5g}, L(-0.5) {L['-0.5']:.5g}")
            kind = v["estimator"]
            if kind == "none":
                if v["beta"]:
                    return Verdict.FAIL, (what + f": no KL term measured although beta = {v['beta']:g} is "
                                          "declared"), 0.0
                return Verdict.PASS, what + ": no KL term (none declared)", 0.0
            if kind == "unknown":
                return Verdict.WARN, (what + f": not one of k1, k2, k3 (closest {v['closest']}, ratio error "
                                      f"{v['ratio_error']:.3g})"), v["ratio_error"]
            if v["sign"] < 0:
                return Verdict.FAIL, (what + f": the KL term ({kind}) enters with a negative sign: the loss "
                                      "rewards moving away from the reference"), v["ratio_error"]
            if kind.startswith("k3 with"):
                return Verdict.FAIL, (what + ": the estimator is k3 with policy and reference exchanged "
                                      "(exp(logp - ref) - (logp - ref) - 1), an estimate of KL(ref || policy), "
                                      "not KL(policy || ref)"), v["ratio_error"]
            return Verdict.PASS, what + f": the {kind} estimator (ratio error {v['ratio_error']:.1e})", v["ratio_error"]

        def direction(v):
            kind = v["estimator"]
            if kind in ("none", "unknown"):
                return Verdict.SKIP, f"not judged: KL estimator {kind}", None
            plus, minus = v["grad_mean_plus"], v["grad_mean_minus"]
            what = (f"d loss / d log p on completion tokens with the policy 0.5 nats above the reference: "
                    f"mean {plus:.3g}; 0.5 below: {minus:.3g}")
            ok = plus > 0 and (kind == "k1" or minus < 0)
            if ok:
                return Verdict.PASS, what + ": a step along -gradient moves the policy back to the reference", plus
            return Verdict.FAIL, (what + ": a step along -gradient moves the policy away from the reference "
                                  "(a KL term with the wrong sign)"), plus

        return [Condition("OBJ821", "kl_estimator", estimator), Condition("OBJ829", "kl_pulls_back", direction)]


# --------------------------------------------------------------------------- token weights
def _classify(w: np.ndarray, rows: np.ndarray, lengths: np.ndarray, n_tokens: float, n_rows: int,
              rtol: float) -> tuple[str, float | None]:
    """The aggregation a set of per-token weights w (tokens of rows `rows`, completion lengths
    `lengths` per row) shows: token-mean, sequence-mean, sum, constant:N or other."""
    if w.size == 0:
        return "unmeasured", None

    def same(x, target):
        return bool(np.all(np.abs(x - target) <= rtol * abs(target)))

    if same(w * n_tokens, 1.0):
        return "token-mean", None
    if same(w * lengths[rows] * n_rows, 1.0):
        return "sequence-mean", None
    if same(w, 1.0):
        return "sum", None
    mid = float(np.median(w))
    if mid > 0 and same(w, mid):
        return "constant", 1.0 / (mid * n_rows)
    return "other", None


class Weights(PolicyCheck):
    """The per-token weights of the policy gradient, read off d loss / d logits."""

    name = "policy-weights"

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        s = session(ctx)
        floor = float(th["gradient_floor"])
        out = {"negative": [], "missing": [], "leaks": [], "batches": [], "paired": 0, "off_by_one": 0,
               "scored_positions": 0, "dropped": []}
        for b in s.batches:
            base = _base(s, b)
            pol, full = base["pol"], base["gr"]
            info = _informative(s, b, th)
            adv = np.broadcast_to(b.advantages[:, None], b.ids.shape)
            g = pol["g"]
            scale = float(np.max(np.abs(g[info]))) if info.any() else 0.0
            w = np.where(info, -g / np.where(info, adv, 1.0), 0.0)
            lengths = b.mask.sum(1).astype(np.float64)
            bi, ti = np.nonzero(info)
            has = np.abs(g[bi, ti]) > floor * max(scale, 1e-30)
            last = {r: int(np.nonzero(b.mask[r])[0][-1]) for r in set(bi.tolist())}
            for r, t, h in zip(bi, ti, has):
                name = f"{b.rows[r].group_id}/{b.rows[r].index}@{t}" + (" (its last token)" if t == last[r] else "")
                if not h:
                    out["missing"].append(name)
                elif w[r, t] < 0:
                    out["negative"].append(name)
            # gradient at positions whose logits predict no completion token (prompt, padding, the end)
            use = np.zeros(b.mask.shape, bool)
            use[:, :-1] = b.mask[:, 1:]
            nmax = float(full["norm"].max()) if full["norm"].size else 0.0
            leak = (~use) & (full["norm"] > float(th["leak_tolerance"]) * max(nmax, 1e-30))
            leak[b.n:] = False
            for r, p in zip(*np.nonzero(leak)):
                kind = "prompt" if p + 1 < b.mask.shape[1] and p + 1 < len(b.rows[r].prompt) else "padding/end"
                out["leaks"].append(f"{b.rows[r].group_id}/{b.rows[r].index}@{p} ({kind})")
            # which token the policy term pairs each position's logits with
            live = use & (pol["norm"] > floor * max(float(pol["norm"].max()), 1e-30))
            live[b.n:] = False
            pr, pp = np.nonzero(live)
            out["scored_positions"] += int(pr.size)
            out["paired"] += int(np.sum(pol["label"][pr, pp] == b.ids[pr, pp + 1]))
            out["off_by_one"] += int(np.sum(pol["label"][pr, pp] == b.ids[pr, pp]))
            sel = info & (np.abs(g) > floor * max(scale, 1e-30))
            rows_sel = np.nonzero(sel)[0]
            dropped = _dropped(s, b, th)  # a token mean is over the tokens the loss keeps
            out["dropped"] += [f"{b.rows[r].group_id}/{b.rows[r].index}" for r in np.nonzero(dropped[:b.n])[0]]
            kept = float(b.mask[~dropped].sum())
            kind, n_const = _classify(w[sel], rows_sel, lengths, kept, len(b.ids),
                                      float(th["aggregation_rtol"]))
            per_row = {}
            for r in sorted(set(rows_sel.tolist())):
                per_row[r] = float(np.mean(w[r][sel[r]]))
            longest = max(per_row, key=lambda r: lengths[r]) if per_row else None
            shortest = min(per_row, key=lambda r: lengths[r]) if per_row else None
            bias = (per_row[longest] / per_row[shortest]) if per_row and per_row[shortest] > 0 else None
            out["batches"].append({"aggregation": kind, "constant": n_const, "length_bias": bias,
                                   "longest": int(lengths[longest]) if longest is not None else None,
                                   "shortest": int(lengths[shortest]) if shortest is not None else None,
                                   "weights": {f"{b.rows[r].group_id}/{b.rows[r].index}": per_row[r]
                                               for r in per_row if r < b.n},
                                   "loss": base["real"]["loss"]})
        out["declared"] = s.policy.aggregation
        kinds = [x["aggregation"] for x in out["batches"]]
        out["aggregation"] = kinds[0] if len(set(kinds)) == 1 else "mixed: " + ", ".join(kinds)
        consts = [x["constant"] for x in out["batches"] if x["constant"] is not None]
        out["constant"] = consts[0] if consts else None
        biases = [x["length_bias"] for x in out["batches"] if x["length_bias"] is not None]
        out["length_bias"] = biases[0] if biases else None
        return out

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        rtol = float(th["aggregation_rtol"])
        min_pair = float(th["pairing_min_share"])

        def sign(v):
            n = len(v["negative"])
            if n == 0:
                return Verdict.PASS, ("every scored completion token's weight w_t (d loss / d log p = -w_t A_t) "
                                      "is positive: the policy moves toward positive advantages"), 0.0
            return Verdict.FAIL, (f"{n} scored completion tokens have a negative weight w_t (the gradient "
                                  f"pushes them against their advantage: a flipped advantage sign, or the ratio "
                                  f"taken old / new): {listing(v['negative'], 6)}"), float(n)

        def aggregation(v):
            kind, c, bias = v["aggregation"], v["constant"], v["length_bias"]
            shown = f"constant:{c:.4g}" if kind == "constant" and c is not None else kind
            b0 = v["batches"][0] if v["batches"] else {}
            what = (f"aggregation measured: {shown}; length bias (per-token weight of the longest completion, "
                    f"{b0.get('longest')} tokens, / the shortest, {b0.get('shortest')}): "
                    + (f"{bias:.3g}" if bias is not None else "n/a"))
            if v.get("dropped"):
                what += (f" (over the tokens it keeps: {len(v['dropped'])} truncated completions, no EOS, "
                         f"dropped by the loss: {listing(v['dropped'], 4)})")
            declared = v["declared"]
            if declared is None:
                return Verdict.INFO, what + " (no [policy] aggregation declared)", bias
            want_c = constant_divisor(declared)
            ok = (kind == declared) or (want_c is not None and kind == "constant" and c is not None
                                        and abs(c - want_c) <= rtol * want_c)
            if ok:
                return Verdict.PASS, what + f", as declared ('{declared}')", bias
            return Verdict.FAIL, what + f", but [policy] aggregation = '{declared}' is declared", bias

        def leaks(v):
            n = len(v["leaks"])
            if n == 0:
                return Verdict.PASS, "no gradient reaches logits at prompt or padding positions", 0.0
            return Verdict.FAIL, (f"{n} prompt / padding positions get a gradient (the mask includes them, or "
                                  f"the KL is taken over them): {listing(v['leaks'], 6)}"), float(n)

        def missing(v):
            n = len(v["missing"])
            if n == 0:
                return Verdict.PASS, "every completion token (EOS included) with a non-zero advantage carries a policy gradient", 0.0
            return Verdict.FAIL, (f"{n} completion tokens with a non-zero advantage carry no policy gradient "
                                  f"(masked out, or a ratio whose old log-prob is the policy's own, not "
                                  f"detached): {listing(v['missing'], 6)}"), float(n)

        def pairing(v):
            n = v["scored_positions"]
            if n == 0:
                return Verdict.SKIP, "not judged: no position carries a policy gradient", None
            share, off = v["paired"] / n, v["off_by_one"] / n
            what = (f"logits[t] paired with input_ids[t+1] at {share:.0%} of {n} scored positions "
                    f"(with input_ids[t]: {off:.0%})")
            if share >= min_pair:
                return Verdict.PASS, what, share
            return Verdict.FAIL, (what + ": the log-probs are gathered one position off (logits[t] must "
                                  "score input_ids[t+1])"), share

        return [Condition("OBJ822", "weights_follow_advantage", sign),
                Condition("OBJ823", "aggregation", aggregation),
                Condition("OBJ824", "no_gradient_on_prompt_or_padding", leaks),
                Condition("OBJ825", "every_completion_token_scored", missing),
                Condition("OBJ826", "logits_paired_with_next_token", pairing)]


# --------------------------------------------------------------------------- clip
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


# --------------------------------------------------------------------------- masking of old / ref
class OutsideEntries(PolicyCheck):
    """Old / reference log-probs at prompt and padding positions change nothing."""

    name = "policy-kl-mask"

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        s = session(ctx)
        b = s.batches[0]
        logits = _base(s, b)["logits"]
        clean = s.point(b, logits, delta=0.5)
        dirty = s.point(b, logits, delta=0.5, outside=float(th["outside_value"]))
        d = float(abs(dirty["loss"] - clean["loss"]))
        dg = float(np.max(np.abs(dirty["dlogits"].astype(np.float64) - clean["dlogits"])))
        return {"loss": clean["loss"], "loss_with_outside": dirty["loss"], "loss_change": d,
                "grad_change": dg, "value": float(th["outside_value"])}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        tol = float(th["zero_loss_tolerance"])

        def judge(v):
            what = (f"old / reference log-probs at prompt and padding positions set to {v['value']:g} instead "
                    f"of 0: loss {v['loss']:.6g} -> {v['loss_with_outside']:.6g}, max logit-gradient change "
                    f"{v['grad_change']:.3g}")
            rel = v["loss_change"] / max(abs(v["loss"]), 1.0)
            if rel <= tol and v["grad_change"] == 0:
                return Verdict.PASS, what + ": they contribute nothing", rel
            return Verdict.FAIL, (what + ": prompt / padding entries enter the loss (a KL or ratio term not "
                                  "masked to completion tokens)"), rel

        return [Condition("OBJ830", "outside_entries_ignored", judge)]


# --------------------------------------------------------------------------- settings
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


# --------------------------------------------------------------------------- one step
class Step(PolicyCheck):
    """One small SGD step on the real model raises positive-advantage completions' log-probs."""

    name = "policy-step"

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        import mindspore as ms

        from objdebug.engine.gradients import model_vjp

        s = session(ctx)
        model = ctx.target.model
        params = list(model.trainable_params())
        total = [np.zeros(p.shape, np.float64) for p in params]
        before, losses = [], []
        temperature = float(th["probe_temperature"])
        for b in s.batches:
            logits = s.probe_logits(b)  # the objective sees the logits / T: d/d raw logits is d/d them / T
            lp = s.logps(b, logits)
            ref = s.reference_logps(b) if s.reference_model is not None else lp
            out = s.evaluate(b, logits, b.advantages, np.where(b.mask, lp, 0.0), np.where(b.mask, ref, 0.0))
            losses.append(out["loss"])
            before.append(lp)
            _, grads = model_vjp(ctx.engine, ctx.target, ms.Tensor(b.model_ids, ms.int32),
                                 ms.Tensor((out["dlogits"] / np.float32(temperature)).astype(np.float32)))
            for k, gr in enumerate(grads):
                total[k] += gr.asnumpy().astype(np.float64)
        gnorm = math.sqrt(sum(float((g * g).sum()) for g in total))
        saved = [p.data.asnumpy().copy() for p in params]
        theta = math.sqrt(sum(float((x.astype(np.float64) ** 2).sum()) for x in saved))
        rel = float(th["step_rel"])
        after = []
        try:
            if gnorm > 0 and math.isfinite(gnorm):
                lr = rel * theta / gnorm
                for p, x, g in zip(params, saved, total):
                    p.set_data(ms.Tensor((x.astype(np.float64) - lr * g).astype(x.dtype)))
            for b in s.batches:
                after.append(s.logps(b, s.probe_logits(b)))
        finally:
            for p, x in zip(params, saved):
                p.set_data(ms.Tensor(x))
        rows = []
        for b, lb, la in zip(s.batches, before, after):
            for r in range(b.n):
                m = b.mask[r]
                if m.any():
                    rows.append({"row": f"{b.rows[r].group_id}/{b.rows[r].index}", "advantage": float(b.advantages[r]),
                                 "delta_logp": float((la[r][m] - lb[r][m]).mean())})
        eps = float(th["advantage_epsilon"])
        pos = [x["delta_logp"] for x in rows if x["advantage"] > eps]
        neg = [x["delta_logp"] for x in rows if x["advantage"] < -eps]
        score = float(sum(x["advantage"] * x["delta_logp"] for x in rows))
        return {"grad_norm": gnorm, "param_norm": theta, "step_rel": rel, "loss": float(np.mean(losses)),
                "positive_mean": float(np.mean(pos)) if pos else None,
                "negative_mean": float(np.mean(neg)) if neg else None,
                "advantage_weighted": score, "rows": rows}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        def judge(v):
            if not (v["grad_norm"] > 0 and math.isfinite(v["grad_norm"])):
                return Verdict.FAIL, f"the policy gets no usable gradient (|g| = {v['grad_norm']:.3g})", None
            if v["positive_mean"] is None or v["negative_mean"] is None:
                return Verdict.SKIP, "not judged: no completions with both positive and negative advantages", None
            what = (f"one step of {v['step_rel']:.0e} x |theta| along -gradient (|g| {v['grad_norm']:.3g}): mean "
                    f"token log-prob change {v['positive_mean']:+.3g} on positive-advantage completions, "
                    f"{v['negative_mean']:+.3g} on negative ones (sum of A x change {v['advantage_weighted']:+.3g})")
            if v["positive_mean"] > v["negative_mean"] and v["advantage_weighted"] > 0:
                return Verdict.PASS, what, v["advantage_weighted"]
            return Verdict.FAIL, what + ": the step trains toward the low-reward completions", v["advantage_weighted"]

        return [Condition("OBJ832", "step_follows_advantage", judge)]


# --------------------------------------------------------------------------- advantages
class Advantages(PolicyCheck):
    """The user's group_advantages: a group of equal rewards gives finite zeros; groups apart."""

    name = "policy-advantages"

    def skip_reason(self, ctx: Context) -> str | None:
        reason = super().skip_reason(ctx)
        if reason:
            return reason
        if ":" not in ctx.config.policy.group_advantages:
            return (f"[policy] group_advantages = '{ctx.config.policy.group_advantages}' is objdebug's own "
                    "reference; the check runs on a user's function ('pkg.mod:fn')")
        return None

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        from objdebug.engine.target import import_factory

        fn = import_factory(ctx.config.policy.group_advantages, "policy.group_advantages", ctx.config.base_dir)
        equal = np.asarray(fn(np.array([[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 1.0]])), np.float64)
        groups = np.array([[0.0, 1.0, 2.0, 4.0], [10.0, 11.0, 12.0, 14.0]])
        together = np.asarray(fn(groups), np.float64)
        apart = np.concatenate([np.asarray(fn(groups[i:i + 1]), np.float64) for i in range(2)])
        return {"equal_group": equal[0].tolist(), "equal_finite": bool(np.all(np.isfinite(equal[0]))),
                "equal_max_abs": float(np.nanmax(np.abs(equal[0]))) if np.isfinite(equal[0]).any() else None,
                "together": together.tolist(), "apart": apart.tolist(),
                "apart_error": float(np.max(np.abs(together - apart)))}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        tol = float(th["advantage_epsilon"])

        def equal(v):
            what = f"advantages of a group of equal rewards [1, 1, 1, 1]: {np.round(v['equal_group'], 6).tolist()}"
            if v["equal_finite"] and (v["equal_max_abs"] or 0.0) <= tol:
                return Verdict.PASS, what + ": finite zeros", 0.0
            return Verdict.FAIL, (what + ": expected finite zeros (std 0: divide by std + eps, or guard it)"), v["equal_max_abs"]

        def apart(v):
            e = v["apart_error"]
            what = f"two groups normalised together vs one at a time: max difference {e:.3g}"
            if math.isfinite(e) and e <= tol:
                return Verdict.PASS, what + ": each group normalised on its own", e
            return Verdict.FAIL, what + ": the advantages depend on the other groups of the batch (normalised across the batch, not per prompt)", e

        return [Condition("OBJ833", "equal_rewards_give_zero", equal),
                Condition("OBJ834", "groups_normalised_apart", apart)]


# --------------------------------------------------------------------------- stress
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


# --------------------------------------------------------------------------- micro-batches
class MicroBatches(PolicyCheck):
    """The gradient accumulated over two micro-batches of different completion lengths vs the whole batch."""

    name = "policy-micro-batches"

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        from objdebug.stages.policy.session import RolloutBatch

        s = session(ctx)
        b = s.batches[0]
        point = s.rollout_inputs(b)  # the rollouts' stored old log-probs where they carry them
        logits, old, ref = point["logits"], point["old"], point["ref"]
        whole = s.evaluate(b, logits, b.advantages, old, ref)
        order = np.argsort(b.mask.sum(1), kind="stable")  # short rows in one micro-batch, long in the other
        half = len(order) // 2
        acc = np.zeros(whole["dlogits"].shape, np.float64)
        tokens = []
        for part in (order[:half], order[half:]):
            sub = RolloutBatch([], 0, b.ids[part], b.model_ids[part], b.mask[part], b.advantages[part], [])
            out = s.evaluate(sub, logits[part], sub.advantages, old[part], ref[part])
            acc[part] += out["dlogits"].astype(np.float64) / 2.0  # loss / accumulation steps, as a trainer does
            tokens.append(int(sub.mask.sum()))
        w = whole["dlogits"].astype(np.float64)
        err = float(np.linalg.norm(acc - w) / max(np.linalg.norm(w), 1e-30))
        return {"relative_difference": err, "micro_batch_tokens": tokens, "declared": s.policy.aggregation,
                "loss": whole["loss"], "old_logps": point["source"]}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        rtol = float(th["aggregation_rtol"])

        def judge(v):
            e, (t1, t2) = v["relative_difference"], v["micro_batch_tokens"]
            what = (f"gradient accumulated over 2 micro-batches ({t1} and {t2} completion tokens; each loss / 2) "
                    f"vs the whole batch: relative difference {e:.3g} (old log-probs: {v['old_logps']})")
            if e <= rtol:
                return Verdict.PASS, what + ": accumulation gives the whole batch's gradient", e
            declared = v["declared"]
            if declared in ("sequence-mean", "sum") or (declared or "").startswith("constant:"):
                return Verdict.FAIL, (what + f": with '{declared}' declared, accumulation should not change the "
                                      "gradient"), e
            return Verdict.INFO, (what + ": each micro-batch normalises by its own token count (a token mean "
                                  "under accumulation weights tokens of short micro-batches more: normalise by "
                                  "the global token count)"), e

        return [Condition("OBJ836", "micro_batch_accumulation", judge)]


def checks() -> list[Check]:
    """The policy-gradient checks (they apply only to the calls "policy" / "policy-model"), then
    the reward form's (only to the call "reward"): `Check.applies` drops the other call's, so a
    run lists only its own call's checks."""
    from objdebug.stages.policy.old_logps import OldLogps
    from objdebug.stages.policy.reward import checks as reward_checks

    return [ZeroPoint(), KLEstimator(), OldLogps(), Weights(), Clip(), OutsideEntries(), Settings_(), Step(),
            Advantages(), MicroBatches(), Stress()] + reward_checks()
