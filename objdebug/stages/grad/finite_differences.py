"""OBJ206, finite differences: autodiff's directional derivative against central finite
differences of the real objective, on the causal LM's gradient batch (FiniteDifferences) and on a
`[task] kind`'s (TaskFiniteDifferences, the kind's gradient and losses from task_fd.py)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.core.findings import Check, Condition, Verdict, band
from objdebug.core.settings import Settings
from objdebug.engine import kinds as task_kinds
from objdebug.pipeline.context import Context
from objdebug.pipeline.run_data import fd_directions, grad_batch, grad_probe, param_gradients
from objdebug.stages.grad._common import _F32_EPS, _no_params


class FiniteDifferences(Check):
    """Directional derivative g.d (autodiff) vs central finite differences of the real objective.

    float32 makes a naive comparison noisy in two ways, handled here without loosening the pass
    line: a random unit direction's g.d is |g|/sqrt(P) on average and can be near 0, where a
    tiny absolute error is a large relative one; and the difference of two float32 losses carries
    rounding noise ~ ulp(L)/ε while a large ε adds curvature error ~ ε². So:

    - the normalized gradient g/|g| is always the first direction: its derivative |g| is the
      largest of any unit direction, far above rounding noise, and a backward with the wrong
      scale or sign shows its full error there;
    - random directions (they see errors the gradient direction cannot: a backward that drops
      a part of the gradient) are judged on the scale of a typical random direction,
      |FD - g.d| / max(|g.d|, |FD|, |g|/sqrt(P), rounding floor);
    - each direction is differenced at a few steps (along the gradient: ε|g| = f|L| for f in
      `fd_gradient_steps`; along random directions: ε = step * ||θ|| for `fd_rel_steps`) and
      Richardson-extrapolated over consecutive steps (the ε² curvature term cancels); the
      candidate that agrees best counts, because a wrong backward disagrees with every one.
    """

    name = "finite-differences"
    stage = "grad"

    def skip_reason(self, ctx: Context) -> str | None:
        from objdebug.engine import precision

        if precision.enabled(ctx.config):  # [run] amp_level: rounding swamps the differences
            return precision.FD_SKIP
        return _no_params(ctx)

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        probe, batch = grad_probe(ctx), grad_batch(ctx)
        g = param_gradients(ctx)
        random_dirs = fd_directions(ctx)
        finite = bool(math.isfinite(g.loss) and not g.nonfinite.any())
        if not finite:
            return {"loss": g.loss, "finite": False, "n_directions": 0, "directions": [],
                    "max_rel_error": float("nan")}
        gnorm = float(np.sqrt(g.sq_norm.sum()))
        n_elements = int(g.sizes.sum())
        typical = gnorm / math.sqrt(n_elements)  # RMS of g.d over random unit directions
        ulps = float(th["fd_noise_ulps"])
        loss_scale = max(abs(g.loss), 1e-6)
        directions = []  # (label, moving arrays, index, autodiff g.d, steps)
        rows = []
        # the parameters go to the host once for all 2 x directions x steps evaluations and are
        # restored once, bit for bit, at the end (or on an error)
        with probe.saved_parameters() as saved:
            theta = probe.parameter_norm(saved)
            # random directions: steps relative to the parameter norm (their derivative is small;
            # the curvature along them sets the scale)
            steps = sorted(float(x) * (theta if theta > 0 else 1.0)
                           for x in th["fd_rel_steps"])
            # the gradient direction: steps that change the loss by a fixed small share to first
            # order, ε|g| = f|L|. A parameter-relative step is far too long there on a confident
            # model (the demo: |L| = 0.002, |g| = 0.17, ε = 3e-4 ||θ|| = 0.011 moves the loss by
            # 80% of itself and the FD is 12% off)
            grad_steps = sorted(float(f) * loss_scale / gnorm
                                for f in th["fd_gradient_steps"]) if gnorm > 0 else []
            if gnorm > 0:
                directions.append(("gradient", probe.gradient_direction(g), 0, gnorm, grad_steps))
            directions += [(f"random {k}", random_dirs, k, float(g.gdot[k]), steps)
                           for k in range(len(g.gdot))]
            for label, dirs, k, ad, eps_list in directions:
                diffs = []
                for eps in eps_list:
                    plus = probe.loss_at(batch, dirs, eps, k, saved)
                    minus = probe.loss_at(batch, dirs, -eps, k, saved)
                    diffs.append((plus - minus) / (2 * eps))
                # below this the float32 difference of two losses cannot resolve a derivative
                floors = [ulps * _F32_EPS * max(abs(g.loss), 1.0) / (2 * eps) for eps in eps_list]
                candidates = [(f"ε={eps:.2g}", fd, floor) for eps, fd, floor in zip(eps_list, diffs, floors)]
                for i in range(len(eps_list) - 1):
                    r2 = (eps_list[i + 1] / eps_list[i]) ** 2  # D(ε) = g.d + c ε² + O(ε⁴): cancel c ε²
                    rich = (r2 * diffs[i] - diffs[i + 1]) / (r2 - 1)
                    candidates.append((f"Richardson ε={eps_list[i]:.2g},{eps_list[i + 1]:.2g}", rich,
                                       floors[i]))
                best: dict[str, Any] | None = None
                for how, fd, floor in candidates:
                    scale = max(abs(fd), abs(ad), typical, floor)
                    err = abs(fd - ad) / scale if math.isfinite(fd) and math.isfinite(ad) else float("nan")
                    if best is None or not err >= best["rel_error"]:  # NaN never replaces a number
                        best = {"direction": label, "autodiff": ad, "finite_difference": fd,
                                "rel_error": err, "method": how}
                best["epsilons"] = eps_list
                best["differences"] = diffs
                rows.append(best)
        errs = [r["rel_error"] for r in rows]
        return {"loss": g.loss, "finite": True, "n_directions": len(rows), "epsilons": steps,
                "gradient_epsilons": grad_steps,
                "parameter_norm": theta, "gradient_norm": gnorm, "typical_gdot": typical,
                "n_elements": n_elements, "seed": int(th["seed"]),
                # np.max propagates NaN (builtin max() keeps whatever came first)
                "max_rel_error": float(np.max(errs)) if errs else float("nan"), "directions": rows}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        e_pass, e_fail = th["fd_pass"], th["fd_fail"]

        def judge(v):
            if not v["finite"]:
                return Verdict.SKIP, (f"not judged: the loss ({v['loss']:.4g}) or its gradient is "
                                      "not finite, see OBJ203"), None
            x = v["max_rel_error"]
            verdict = band(x, pass_if=lambda a: a < e_pass, fail_if=lambda a: a > e_fail)
            worst = max(v["directions"], key=lambda r: r["rel_error"] if math.isfinite(r["rel_error"])
                        else float("inf"))
            pairs = "; ".join(f"{r['autodiff']:.4g} vs {r['finite_difference']:.4g}"
                              for r in v["directions"])
            rounding = (f", counted beyond what the loss's measured float32 rounding "
                        f"({v['rounding_noise']:.2g}) does to a difference quotient"
                        if "rounding_noise" in v else "")  # the task kinds' (task_fd.py)
            return verdict, (
                f"autodiff vs central finite differences along "
                f"{'the gradient direction and ' if v['directions'][0]['direction'] == 'gradient' else ''}"
                f"{sum(r['direction'] != 'gradient' for r in v['directions'])} random directions "
                f"(ε = {', '.join(f'{e:.2g}' for e in v['gradient_epsilons'])} along the gradient, "
                f"{', '.join(f'{e:.2g}' for e in v['epsilons'])} along random ones, each pair also "
                f"Richardson-extrapolated, best agreement; "
                f"random directions on the scale |g|/sqrt(P) = {v['typical_gdot']:.3g}): max relative "
                f"error {x:.2g}{rounding} ({worst['direction']}, {worst['method']}; g·d vs FD: {pairs}); "
                f"pass < {e_pass}, fail > {e_fail}"), x

        return [Condition("OBJ206", f"fd_rel_error_less_than_{e_pass}", judge)]


class TaskFiniteDifferences(FiniteDifferences):
    """OBJ206 on a `[task] kind`'s gradient batch (issue 47): the same measurement and conditions,
    the kind's gradient and losses (stages/grad/task_fd.py)."""

    name = "task-finite-differences"  # the rule page of OBJ206 names both
    kinds = task_kinds.tasks()

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        import objdebug.stages.grad.task_fd as task_fd

        return task_fd.measure(ctx, th)
