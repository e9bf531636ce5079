"""OBJ822-OBJ826: the token weights w_t read off d loss / d logits (sign, aggregation, prompt /
padding leaks, missing tokens, the logits' pairing).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.core.findings import Condition, Verdict, listing
from objdebug.core.policy_config import constant_divisor
from objdebug.core.settings import Settings
from objdebug.pipeline.context import Context
from objdebug.stages.policy._common import _base, _dropped, _informative
from objdebug.stages.policy.base import PolicyCheck
from objdebug.stages.policy.session import session


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
