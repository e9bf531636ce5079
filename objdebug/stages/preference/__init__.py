"""Stage 6, preference: a DPO-family objective on real preference pairs, in graph mode. Codes OBJ8xx:

- OBJ801 the loss at a zero margin (policy == reference; SimPO: chosen == rejected) is the
  declared loss type's closed form (ln 2 for sigmoid DPO); OBJ802 the rewards there are 0;
- OBJ803 swapping chosen and rejected flips the returned margins; OBJ804 the loss moves the
  right way (lower when the policy prefers the chosen answer);
- OBJ805 one small step along the negative gradient raises the chosen log-prob relative to the
  rejected one (measured); OBJ806 the reference receives no gradient;
- OBJ807 prompt and padding positions of both answers receive no gradient; OBJ808 pairs with no
  supervised token (after truncation) are named;
- OBJ809 margin vs length-difference correlation; OBJ810 the declared log-prob reduction fits the
  loss type (sum for DPO/hinge, mean for IPO/SimPO);
- OBJ811 every numeric setting (beta, gamma, ...) changes the loss;
- OBJ812 share of pairs whose margin prefers the chosen answer (binomial interval); OBJ813 rank
  correlation of the margin with the annotated `strength`.

Every number comes from the user's objective run through MindSpore (session.py); the
closed forms and objdebug's own implicit margins are references, reported as such.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.pipeline.context import Context
from objdebug.core.findings import Check, Condition, Verdict, listing
from objdebug.core.settings import Settings
from objdebug.stages.preference.session import (EXPECTED_LOGPS, ZERO_POINT, no_preference_reason, preflight,
    session)

_LISTED = 8
_UNIT = 0.5  # the probe point's reference offset: every log-ratio difference becomes 2 * 0.5 = 1 nat


def _finite_max(x: np.ndarray) -> float:
    x = np.asarray(x, np.float64)
    return float(np.max(np.abs(x))) if x.size else 0.0


def _has(x: np.ndarray) -> bool:
    """True when the objective returned rewards (NaN marks 'not returned')."""
    return bool(np.asarray(x).size) and not bool(np.all(np.isnan(x)))


def _unit_point(inputs):
    """A probe point from real policy log-probs whose every margin is +1 nat (logps form only)."""
    pc, pr, _, _ = inputs
    return pc, pr, pc - _UNIT, pr + _UNIT


def _swapped(inputs):
    pc, pr, rc, rr = inputs
    return pr, pc, rr, rc


class PreferenceCheck(Check):
    stage = "preference"

    def prepare(self, ctx: Context, th) -> None:
        """Before any stage: a max_length that leaves no pair an answer token is exit 2."""
        if no_preference_reason(ctx) is None:
            preflight(ctx, th)

    def skip_reason(self, ctx: Context) -> str | None:
        return no_preference_reason(ctx)


# --------------------------------------------------------------------------- zero point
class ZeroPoint(PreferenceCheck):
    """The loss at a zero margin equals the loss type's closed form; the rewards there are 0."""

    name = "zero-point"

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        s = session(ctx)
        kind = s.spec.loss_type
        beta, gamma = s.setting("beta"), s.setting("gamma")
        formula, fn = ZERO_POINT[kind]
        need = {"ipo": beta, "simpo": gamma}.get(kind, 0.0)
        expected = fn(beta, gamma) if need is not None else None
        if kind == "simpo":  # reference-free: a zero margin means chosen == rejected
            how = "rejected answer := chosen answer"
            if s.form == "preference":
                pc, _, rc, _ = s.real_inputs()
                out = s.evaluate((pc, pc, rc, rc))
            else:
                out = s.evaluate(same=True)
        else:
            how = "reference := policy"
            if s.form == "preference":
                pc, pr, _, _ = s.real_inputs()
                out = s.evaluate((pc, pr, pc, pr))
            else:
                with s.reference_as_policy():
                    out = s.evaluate()
        losses = out["losses"]
        rewards = np.concatenate([out["cr"], out["rj"]])
        return {"loss_type": kind, "formula": formula, "expected": expected, "beta": beta, "gamma": gamma,
                "probe": how, "pairs": len(s.pairs), "batches": len(losses), "batch_size": ctx.engine.batch_size,
                "losses": losses.tolist(), "loss_mean": float(np.mean(losses)),
                "finite": bool(np.all(np.isfinite(losses))),
                "rewards_returned": _has(rewards), "max_abs_reward": _finite_max(rewards) if _has(rewards) else None}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        tol = float(th["zero_point_rtol"])
        rtol = float(th["zero_reward_tolerance"])

        def value(v):
            what = (f"loss at the zero margin ({v['probe']}, {v['pairs']} real pairs, {v['batches']} "
                    f"batches) = {v['loss_mean']:.6g}")
            if not v["finite"]:
                return Verdict.FAIL, what + ": not finite", None
            c = v["expected"]
            if c is None:
                return Verdict.SKIP, (what + f"; not judged: the closed form {v['formula']} needs a "
                                      "declared setting (kwargs beta / gamma)"), v["loss_mean"]
            losses = np.asarray(v["losses"])
            err = float(np.max(np.abs(losses - c))) / max(abs(c), 1.0)
            if err <= tol:
                return Verdict.PASS, (what + f" = {v['formula']} = {c:.6g} for loss_type "
                                      f"'{v['loss_type']}' (max relative error {err:.1e})"), v["loss_mean"]
            summed = float(np.max(np.abs(losses - c * v["batch_size"]))) / max(abs(c * v["batch_size"]), 1.0)
            if summed <= tol:
                return Verdict.PASS, (what + f" = {v['batch_size']} x {v['formula']}: the closed form "
                                      "summed over the pairs of a batch (reduction 'sum')"), v["loss_mean"]
            return Verdict.FAIL, (what + f", expected {v['formula']} = {c:.6g} for loss_type "
                                  f"'{v['loss_type']}' (relative error {err:.3g}): the objective does "
                                  "not reduce to its loss type when the policy has not moved"), v["loss_mean"]

        def rewards(v):
            if v["loss_type"] == "simpo":
                return Verdict.SKIP, ("not judged: SimPO's rewards are beta x the policy's mean "
                                      "log-prob, not 0, at its zero margin"), None
            if not v["rewards_returned"]:
                return Verdict.SKIP, "not judged: the objective returns no rewards", None
            x = v["max_abs_reward"]
            if x is not None and math.isfinite(x) and x <= rtol:
                return Verdict.PASS, f"rewards at policy == reference are 0 (max |reward| {x:.2g})", x
            return Verdict.FAIL, (f"rewards at policy == reference are not 0: max |reward| = {x:.4g} "
                                  f"(tolerance {rtol:.0e}): they are not policy-minus-reference "
                                  "log-ratios"), x

        return [Condition("OBJ801", "zero_margin_loss_is_closed_form", value),
                Condition("OBJ802", "zero_margin_rewards_are_zero", rewards)]


# --------------------------------------------------------------------------- symmetry
class Symmetry(PreferenceCheck):
    """Swapping chosen and rejected flips every margin; the loss moves the right way."""

    name = "symmetry"

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        s = session(ctx)
        eps = float(th["margin_epsilon"])
        points = []
        if s.form == "preference":
            real = s.real_inputs()
            for label, inputs in (("real pairs", real), ("unit-margin probe", _unit_point(real))):
                points.append(self._point(s, label, s.evaluate(inputs), s.evaluate(_swapped(inputs)),
                                          s.implicit_margins(inputs), eps))
        else:
            points.append(self._point(s, "real pairs", s.evaluate(), s.evaluate(swap=True),
                                      s.implicit_margins(), eps))
        return {"points": points, "rewards_returned": any(p["rewards_returned"] for p in points),
                "pairs": len(s.pairs)}

    @staticmethod
    def _point(s, label, orig, swap, implicit, eps) -> dict[str, Any]:
        m, ms_ = orig["cr"] - orig["rj"], swap["cr"] - swap["rj"]
        returned = _has(m)
        flip = float(np.max(np.abs(m + ms_)) / max(_finite_max(m), 1e-12)) if returned else None
        # per batch: which answer the loss type prefers (objdebug's margin) vs how the loss moved
        rows = []
        for k, b in enumerate(s.batches):
            mean = float(np.mean(implicit[b.start:b.start + b.n]))
            if abs(mean) <= eps:
                continue
            delta = float(swap["losses"][k] - orig["losses"][k])
            rows.append({"batch": k, "mean_margin": mean, "loss": float(orig["losses"][k]),
                         "loss_swapped": float(swap["losses"][k]), "right": bool(delta * mean > 0)})
        return {"point": label, "rewards_returned": returned, "max_flip_error": flip,
                "returned_margin_mean": float(np.nanmean(m)) if returned else None,
                "informative_batches": len(rows), "wrong_batches": [r["batch"] for r in rows if not r["right"]],
                "batches": rows}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        tol = float(th["flip_tolerance"])

        def flips(v):
            pts = [p for p in v["points"] if p["rewards_returned"]]
            if not pts:
                return Verdict.SKIP, "not judged: the objective returns no rewards (see OBJ804 for the loss)", None
            worst = max(p["max_flip_error"] for p in pts)
            what = "; ".join(f"{p['point']}: max |m + m_swapped| / max |m| = {p['max_flip_error']:.2g}"
                             for p in pts)
            if math.isfinite(worst) and worst <= tol:
                return Verdict.PASS, f"swapping chosen and rejected flips every returned margin ({what})", worst
            return Verdict.FAIL, (f"swapping chosen and rejected does not flip the returned margins "
                                  f"({what}; tolerance {tol:.0e})"), worst

        def moves(v):
            rows = [dict(r, point=p["point"]) for p in v["points"] for r in p["batches"]]
            if not rows:
                return Verdict.SKIP, ("not judged: every margin is 0 (the policy equals the reference); "
                                      "give a [reference] checkpoint that differs from the policy"), None
            wrong = [r for r in rows if not r["right"]]
            ex = wrong[0] if wrong else rows[0]
            what = (f"e.g. {ex['point']} batch {ex['batch']}: mean margin {ex['mean_margin']:+.4g}, loss "
                    f"{ex['loss']:.5g} -> {ex['loss_swapped']:.5g} swapped")
            if wrong:
                return Verdict.FAIL, (f"the loss moves the wrong way in {len(wrong)} of {len(rows)} batches "
                                      f"when chosen and rejected are swapped ({what}): the objective "
                                      "rewards the rejected answer"), float(len(wrong))
            return Verdict.PASS, (f"the loss is lower for the preferred order in all {len(rows)} batches "
                                  f"({what})"), 0.0

        return [Condition("OBJ803", "swap_flips_margins", flips),
                Condition("OBJ804", "loss_prefers_chosen", moves)]


# --------------------------------------------------------------------------- direction + masking
def _gradient(ctx: Context) -> dict[str, Any]:
    s = session(ctx)
    return ctx.provide(_gradient, lambda: s.gradient(s.batches[0]))


class Direction(PreferenceCheck):
    """A small step along the negative gradient raises log p(chosen) - log p(rejected)."""

    name = "direction"

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        import mindspore as ms

        s = session(ctx)
        g = _gradient(ctx)
        grads = {id(p): gr for p, gr in zip(g["params"], g["grads"])}
        policy = s.policy_params()
        batch = s.batches[0]
        gp = [grads.get(id(p)) for p in policy]
        gp = [np.zeros(p.shape, np.float32) if x is None else x for p, x in zip(policy, gp)]
        gnorm = math.sqrt(sum(float((x.astype(np.float64) ** 2).sum()) for x in gp))
        saved = [p.data.asnumpy().copy() for p in policy]
        theta = math.sqrt(sum(float((x.astype(np.float64) ** 2).sum()) for x in saved))
        rel = float(th["step_rel"])
        before = self._margins(s, batch)
        after = before
        if gnorm > 0 and math.isfinite(gnorm):
            lr = rel * theta / gnorm
            try:
                for p, x, gr in zip(policy, saved, gp):
                    p.set_data(ms.Tensor((x.astype(np.float64) - lr * gr).astype(x.dtype)))
                after = self._margins(s, batch, fresh=True)
            finally:
                for p, x in zip(policy, saved):
                    p.set_data(ms.Tensor(x))
        delta = after - before
        ref_ids = s.reference_param_ids()
        ref_rows = [{"name": p.name, "norm": float(np.sqrt((gr.astype(np.float64) ** 2).sum()))}
                    for p, gr in zip(g["params"], g["grads"]) if id(p) in ref_ids]
        frozen = [p.name for p in s.reference_model.get_parameters() if not p.requires_grad]
        return {"form": s.form, "loss": g["loss"], "pairs": batch.n, "grad_norm": gnorm, "param_norm": theta,
                "step_rel": rel, "margin_before": float(before.mean()), "margin_after": float(after.mean()),
                "delta_mean": float(delta.mean()), "delta_up_share": float(np.mean(delta > 0)),
                "reduction": s.spec.logps,
                "reference_in_graph": s.form == "preference-pairs", "reference_params": len(ref_rows),
                "reference_frozen": len(frozen),
                "reference_with_grad": [r["name"] for r in ref_rows if r["norm"] > 0 or not math.isfinite(r["norm"])],
                "reference_grad_norm": math.sqrt(sum(r["norm"] ** 2 for r in ref_rows)) if ref_rows else 0.0}

    @staticmethod
    def _margins(s, batch, fresh: bool = False) -> np.ndarray:
        """Policy log p(chosen) - log p(rejected) per pair of the batch (declared reduction)."""
        if fresh:  # the policy has moved: recompute this batch only, leave the cache alone
            pc, pr = s.logps_of("policy", [batch]).reduced(s.mean)
            return pc - pr
        pc, pr = s.logps("policy").reduced(s.mean)
        return (pc - pr)[batch.start:batch.start + batch.n]

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        def direction(v):
            what = (f"one step of {v['step_rel']:.0e} x |theta| along the negative gradient (|g| "
                    f"{v['grad_norm']:.3g}, loss {v['loss']:.5g}, {v['pairs']} pairs) moves log p(chosen) - "
                    f"log p(rejected) ({v['reduction']}) by {v['delta_mean']:+.3g} on average "
                    f"({v['margin_before']:.4g} -> {v['margin_after']:.4g}; up in {v['delta_up_share']:.0%} of pairs)")
            if not (v["grad_norm"] > 0 and math.isfinite(v["grad_norm"])):
                return Verdict.FAIL, (f"the policy gets no usable gradient (|g| = {v['grad_norm']:.3g}, "
                                      f"loss {v['loss']:.5g})"), v["grad_norm"]
            if v["delta_mean"] > 0:
                return Verdict.PASS, what, v["delta_mean"]
            return Verdict.FAIL, (what + ": training lowers the chosen answer relative to the rejected "
                                  "one (chosen and rejected swapped in the objective?)"), v["delta_mean"]

        def reference(v):
            if not v["reference_in_graph"]:
                return Verdict.PASS, ("the reference log-probs enter the loss as inputs from a separate "
                                      "graph without gradient (call = \"preference\")"), 0.0
            names = v["reference_with_grad"]
            if names:
                return Verdict.FAIL, (f"{len(names)} of {v['reference_params']} trainable reference "
                                      f"parameters receive gradient (norm {v['reference_grad_norm']:.3g}): "
                                      f"{listing(names, _LISTED)}; an optimizer would move the reference"
                                      ), float(len(names))
            return Verdict.PASS, (f"the reference receives no gradient ({v['reference_params']} trainable "
                                  f"reference parameters at exactly 0, {v['reference_frozen']} frozen)"), 0.0

        return [Condition("OBJ805", "step_raises_chosen_over_rejected", direction),
                Condition("OBJ806", "reference_gets_no_gradient", reference)]


class Masking(PreferenceCheck):
    """Prompt and padding positions of both answers get no gradient (the OBJ205 idea for pairs)."""

    name = "masking"

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        s = session(ctx)
        g = _gradient(ctx)
        # by identity: a pairs Cell prefixes the probe's name with its own attribute names
        probe = next(gr for p, gr in zip(g["params"], g["grads"]) if p is s.policy.probe)
        sq = probe.astype(np.float64)[..., 0] ** 2              # [B, T]: (sum_v dL/dx_v * x_v)^2
        b = s.batches[0]
        # the logit positions each answer scores (its labels in their layout, `label_offset`)
        c_scored, r_scored = s.scored_logits(b.c_labels), s.scored_logits(b.r_labels)
        # masked in both answers: the shared prompt, and the padding after both answers
        masked = ~c_scored & ~r_scored
        tol = float(th["leak_tolerance"])
        ids = []
        counts = {"prompt": [0, 0], "padding": [0, 0]}   # [positions, leaking]
        # a pair whose loss is saturated (sigmoid(-beta h) == 0 in float32) has no gradient at
        # all: it can show no leak, so only pairs with gradient at their scored positions count
        informative = [i for i in range(b.n) if np.nansum(sq[i][c_scored[i] | r_scored[i]]) > 0]
        for i in informative:
            scored = np.nonzero(c_scored[i] | r_scored[i])[0]
            first = int(scored[0]) if scored.size else b.c_ids.shape[1]
            for t in np.nonzero(masked[i])[0]:
                leak = not sq[i, t] <= tol * tol          # NaN counts as a leak
                kind = "prompt" if t < first else "padding"
                counts[kind][0] += 1
                counts[kind][1] += int(leak)
                if leak:
                    ids.append(b.rows[i]["id"])
        real = slice(0, b.n)
        return {"pairs": b.n, "informative_pairs": len(informative), "prompt_positions": counts["prompt"][0], "prompt_leaking": counts["prompt"][1],
                "padding_positions": counts["padding"][0], "padding_leaking": counts["padding"][1],
                "leaking_ids": sorted(set(ids)), "tolerance": tol,
                "probe_reached": bool(informative),
                "max_masked_norm": float(np.sqrt(np.nanmax(sq[real][masked[real]]))) if masked[real].any() else 0.0}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        def leak(v):
            if not v["probe_reached"]:
                return Verdict.SKIP, ("not judged: no gradient reached the policy's logits through the "
                                      "probe (the objective calls the policy with another batch shape?)"), None
            n = v["prompt_leaking"] + v["padding_leaking"]
            what = (f"{v['prompt_leaking']} of {v['prompt_positions']} prompt positions and "
                    f"{v['padding_leaking']} of {v['padding_positions']} padding positions (masked in both "
                    f"answers; {v['informative_pairs']} of {v['pairs']} pairs with gradient) receive gradient "
                    f"(max |gradient| {v['max_masked_norm']:.3g})")
            if n:
                return Verdict.FAIL, (what + f" in pairs {listing(v['leaking_ids'], _LISTED)}: the sequence "
                                      "log-probs include tokens that are not the answer"), float(n)
            return Verdict.PASS, what, 0.0

        return [Condition("OBJ807", "masked_positions_get_no_gradient", leak)]


class EmptyPairs(PreferenceCheck):
    """Pairs with no supervised token in an answer (after truncation) are named."""

    name = "empty-pairs"

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        s = session(ctx)
        pid = s.label_pad_id
        empty, bad_batches = [], []
        for b in s.batches:
            c, r = (b.c_labels[:b.n] != pid).sum(1), (b.r_labels[:b.n] != pid).sum(1)
            rows = [{"id": row["id"], "chosen_tokens": int(nc), "rejected_tokens": int(nr),
                     "truncated": bool(row.get("truncated"))}
                    for row, nc, nr in zip(b.rows, c, r) if nc == 0 or nr == 0]
            empty += rows
            if rows:
                bad_batches.append(b)
        finite = True
        if empty:  # the objective on their batches: a length-normalized loss may divide by 0 there
            losses = s.evaluate()["losses"]
            finite = bool(np.all(np.isfinite([losses[s.batches.index(b)] for b in bad_batches])))
        return {"total_pairs": len(s.pairs), "max_length": int(th["max_length"]),
                "truncated": sum(bool(p.get("truncated")) for p in s.pairs), "empty": empty,
                "loss_finite": finite}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        def empty(v):
            rows = v["empty"]
            limit = v["max_length"] or "none"
            if not rows:
                return Verdict.PASS, (f"all {v['total_pairs']} pairs have supervised tokens in both answers "
                                      f"(max_length {limit}, {v['truncated']} truncated)"), 0.0
            ids = [f"{r['id']} ({r['chosen_tokens']}/{r['rejected_tokens']})" for r in rows]
            what = (f"{len(rows)} of {v['total_pairs']} pairs have an answer with no supervised token "
                    f"after truncation to max_length {limit} (chosen/rejected tokens): {listing(ids, _LISTED)}")
            if not v["loss_finite"]:
                return Verdict.FAIL, what + "; the loss is not finite on their batches", float(len(rows))
            return Verdict.WARN, what + "; they carry no preference signal", float(len(rows))

        return [Condition("OBJ808", "pairs_have_supervised_tokens", empty)]


# --------------------------------------------------------------------------- length
class Length(PreferenceCheck):
    """Margin vs length difference; the declared log-prob reduction vs the loss type."""

    name = "length"

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        from objdebug.core.stats import correlations

        s = session(ctx)
        lp = s.logps("policy")
        diff = lp.c_count - lp.r_count
        m = s.implicit_margins()
        c = correlations(m, diff)
        informative = math.isfinite(c.pearson_r)
        return {"pairs": len(m), "loss_type": s.spec.loss_type, "declared": s.spec.logps,
                "expected": EXPECTED_LOGPS[s.spec.loss_type], "form": s.form,
                "mean_length_difference": float(diff.mean()),
                "pearson": c.pearson_r if informative else None,
                "spearman": c.spearman_rho if informative else None}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        warn = float(th["length_corr_warn"])
        biased = Verdict.from_setting(th["length_bias"], "[preference] length_bias")
        mismatch = {"mean": Verdict.from_setting(th["mean_for_summed_loss"],
                                                 "[preference] mean_for_summed_loss"),
                    "sum": Verdict.from_setting(th["sum_for_mean_loss"],
                                                "[preference] sum_for_mean_loss")}

        def corr(v):
            r = v["pearson"]
            if r is None or not math.isfinite(r):
                return Verdict.SKIP, ("not judged: the margins (or the length differences) do not vary "
                                      "(policy equal to the reference?)"), None
            verdict = Verdict.PASS if abs(r) < warn else biased
            return verdict, (f"margin vs chosen-minus-rejected length (objdebug's implicit margin, "
                             f"{v['declared']} log-probs, {v['pairs']} pairs): Pearson r = {r:+.3f}, "
                             f"Spearman {v['spearman']:+.3f} (mean length difference "
                             f"{v['mean_length_difference']:+.1f} tokens); warn at |r| >= {warn}"), r

        def reduction(v):
            if v["declared"] == v["expected"]:
                return Verdict.PASS, (f"logps = '{v['declared']}' fits loss_type '{v['loss_type']}' "
                                      f"(derived for {v['expected']}med log-probs)"), 0.0
            why = {"ipo": "IPO regresses the margin onto 1/(2 beta), a per-token scale: summed log-probs "
                          "grow with the answer length and miss it (trl PR 1265)",
                   "simpo": "SimPO's gamma is a per-token margin: summed log-probs scale the margin with "
                            "the answer length",
                   }.get(v["loss_type"], "the derivation uses the sequence log-likelihood (a sum): a mean "
                                         "rescales beta by the answer length")
            return mismatch[v["declared"]], (f"logps = '{v['declared']}' but loss_type "
                                             f"'{v['loss_type']}' expects '{v['expected']}': {why}"), 1.0

        return [Condition("OBJ809", f"length_corr_below_{warn}", corr),
                Condition("OBJ810", "logps_reduction_fits_loss_type", reduction)]


# --------------------------------------------------------------------------- settings
class SettingsMatter(PreferenceCheck):
    """Each numeric setting of the objective (beta, gamma, ...) changes the loss."""

    name = "settings"

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        s = session(ctx)
        rows = []
        base_points = self._points(s, None)
        for key in s.setting_keys():
            old, new, changed = s.changed_kwargs(key)
            points = self._points(s, changed, key)
            rel = [float(np.max(np.abs(b - a)) / max(float(np.max(np.abs(a))), 1e-12))
                   for a, b in zip(base_points, points)]
            rows.append({"key": key, "old": old, "new": new, "loss": float(base_points[0].mean()),
                         "loss_changed": float(points[0].mean()), "max_rel_change": max(rel)})
        return {"settings": rows, "form": s.form}

    @staticmethod
    def _points(s, kwargs, key: str = "") -> list[np.ndarray]:
        """Batch losses at the probe points (real pairs; for the logps form also the unit margin).
        The logps form reads the variant off the loss's own graph (`Session.losses_cell`)."""
        if s.form == "preference":
            setting = key if kwargs is not None else None
            real = s.real_inputs()
            return [s.evaluate(real, setting=setting)["losses"],
                    s.evaluate(_unit_point(real), setting=setting)["losses"]]
        if kwargs is None:
            return [s.evaluate()["losses"]]
        from objdebug.stages.preference.session import _copy_model, build_pairs_objective
        from objdebug.stages.preference.cells import PairsObjective, ProbedPolicy

        policy = ProbedPolicy(_copy_model(s.ctx, s.policy.model), s.ctx.engine.batch_size, s.length)
        cell = PairsObjective(build_pairs_objective(s.ctx, kwargs, policy, _copy_model(s.ctx, s.reference_model)))
        return [s.evaluate(cell=cell, name=f"preference.settings.{key}")["losses"]]

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        tol = float(th["setting_rtol"])

        def judge(v):
            rows = v["settings"]
            if not rows:
                return Verdict.SKIP, "not judged: the objective declares no numeric kwargs (beta, gamma, ...)", None
            dead = [r for r in rows if not r["max_rel_change"] > tol]
            what = "; ".join(f"{r['key']} {r['old']:g} -> {r['new']:g}: loss {r['loss']:.5g} -> "
                             f"{r['loss_changed']:.5g} (max relative change {r['max_rel_change']:.2g})"
                             for r in rows)
            if dead:
                return Verdict.FAIL, (f"setting(s) {', '.join(r['key'] for r in dead)} do not change the "
                                      f"loss: stored but unused ({what})"), float(len(dead))
            return Verdict.PASS, f"every numeric setting changes the loss ({what})", 0.0

        return [Condition("OBJ811", "settings_change_the_loss", judge)]


# --------------------------------------------------------------------------- agreement
class Agreement(PreferenceCheck):
    """Share of pairs whose margin prefers the chosen answer; rank correlation with `strength`."""

    name = "agreement"

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        from scipy import stats as st

        s = session(ctx)
        out = s.evaluate()
        returned = _has(out["cr"])
        m = out["cr"] - out["rj"] if returned else s.implicit_margins()
        eps = float(th["margin_epsilon"])
        n = len(m)
        k = int(np.sum(m > eps))
        moved = bool(np.max(np.abs(m)) > eps) if n else False
        level = float(th["ci_level"])
        ci = st.binomtest(k, n).proportion_ci(confidence_level=level, method="exact") if n else None
        strength = np.array([p["strength"] if p["strength"] is not None else np.nan for p in s.pairs])
        has_s = ~np.isnan(strength)
        rho = p = None
        if has_s.sum() >= 3 and np.std(strength[has_s]) > 0 and np.std(m[has_s]) > 0:
            res = st.spearmanr(m[has_s], strength[has_s])
            rho, p = float(res.statistic), float(res.pvalue)
        return {"pairs": n, "agree": k, "share": k / n if n else float("nan"), "moved": moved,
                "ci_low": float(ci.low) if ci else None, "ci_high": float(ci.high) if ci else None,
                "ci_level": level, "source": "rewards returned by the objective" if returned
                else "objdebug's implicit margin", "mean_margin": float(np.mean(m)) if n else None,
                "strength_pairs": int(has_s.sum()), "spearman": rho, "p_value": p,
                "margins": m.tolist(), "ids": [p_["id"] for p_ in s.pairs]}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        low = Verdict.from_setting(th["low_agreement"], "[preference] low_agreement")
        alpha = float(th["strength_alpha"])

        def share(v):
            if not v["moved"]:
                return Verdict.SKIP, ("not judged: every margin is 0: the policy equals the reference "
                                      "(start of training); give a trained policy or another [reference] "
                                      "checkpoint"), None
            what = (f"{v['agree']} of {v['pairs']} pairs ({v['share']:.0%}) have a margin that prefers "
                    f"the chosen answer ({v['source']}; {v['ci_level']:.0%} Clopper-Pearson interval "
                    f"[{v['ci_low']:.2f}, {v['ci_high']:.2f}], mean margin {v['mean_margin']:+.4g})")
            if v["ci_low"] > 0.5:
                return Verdict.PASS, what, v["share"]
            if v["ci_high"] < 0.5:
                return low, (what + ": the implicit reward prefers the rejected answers (swapped data "
                             "or rewards?)"), v["share"]
            return Verdict.INFO, what + ": not distinguishable from chance on these pairs", v["share"]

        def strength(v):
            if v["spearman"] is None:
                why = ("no pair has a 'strength'" if not v["strength_pairs"] else
                       "the margins or strengths do not vary")
                return Verdict.SKIP, f"not judged: {why}", None
            what = (f"Spearman rho(margin, strength) = {v['spearman']:+.3f} over {v['strength_pairs']} "
                    f"pairs (p = {v['p_value']:.2g})")
            if v["spearman"] > 0 and v["p_value"] < alpha:
                return Verdict.PASS, what, v["spearman"]
            if v["spearman"] < 0 and v["p_value"] < alpha:
                return Verdict.WARN, what + ": larger annotated preferences get smaller margins", v["spearman"]
            return Verdict.INFO, what + f": not significant at {alpha}", v["spearman"]

        return [Condition("OBJ812", "margins_prefer_chosen", share),
                Condition("OBJ813", "margin_ranks_with_strength", strength)]


def checks() -> list[Check]:
    return [ZeroPoint(), Symmetry(), Direction(), Masking(), EmptyPairs(), Length(), SettingsMatter(), Agreement()]
