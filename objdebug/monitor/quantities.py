"""What the monitor measures on a step: gradient statistics reduced in the engine's gradient graph
(`objdebug.engine.gradients`, the same reduction the grad stage reads: OBJ202 and OBJ603 agree)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from objdebug.core.naming import layer_of


def grad_stats(names: Sequence[str], grads: Sequence[Any], stats: dict[str, np.ndarray] | None = None
               ) -> dict[str, Any]:
    """Global norm, per-layer norms, NaN/Inf count, all-zero params, max/mean per-parameter norm
    (over weight matrices when there are two or more; over all parameters in `max_mean_ratio_all`).

    The per-parameter reductions are the grad stage's (`objdebug.engine.gradients.complete_stats`,
    in graph, float32), `stats` when the gradient graph computed them already; a parameter's norm
    is taken over its finite elements (NaN/Inf are counted apart), so the ratio is OBJ202's
    `max_mean_ratio` on the same gradients (over all parameters: `max_mean_ratio_all`)."""
    from objdebug.engine.gradients import max_mean_ratio, reduce_gradients

    names = list(names)
    if stats is None:
        stats = reduce_gradients(grads) if len(grads) else {
            k: np.zeros(0) for k in ("finite_sq", "nonfinite")}
    sq_all, bad_all = stats["finite_sq"], stats["nonfinite"]
    matrix = [len(getattr(g, "shape", np.shape(g))) >= 2 for g in grads]
    norms, layers_sq, zero, bad_params = [], {}, [], []
    for name, sq, n_bad in zip(names, sq_all, bad_all):
        sq, n_bad = float(sq), int(n_bad)
        if n_bad:
            bad_params.append(name)
        if sq == 0.0 and not n_bad:
            zero.append(name)
        norms.append(math.sqrt(sq))
        layers_sq[layer_of(name)] = layers_sq.get(layer_of(name), 0.0) + sq
    arr = np.array(norms) if norms else np.zeros(1)
    # The ratio is taken over weight matrices: biases and norm gains carry small gradients by
    # construction and would inflate max/mean on a healthy model (18 vs 7 on the demo model).
    pick = [i for i, m in enumerate(matrix) if m] if sum(matrix) >= 2 else list(range(len(arr)))
    ratio, imax, mean = max_mean_ratio(arr, pick)
    ratio_all = max_mean_ratio(arr)[0]
    return {"global_norm": math.sqrt(float(np.sum(arr ** 2))), "mean_norm": mean,
            "max_norm": float(arr[imax]), "max_param": names[imax] if names else "",
            "max_mean_ratio": ratio,
            "ratio_over": "matrices" if sum(matrix) >= 2 else "all",
            "max_mean_ratio_all": ratio_all,
            "nonfinite": int(sum(int(b) for b in bad_all)), "nonfinite_params": bad_params[:20],
            "zero_params": zero, "n_params": len(norms),
            "layers": {k: math.sqrt(v) for k, v in layers_sq.items()}}
