"""OBJ705 settings that do nothing: each numeric or boolean setting of the objective must matter.

Every keyword of `[objective] kwargs`, and every keyword parameter of the objective's factory with
a default (when `inspect.signature` can read it), is perturbed one at a time; the objective is
rebuilt from its factory with that one change and run on the batch. A setting whose change leaves
loss and logit gradient bit-identical is named (ms-swift PR 10167: `loss_type` ignored; minimind
140: an auxiliary loss weight whose term was never added).

Perturbations, chosen to matter on any real batch for a setting that is used:
- bool: flipped; float 0: 0.1 (turns a term on); other floats: halved (|x| <= 1) or doubled;
- int: +1 (names with "index", "id" or "size" excepted: see below);
- `reduction`: "mean" <-> "sum" (same shape).
Not testable, and listed as such: `ignore_index`-like settings (they only matter where the labels
contain the new value, and there the old one would be scored as an out-of-range class), other
strings (their allowed values are unknown; "none" changes the output's shape), None and tensors,
and any setting whose perturbed objective cannot be built or run.

Graphs: `invariants.logit_grad[<setting>=<value>]` at the batch shape, one per perturbed setting
(shared with OBJ703's reduction / smoothing variants).
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from objdebug.pipeline.context import Context
from objdebug.core.findings import Check, Condition, Verdict, listing
from objdebug.core.settings import Settings
from objdebug.stages.invariants._common import base, batch, logits, probe, skip_end_to_end

_UNTESTABLE_INT = ("index", "_id", "size", "vocab", "dim")


def perturbation(name: str, value: Any) -> tuple[Any, str | None]:
    """(perturbed value, None) or (None, why it is not testable)."""
    if isinstance(value, bool):
        return (not value), None
    if isinstance(value, int):
        if any(k in name.lower() for k in _UNTESTABLE_INT):
            return None, "an index/size: only matters where the data contains the new value"
        return value + 1, None
    if isinstance(value, float):
        if value == 0.0:
            return 0.1, None
        return (value * 0.5 if abs(value) <= 1.0 else value * 2.0), None
    if isinstance(value, str):
        if name == "reduction" and value in ("mean", "sum"):
            return ("sum" if value == "mean" else "mean"), None
        return None, "a string (allowed values unknown)"
    return None, f"{type(value).__name__}, not a number or bool"


class SettingsUsed(Check):
    """Each numeric/boolean setting perturbed: loss and gradient must change."""

    name = "settings-used"
    stage = "invariants"

    def skip_reason(self, ctx: Context) -> str | None:
        return skip_end_to_end(ctx, (
            "the objective rebuilt with perturbed settings (for a library model these are "
            "model settings)"))

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        pr, b, x, ref = probe(ctx), batch(ctx), logits(ctx), base(ctx)
        tested, untestable = [], []
        for name, value in pr.settings.items():
            if value is inspect.Parameter.empty:
                continue
            new, why = perturbation(name, value)
            if why:
                untestable.append({"setting": name, "value": repr(value), "why": why})
                continue
            try:
                p = pr.run(x, b.labels, changes={name: new})
            except Exception as exc:
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                untestable.append({"setting": name, "value": repr(value),
                                   "why": f"{name}={new!r} could not run: {type(exc).__name__}: {first[:120]}"})
                continue
            same = bool(np.array_equal(p.outputs, ref.outputs, equal_nan=True)
                        and np.array_equal(p.grad, ref.grad, equal_nan=True))
            diff = float(abs(p.loss - ref.loss)) if np.isfinite(p.loss) and np.isfinite(ref.loss) else float("nan")
            tested.append({"setting": name, "value": value, "perturbed": new, "identical": same,
                           "loss": ref.loss, "loss_perturbed": p.loss, "loss_diff": diff,
                           "from_config": name in pr.kwargs})
        return {"tested": tested, "untestable": untestable}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        verdict = Verdict.from_setting(th["unused_setting"], "[invariants] unused_setting")

        def judge(v):
            dead = [r for r in v["tested"] if r["identical"]]
            shown = ", ".join(f"{r['setting']} {r['value']!r}->{r['perturbed']!r}: " + (
                "bit-identical" if r["identical"] else f"|Δloss| {r['loss_diff']:.3g}")
                for r in v["tested"])
            skipped = listing([f"{u['setting']} ({u['why']})" for u in v["untestable"]], 6)
            what = (f"{len(v['tested'])} setting(s) perturbed: {shown or 'none'}"
                    + (f"; not testable: {skipped}" if v["untestable"] else ""))
            if dead:
                names = listing([r["setting"] for r in dead])
                return verdict, (what + f"; {names} leave(s) loss and gradient bit-identical: the "
                                 "objective stores the setting but never uses it"), float(len(dead))
            if not v["tested"]:
                return Verdict.SKIP, what + ": nothing to perturb", None
            return Verdict.PASS, what + "; every tested setting changes the loss", 0.0

        return [Condition("OBJ705", "every_setting_changes_the_objective", judge)]
