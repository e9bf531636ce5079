"""OBJ702: which logit-shift changes a declared component explains (a z-loss, a logit penalty).

A z-loss (PaLM; OLMo: mean squared logsumexp) depends on the absolute logit level by design, so
the total of `ce + w * z_loss` moves when every logit moves by c, while its cross-entropy does not.
That is not a shift bug when the objective says so: it returns (total, c1, ...) with the
components named in `objective.components`. A row of the shift measurement whose total moves
beyond the float32 tolerance is *explained* when

- everything is finite (an overflow is never explained),
- the task component (`objective.primary`, default the first) stays within the same tolerance,
- at least one other declared component moves, and
- over all the moved shifts, the total's change is a fixed combination of the moved components'
  changes: least squares Δtotal ~ Σ w_i Δc_i, residual within the loss tolerance plus
  `component_rtol` x |Δtotal| per shift (an undeclared level-dependent term leaves a residual).

The gradient is the total's (the probe differentiates the total only): its change is attributed
to the same components. Anything else breaks the invariant, as a single-term objective that
moves does.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def component_names(config: Any, n_outputs: int) -> list[str]:
    """The declared component names when they match the objective's outputs after the total."""
    names = list(config.objective.components)
    return names if names and len(names) == n_outputs - 1 else []


def attribute(rows: list[dict[str, Any]], names: list[str], primary: str | None, rtol: float
              ) -> dict[str, Any]:
    """{"explained": bool, "components": moved names, "weights": fitted w, "why": reason if not}.

    `rows`: the shift rows with "ok", "loss_diff", "loss_tolerance", "total_change" (signed),
    "component_changes" (signed, per name) and "finite"."""
    bad = [r for r in rows if not r["ok"]]
    out: dict[str, Any] = {"explained": False, "components": [], "weights": [], "why": ""}
    if not bad:
        return out
    if not names:
        out["why"] = "no declared components (objective.components) to explain it"
        return out
    if not all(r["finite"] for r in bad):
        out["why"] = "not finite"
        return out
    task = primary or names[0]
    moved = sorted({n for r in bad for n, d in zip(names, r["component_changes"])
                    if abs(d) > r["loss_tolerance"]}, key=names.index)
    if task in moved:
        worst = max(bad, key=lambda r: abs(r["component_changes"][names.index(task)]))
        out["why"] = (f"the task component '{task}' itself changes by "
                      f"{abs(worst['component_changes'][names.index(task)]):.3g} at +{worst['shift']:g}")
        return out
    if not moved:
        out["why"] = "no declared component moves with it: an undeclared term depends on the logit level"
        return out
    if len(moved) >= len(bad):  # as many unknowns as shifts: any total would fit, nothing is tested
        out["why"] = (f"{len(bad)} shifted results for {len(moved)} moved components: too few to "
                      "tell the declared terms from an undeclared one (add [invariants] logit_shifts)")
        return out
    a = np.array([[r["component_changes"][names.index(n)] for n in moved] for r in bad], np.float64)
    y = np.array([r["total_change"] for r in bad], np.float64)
    w, *_ = np.linalg.lstsq(a, y, rcond=None)
    resid = np.abs(a @ w - y)
    allowed = np.array([r["loss_tolerance"] + rtol * abs(r["total_change"]) for r in bad])
    out["weights"] = [float(x) for x in w]
    out["components"] = moved
    out["residual"] = float(resid.max())
    if not (np.isfinite(w).all() and (resid <= allowed).all()):
        i = int(np.argmax(resid - allowed))
        out["why"] = (f"the total changes by {abs(y[i]):.3g} at +{bad[i]['shift']:g}, "
                      f"{resid[i]:.3g} more than the declared {', '.join(moved)} explain "
                      f"(allowed {allowed[i]:.2g}): an undeclared term depends on the logit level")
        return out
    out["explained"] = True
    return out
