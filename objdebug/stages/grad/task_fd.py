"""Finite differences (OBJ206) on a `[task] kind` other than the causal LM (issue 47): the same
measurement and judgement as the causal LM's `FiniteDifferences`, on the kind's gradient batch.

The autodiff gradient is the kind's (pipeline/task_kind.py `loss_and_param_grads`: the
objective's gradient w.r.t. the model's output, `task.logit_grad` or `task.pair_grad`, carried
back through the shared `model.vjp`); the finite differences are the objective's total at
theta +- eps d (`batch_loss`: `model.forward` and the objective, forward only), along the gradient
direction and `n_directions` seeded random unit directions, each at a few steps and
Richardson-extrapolated, the best agreement counting (see `FiniteDifferences`). The loss's float32
rounding is measured (`rounding_noise`: residuals of a quadratic through seven tiny steps), and a
disagreement within what it can do to a difference quotient (2 x noise / 2ε) is not counted: the
modelled rounding served only as a floor of the scale, so where the directional derivative is tiny
(a trained encoder's InfoNCE of 3e-4 nats, g.d ~4e-4 along a random direction) rounding alone made
a 1% disagreement. The model's parameters are copied to the host once
and restored bit for bit at the end. A CRF's own
transitions are not moved: their gradient is OBJ222's.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.core.settings import Settings
from objdebug.pipeline import task_kind

_F32_EPS = 2.0 ** -23


def rounding_noise(loss_at, d: np.ndarray, h: float, loss: float, k: int = 3) -> float:
    """The loss's float32 rounding, measured along `d`: the largest residual of L(theta + i h d),
    i = -k..k, from the quadratic through them (float64 least squares; the step h is so small
    that the curve itself is far below the rounding)."""
    t = np.arange(-k, k + 1, dtype=np.float64) * h
    values = np.array([loss if i == 0 else loss_at(d, float(x)) for i, x in zip(range(-k, k + 1), t)])
    if not np.isfinite(values).all():
        return float("inf")
    fit = np.polyval(np.polyfit(t, values, 2), t)
    return float(np.max(np.abs(values - fit)))


def measure(ctx, th: Settings) -> dict[str, Any]:
    import mindspore as ms

    rows = task_kind.grad_rows(ctx)
    kind = ctx.config.task.kind
    length = max(len(s) for r in rows for s in (r.ids, r.positive, r.negative) if s is not None) \
        if kind == "embedding" else max(len(r.ids) for r in rows)
    params = list(ctx.target.model.trainable_params())
    loss, grads = task_kind.loss_and_param_grads(ctx, rows, length)
    g = np.concatenate([x.ravel() for x in grads])
    if not (math.isfinite(loss) and np.isfinite(g).all()):
        return {"loss": loss, "finite": False, "n_directions": 0, "directions": [],
                "max_rel_error": float("nan")}
    gnorm = float(np.linalg.norm(g))
    typical = gnorm / math.sqrt(g.size)
    rng = np.random.default_rng(int(th["seed"]))
    randoms = [d / np.linalg.norm(d) for d in rng.standard_normal((int(th["n_directions"]), g.size))]
    saved = [p.data.asnumpy().copy() for p in params]
    theta = float(np.sqrt(sum(float((s.astype(np.float64) ** 2).sum()) for s in saved)))
    steps = sorted(float(x) * (theta if theta > 0 else 1.0) for x in th["fd_rel_steps"])
    # along the gradient, steps that change the loss by f x S to first order, for S = |L| (the
    # causal LM's), max(|L|, 1) (the floor's rounding model) and their geometric mean, the best
    # agreement counting (a wrong backward disagrees with every step). A trained encoder's InfoNCE
    # of 3e-4 nats is a difference of logits near 20: a step moving it by a share of itself lies
    # below its float32 rounding (4% off), one moving it by 1e-2 nats far into its curvature (19%
    # off); in between they agree
    scales = sorted({max(abs(loss), 1e-6), math.sqrt(max(abs(loss), 1e-6) * max(abs(loss), 1.0)),
                     max(abs(loss), 1.0)})
    grad_steps = sorted(float(f) * s / gnorm for s in scales for f in th["fd_gradient_steps"]) if gnorm > 0 else []
    directions = ([("gradient", g / gnorm, gnorm, grad_steps)] if gnorm > 0 else []) + \
        [(f"random {k}", d, float(g @ d), steps) for k, d in enumerate(randoms)]
    sizes = [s.size for s in saved]
    cuts = np.cumsum([0] + sizes)

    def loss_at(d, eps):
        for p, s, a, b in zip(params, saved, cuts[:-1], cuts[1:]):
            moved = (s.astype(np.float64) + eps * d[a:b].reshape(s.shape)).astype(s.dtype)
            p.set_data(ms.Tensor(moved))
        return task_kind.batch_loss(ctx, rows, length)

    ulps, rows_out = float(th["fd_noise_ulps"]), []
    try:
        # the loss's own float32 rounding, measured along the first random direction. A
        # difference quotient at step ε can be off by 2 x noise / (2ε) from rounding alone: that
        # much of a disagreement is no evidence against the gradient (the message names the
        # noise). Measured on the trained encoder: 8.5e-8 nats, and its 1.1% along a random
        # direction (4.7e-6 on g.d = 4.1e-4 at ε = 0.013) was within the 6.5e-6 rounding allows
        noise = rounding_noise(loss_at, randoms[0], min(steps) / 20, loss) if randoms and steps else 0.0
        for label, d, ad, eps_list in directions:
            diffs = [(loss_at(d, eps) - loss_at(d, -eps)) / (2 * eps) for eps in eps_list]
            floors = [ulps * _F32_EPS * max(abs(loss), 1.0) / (2 * eps) for eps in eps_list]
            slack = [noise / eps for eps in eps_list]
            candidates = [(f"ε={e:.2g}", fd, fl, sl) for e, fd, fl, sl in zip(eps_list, diffs, floors, slack)]
            for i in range(len(eps_list) - 1):
                r2 = (eps_list[i + 1] / eps_list[i]) ** 2  # cancel the ε² curvature term
                candidates.append((f"Richardson ε={eps_list[i]:.2g},{eps_list[i + 1]:.2g}",
                                   (r2 * diffs[i] - diffs[i + 1]) / (r2 - 1), floors[i],
                                   (r2 * slack[i] + slack[i + 1]) / (r2 - 1)))
            best: dict[str, Any] | None = None
            for how, fd, floor, sl in candidates:
                scale = max(abs(fd), abs(ad), typical, floor)
                err = (max(0.0, abs(fd - ad) - sl) / scale if math.isfinite(fd) and math.isfinite(ad)
                       else float("nan"))
                if best is None or not err >= best["rel_error"]:
                    best = {"direction": label, "autodiff": ad, "finite_difference": fd,
                            "rel_error": err, "method": how, "rounding_slack": sl}
            best["epsilons"], best["differences"] = eps_list, diffs
            rows_out.append(best)
    finally:
        for p, s in zip(params, saved):  # bit for bit
            p.set_data(ms.Tensor(s))
    errs = [r["rel_error"] for r in rows_out]
    return {"loss": loss, "finite": True, "n_directions": len(rows_out), "epsilons": steps,
            "rounding_noise": noise,
            "gradient_epsilons": grad_steps, "parameter_norm": theta, "gradient_norm": gnorm,
            "typical_gdot": typical, "n_elements": int(g.size), "seed": int(th["seed"]),
            "max_rel_error": float(np.max(errs)) if errs else float("nan"), "directions": rows_out}
