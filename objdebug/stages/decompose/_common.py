"""The decompose stage's shared measurement: the components' values per sample over the data
(`engine.evaluate`, or the kind's rows through task_terms.py), their statistics and the
least-squares reconstruction of the total, the parameters every component can reach."""

from __future__ import annotations

from typing import Any

import numpy as np

import objdebug.stages.decompose.task_terms as task_terms
from objdebug.core.errors import InputError
from objdebug.engine.data import Sample
from objdebug.pipeline.context import Context
from objdebug.pipeline.datasets import text_samples

KINDS = ("causal-lm", "classification", "tagging", "embedding")  # the others through task_terms.py


def _samples(ctx: Context) -> list[Sample]:
    th = ctx.profile.section("decompose")
    n = ctx.options.samples or th["max_samples"] or None
    return text_samples(ctx, n)


def engine_batches(ctx: Context, samples: list[Sample]) -> list[list[int]]:
    """Sample indices per engine batch: the engine's own batches, without filler rows."""
    return [b.index for b in ctx.engine.batches(samples)]


def component_names(ctx: Context, n_components: int) -> list[str]:
    """Declared names for the outputs after the total; a count mismatch is a config error."""
    declared = list(ctx.config.objective.components)
    if n_components == 0 and not declared:
        return ["total"]
    if n_components != len(declared):
        raise InputError(f"For 'objective.components', the names must match the objective's outputs "
                         f"after the total ({n_components}), but got {len(declared)}: {declared}.",
                         source=ctx.config.source)
    return declared


def component_values(ctx: Context) -> dict[str, Any]:
    """Per-component statistics over the data (cached: both checks of this stage use them)."""
    def build() -> dict[str, Any]:
        if task_terms.is_task(ctx):  # the kind's rows, one at a time (task_terms.py)
            measured = task_terms.values(ctx)
            out, batches, samples = measured["out"], measured["batches"], measured["out"]
        else:
            samples = _samples(ctx)
            out = ctx.engine.evaluate(samples, label="decompose: components")
            batches = engine_batches(ctx, samples)
        k = out.shape[1] - 1
        names = component_names(ctx, k)
        total = out[:, 0]
        comps = out[:, 1:] if k else out[:, :1]
        means = np.array([np.mean(comps[:, j]) for j in range(comps.shape[1])])
        denom = float(np.sum(np.abs(means)))
        stats = []
        for j, name in enumerate(names):
            col = comps[:, j]
            zero_batches = sum(1 for b in batches if np.all(col[b] == 0.0))
            stats.append({
                "name": name, "mean": float(means[j]), "std": float(np.std(col)),
                "min": float(np.min(col)), "max": float(np.max(col)),
                "share": float(abs(means[j]) / denom) if denom > 0 else float("nan"),
                "zero_batch_fraction": zero_batches / len(batches),
                "zero_sample_fraction": float(np.mean(col == 0.0)),
                "nonfinite": int(np.sum(~np.isfinite(col))),
            })
        return {"n_samples": len(samples), "n_batches": len(batches), "single_term": k == 0,
                "components": stats, "total_mean": float(np.mean(total)),
                "reconstruction": _reconstruction(total, comps) if k else None,
                "per_sample": out}
    return ctx.provide(component_values, build)


def _reconstruction(total: np.ndarray, comps: np.ndarray) -> dict[str, Any]:
    """Least-squares weights w with total ~ comps @ w, and the relative RMS residual."""
    ok = np.all(np.isfinite(comps), axis=1) & np.isfinite(total)
    t, c = total[ok], comps[ok]
    if len(t) == 0:
        return {"weights": [], "residual": float("nan"), "unit_residual": float("nan"),
                "rank": 0, "rows": 0}
    weights, _, rank, _ = np.linalg.lstsq(c, t, rcond=None)
    scale = max(float(np.sqrt(np.mean(t ** 2))), 1e-30)
    rel = float(np.sqrt(np.mean((t - c @ weights) ** 2)) / scale)
    unit = float(np.sqrt(np.mean((t - c.sum(axis=1)) ** 2)) / scale)
    return {"weights": [float(w) for w in weights], "residual": rel, "unit_residual": unit,
            "rank": int(rank), "rows": int(len(t))}


def shared_params(ctx: Context) -> list:
    """Parameters every component can reach: the model's (the network's in end-to-end form)."""
    return list(ctx.target.network.trainable_params())
