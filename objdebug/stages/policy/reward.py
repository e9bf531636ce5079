"""The reward form (`[objective] call = "reward"`): a reward model's loss on the model's real
rewards, in graph mode. Codes OBJ850-OBJ856:

- OBJ850 the loss at equal rewards is its closed form: ln 2 for Bradley-Terry (log(1 + e^margin)
  with a `margin` kwarg), 0 for a regression loss at rewards = scores;
- OBJ851 (pairwise) the loss is lower with the chosen answer's reward above the rejected one's
  than with the two swapped (a loss that exchanges them inside fails);
- OBJ852 one small step along the negative gradient, through the real model, raises
  r_chosen - r_rejected (regression: moves the rewards toward the human scores);
- OBJ853 the reward does not move when padding is appended (a reward read at a padding
  position moves); OBJ854 it moves when each row's last real token is taken away (a reward read
  before it, as pad == eos makes an id-based "last token" do, does not);
- OBJ855 the reward ranks the `[data] scores` rows as the human scores do (core/stats.py, as the
  correlate stage);
- OBJ856 every numeric setting (margin, beta, ...) changes the loss.

Every number comes from the user's loss and model run through MindSpore (reward_session.py);
closed forms and the step's target are references, reported as such.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.core.config import REWARD_CALL
from objdebug.core.findings import Check, Condition, Verdict, listing
from objdebug.core.settings import Settings
from objdebug.pipeline.context import Context
from objdebug.stages.policy.reward_session import PAIRWISE, session

_LISTED = 8
_UNIT = 0.5  # the unit probe point: chosen reward = r + 0.5, rejected = r - 0.5 (a margin of 1)


def _scale(r: np.ndarray) -> float:
    """The rewards' scale for relative tolerances: their spread, never below a tiny floor."""
    r = np.asarray(r, np.float64)
    return max(float(np.std(r)) if r.size > 1 else 0.0, 1e-3 * float(np.mean(np.abs(r))) if r.size else 0.0, 1e-12)


# The stage the reward checks report under; they join the policy stage when it lands (then
# "policy": this constant and the rule pages' `stage:`). Their thresholds stay in the profile's
# own [reward] section whatever the stage (`RewardCheck.run`), so folding them changes no key.
STAGE = "policy"
SECTION = "reward"


class RewardCheck(Check):
    stage = STAGE

    def applies(self, cfg) -> bool:
        """Only the reward call (`[objective] call = "reward"`): in a policy-gradient run these
        checks leave no result."""
        return super().applies(cfg) and cfg.objective.call == REWARD_CALL

    def run(self, ctx: Context, th: Settings):
        return super().run(ctx, ctx.profile.section(SECTION))


# --------------------------------------------------------------------------- zero point
class RewardZeroPoint(RewardCheck):
    """At equal rewards the pairwise loss is its closed form; a regression loss at rewards = scores is 0."""

    name = "reward-zero-point"
    prepare_at = "run"

    def prepare(self, ctx: Context, th: Settings) -> None:
        session(ctx)  # the loss's form and the data: a bad one is exit 2 before any stage

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        s = session(ctx)
        a, b = s.real_inputs()
        if s.form == PAIRWISE:
            margin = s.setting("margin")
            expected = math.log1p(math.exp(margin))
            formula = "ln 2" if margin == 0 else f"log(1 + e^margin), margin {margin:g}"
            out = s.evaluate(a, a)
            how = "rejected reward := chosen reward (the real chosen rewards)"
        else:
            expected, formula = 0.0, "0"
            out = s.evaluate(b, b)
            how = "rewards := human scores"
        losses = out["losses"]
        return {"form": s.form, "probe": how, "formula": formula, "expected": expected,
                "rows": len(a), "batches": len(losses), "batch_size": ctx.engine.batch_size,
                "losses": losses.tolist(), "loss_mean": float(np.mean(losses)),
                "finite": bool(np.all(np.isfinite(losses)))}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        tol = float(th["zero_point_rtol"])

        def value(v):
            what = f"loss at equal rewards ({v['probe']}, {v['rows']} rows, {v['batches']} batches) = {v['loss_mean']:.6g}"
            if not v["finite"]:
                return Verdict.FAIL, what + ": not finite", None
            c = v["expected"]
            losses = np.asarray(v["losses"])
            err = float(np.max(np.abs(losses - c))) / max(abs(c), 1.0)
            if err <= tol:
                closed = v["formula"] if v["formula"] == f"{c:.6g}" else f"{v['formula']} = {c:.6g}"
                return Verdict.PASS, f"{what} = {closed} (max relative error {err:.1e})", v["loss_mean"]
            summed = float(np.max(np.abs(losses - c * v["batch_size"]))) / max(abs(c * v["batch_size"]), 1.0)
            if c != 0 and summed <= tol:
                return Verdict.PASS, (f"{what} = {v['batch_size']} x {v['formula']}: the closed form summed "
                                      "over a batch (reduction 'sum')"), v["loss_mean"]
            kind = ("a Bradley-Terry loss -log sigmoid(r_chosen - r_rejected - margin)" if v["form"] == PAIRWISE
                    else "a regression loss, 0 where the rewards equal the scores")
            return Verdict.FAIL, (f"{what}, expected {v['formula']} = {c:.6g} (relative error {err:.3g}): "
                                  f"the loss is not {kind}; a margin or scale setting it ignores, or "
                                  "an offset, changes this value"), v["loss_mean"]

        return [Condition("OBJ850", "equal_rewards_loss_is_closed_form", value)]


# --------------------------------------------------------------------------- swap
class RewardSwap(RewardCheck):
    """Pairwise: the loss is lower when the chosen answer's reward is the higher one."""

    name = "reward-swap"

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        s = session(ctx)
        if s.form != PAIRWISE:
            return {"form": s.form}
        rc, rr = s.real_inputs()
        base = rc
        up = s.evaluate(base + _UNIT, base - _UNIT)["losses"]
        down = s.evaluate(base - _UNIT, base + _UNIT)["losses"]
        wrong = [k for k, (u, d) in enumerate(zip(up, down)) if not u < d]
        return {"form": s.form, "batches": len(up), "loss_preferred": float(np.mean(up)),
                "loss_swapped": float(np.mean(down)), "mirror": float(np.mean(down - up)),
                "wrong_batches": wrong}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        def judge(v):
            if v["form"] != PAIRWISE:
                return Verdict.SKIP, "not judged: a regression loss (rewards, scores) has no chosen and rejected", None
            what = (f"at a margin of +1 (chosen reward = r + 0.5, rejected = r - 0.5, {v['batches']} batches) "
                    f"the loss is {v['loss_preferred']:.5g}, swapped {v['loss_swapped']:.5g} (swapped - "
                    f"preferred = {v['mirror']:+.4g}; Bradley-Terry without margin: +1)")
            if v["wrong_batches"]:
                return Verdict.FAIL, (f"{what}: the loss is not lower for the preferred order in "
                                      f"{len(v['wrong_batches'])} of {v['batches']} batches: chosen and "
                                      "rejected are exchanged inside the loss"), float(len(v["wrong_batches"]))
            return Verdict.PASS, what, 0.0

        return [Condition("OBJ851", "loss_prefers_higher_chosen_reward", judge)]


# --------------------------------------------------------------------------- one step
class RewardStep(RewardCheck):
    """One small step along the negative gradient raises r_chosen - r_rejected (or moves the
    rewards toward the scores)."""

    name = "reward-step"

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        s = session(ctx)
        batch = s.step_batch()
        g = s.gradient(batch)
        gnorm = math.sqrt(sum(float((x ** 2).sum()) for x in g["grads"]))
        theta = math.sqrt(sum(float((p.data.asnumpy().astype(np.float64) ** 2).sum()) for p in g["params"]))
        rel = float(th["step_rel"])
        n = batch["n"]
        before = [r[:n] for r in g["rewards"]]
        after = before
        if gnorm > 0 and math.isfinite(gnorm):
            with s.stepped(g["params"], g["grads"], rel * theta / gnorm):
                after = [r[:n] for r in s.batch_rewards(batch)]
        out = {"form": s.form, "rows": n, "loss": g["loss"], "grad_norm": gnorm, "param_norm": theta,
               "step_rel": rel}
        if s.form == PAIRWISE:
            m0, m1 = before[0] - before[1], after[0] - after[1]
            out.update(before=float(m0.mean()), after=float(m1.mean()), delta=float((m1 - m0).mean()),
                       up_share=float(np.mean(m1 - m0 > 0)))
        else:
            scores = batch["scores"]
            toward = (after[0] - before[0]) * (scores - before[0])  # > 0: moved toward the score
            out.update(before=float(np.mean((before[0] - scores) ** 2)),
                       after=float(np.mean((after[0] - scores) ** 2)),
                       delta=float(np.mean(toward)), up_share=float(np.mean(toward > 0)))
        return out

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        def judge(v):
            pair = v["form"] == PAIRWISE
            what = (f"one step of {v['step_rel']:.0e} x |theta| along the negative gradient (|g| {v['grad_norm']:.3g}, "
                    f"loss {v['loss']:.5g}, {v['rows']} rows) ")
            if not math.isfinite(v["grad_norm"]):
                return Verdict.FAIL, what + "is not finite", None
            if v["grad_norm"] == 0:
                return Verdict.FAIL, (f"no gradient reaches the reward model (|g| = 0, loss {v['loss']:.5g}): the "
                                      "rewards are detached (stop_gradient) before the loss"), 0.0
            if pair:
                what += (f"moves r_chosen - r_rejected {v['before']:+.5g} -> {v['after']:+.5g} "
                         f"(raised in {v['up_share']:.0%} of the pairs)")
                ok = v["delta"] > 0
                bad = ": the loss trains the reward to prefer the rejected answers"
            else:
                what += (f"moves the squared distance to the human scores {v['before']:.5g} -> {v['after']:.5g} "
                         f"(toward the score in {v['up_share']:.0%} of the rows; reference: numpy)")
                ok = v["delta"] > 0
                bad = ": the loss trains the rewards away from the human scores"
            if ok:
                return Verdict.PASS, what, v["delta"]
            return Verdict.FAIL, what + bad, v["delta"]

        return [Condition("OBJ852", "step_raises_chosen_margin", judge)]


# --------------------------------------------------------------------------- where the reward is read
class RewardReading(RewardCheck):
    """The reward does not move with padding appended, and moves without the last real token."""

    name = "reward-reading"

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        s = session(ctx)
        seqs = s.sequences()
        base = s.rewards(seqs)
        extra = int(th["extra_padding"])
        padded = s.rewards(seqs, extra=extra)
        dropped = s.rewards(seqs, drop_last=True)
        scale = _scale(base)
        moved = np.abs(padded - base)
        # a one-token row has nothing left to read without its last token: not judged there
        same = (np.abs(dropped - base) <= float(th["last_token_rtol"]) * scale) & \
            np.array([x.length >= 2 for x in seqs.samples])
        ids = [x.id for x in seqs.samples]
        out = ctx.target.info.get("contract", {}).get("reward_output", "")
        return {"rows": len(base), "length": s.length, "extra_padding": extra, "scale": scale,
                "output": out, "position": s.position,
                "max_moved": float(np.nanmax(moved)) if moved.size else 0.0,
                "moved_rel": float(np.nanmax(moved)) / scale if moved.size else 0.0,
                "moved_rows": int(np.sum(~(moved <= float(th["padding_rtol"]) * scale))),
                "moved_ids": sorted({i for i, m in zip(ids, moved) if not m <= float(th["padding_rtol"]) * scale}),
                "finite": bool(np.all(np.isfinite(base))),
                "last_token_unchanged": int(same.sum()),
                "unchanged_ids": sorted({i for i, u in zip(ids, same) if u}),
                "max_last_token_change": float(np.max(np.abs(dropped - base))) if base.size else 0.0}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        tol = float(th["padding_rtol"])
        share = float(th["last_token_fail_share"])

        def where(v):
            return (f"model output {'[B]' if v['output'] == 'sequence' else '[B, T] read at the ' + v['position'] + ' real token'}"
                    if v["output"] else "the model's rewards")

        def padding(v):
            if not v["finite"]:
                return Verdict.FAIL, f"the rewards are not finite ({where(v)})", None
            what = (f"{v['extra_padding']} padding tokens appended to {v['rows']} rows (length {v['length']} -> "
                    f"{v['length'] + v['extra_padding']}; {where(v)}) move the reward by at most "
                    f"{v['max_moved']:.3g} ({v['moved_rel']:.2g} x the rewards' spread {v['scale']:.3g})")
            if v["moved_rows"]:
                return Verdict.FAIL, (f"{what}, in {v['moved_rows']} rows ({listing(v['moved_ids'], _LISTED)}): "
                                      "the reward is read at a padding position (the last position of a "
                                      "right-padded row?)"), v["moved_rel"]
            return Verdict.PASS, what + f" (tolerance {tol:g})", v["moved_rel"]

        def last_token(v):
            n, k = v["rows"], v["last_token_unchanged"]
            what = (f"taking each row's last real token away changes the reward of {n - k} of {n} rows "
                    f"(max change {v['max_last_token_change']:.3g}; {where(v)})")
            if not k:
                return Verdict.PASS, what, 0.0
            verdict = Verdict.FAIL if k / n >= share else Verdict.WARN
            return verdict, (f"{what}; {k} rows' reward ignores its last real token "
                             f"({listing(v['unchanged_ids'], _LISTED)}): the reward is read before the "
                             "end of the answer (pad == eos: an id-based last token takes the EOS for "
                             "padding)"), float(k) / n

        return [Condition("OBJ853", "reward_ignores_padding", padding),
                Condition("OBJ854", "reward_reads_last_real_token", last_token)]


# --------------------------------------------------------------------------- human scores
class RewardScores(RewardCheck):
    """The reward ranks the scored rows as the human scores do."""

    name = "reward-scores"

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        from objdebug.core import stats

        s = session(ctx)
        if not s.scored:
            return {"rows": 0}
        r = s.score_rewards()
        y = np.array([row["score"] for row in s.scored], np.float64)
        ok = np.isfinite(r)
        c = stats.correlations(r[ok], y[ok])
        ci = None
        if ok.sum() >= 3 and not stats.is_constant(r[ok]) and not stats.is_constant(y[ok]):
            ci = stats.bootstrap_pearson_ci(r[ok], y[ok], n_resamples=int(th["bootstrap_resamples"]),
                                            level=float(th["ci_level"]), seed=int(th["seed"])).to_dict()
        return {"rows": int(ok.sum()), "nonfinite": int((~ok).sum()), **c.to_dict(), "ci": ci,
                "points": {"x": r.tolist(), "y": y.tolist()}}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        r_pass = float(th["score_r_pass"])
        min_rows = int(th["min_samples"])

        def judge(v):
            if not v["rows"] and not v.get("nonfinite"):
                return Verdict.SKIP, "not judged: no [data] scores (rows with a human score)", None
            if v["rows"] < min_rows:
                return Verdict.SKIP, f"not judged: {v['rows']} scored rows with a finite reward (< {min_rows})", None
            r, ci = v["pearson_r"], v["ci"]
            if ci is None or not math.isfinite(r):
                return Verdict.SKIP, "not judged: the rewards or the scores do not vary", None
            what = (f"Pearson r(reward, human score) = {r:+.3f} over {v['rows']} rows ({ci['level']:.0%} "
                    f"bootstrap interval [{ci['low']:+.2f}, {ci['high']:+.2f}]), Spearman {v['spearman_rho']:+.3f}")
            if ci["high"] < 0:
                return Verdict.FAIL, what + ": the reward ranks the answers backwards (a sign flipped?)", r
            if r >= r_pass and ci["low"] > 0:
                return Verdict.PASS, what, r
            return Verdict.WARN, what + f": below {r_pass} or not distinguishable from 0", r

        return [Condition("OBJ855", f"reward_correlates_with_scores_{r_pass}", judge)]


# --------------------------------------------------------------------------- settings
class RewardSettings(RewardCheck):
    """Each numeric setting of the loss (margin, beta, ...) changes it."""

    name = "reward-settings"

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        s = session(ctx)
        a, b = s.real_inputs()
        points = [(a, b)] + ([(a, a), (a + _UNIT, a - _UNIT)] if s.form == PAIRWISE else [(b + _UNIT, b)])
        rows = []
        keys = s.setting_keys()
        for key in keys:
            old, new, _ = s.changed_kwargs(key)
            rel = []
            base_loss = changed_loss = None
            for x, y in points:
                l0 = s.evaluate(x, y)["losses"]
                l1 = s.evaluate(x, y, setting=key)["losses"]
                base_loss = float(l0.mean()) if base_loss is None else base_loss
                changed_loss = float(l1.mean()) if changed_loss is None else changed_loss
                rel.append(float(np.max(np.abs(l1 - l0)) / max(float(np.max(np.abs(l0))), 1e-12)))
            rows.append({"key": key, "old": old, "new": new, "loss": base_loss, "loss_changed": changed_loss,
                         "max_rel_change": max(rel)})
        return {"settings": rows}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        tol = float(th["setting_rtol"])

        def judge(v):
            rows = v["settings"]
            if not rows:
                return Verdict.SKIP, "not judged: the loss declares no numeric kwargs (margin, beta, ...)", None
            dead = [r for r in rows if not r["max_rel_change"] > tol]
            what = "; ".join(f"{r['key']} {r['old']:g} -> {r['new']:g}: loss {r['loss']:.5g} -> "
                             f"{r['loss_changed']:.5g} (max relative change {r['max_rel_change']:.2g})" for r in rows)
            if dead:
                return Verdict.FAIL, (f"setting(s) {', '.join(r['key'] for r in dead)} do not change the loss: "
                                      f"stored but unused ({what})"), float(len(dead))
            return Verdict.PASS, f"every numeric setting changes the loss ({what})", 0.0

        return [Condition("OBJ856", "reward_settings_change_the_loss", judge)]


def checks() -> list[Check]:
    return [RewardZeroPoint(), RewardSwap(), RewardStep(), RewardReading(), RewardScores(), RewardSettings()]
