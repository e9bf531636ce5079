"""Shared pieces of the stress cases: the compiled Cells they run and the inputs they build.

Two graphs over the shared Cells of `objdebug.engine.cells`, both built once per engine through
`engine.cell` and called through `engine.call` so every compile is counted:

- `loss_and_grad`: the user's model + objective under the engine's gradient family
  (`objdebug.engine.gradients.param_grad`) -> loss and the gradients, reduced by the engine's one
  statistics graph (`Engine.gradient_stats`: compiled once, not once per length) to
  per-parameter squared norms and non-finite counts. The short cases (the all-padding batch,
  padding invariance at every extra, the random row, the long-input reference, an out-of-range
  probe) share the dynamic-shape graph `objective.param_grad` with the grad stage; a long
  input's measurement runs on its own length's static graph (`objective.param_grad.static`).
- `objective_on_logits`: the objective alone, fed logits directly (fp16, bf16); one graph per
  dtype (`OBJECTIVE_ON_LOGITS.<dtype>`).

A MindSpore 2.10 graph that raised at run time refuses every later call ("An error occurred in the
previous step of this model execution"); the engine drops such a graph (`Engine.retire`), so a
probe that is expected to raise may run on a shared graph: the next call compiles it again.
"""

from __future__ import annotations

import math

from typing import Any

import numpy as np

from objdebug.pipeline.context import Context
from objdebug.engine.data import Sample
from objdebug.pipeline.datasets import text_samples

OBJECTIVE_ON_LOGITS = "stress.objective_on_logits"
PROBE_POSITION = 5  # the out-of-range probes write one position of row 0: this one (garbage_ids.py)


def loss_and_grad(ctx: Context, ids: np.ndarray, labels: np.ndarray, static: bool = False) -> dict[str, Any]:
    """The objective's loss and gradients on one batch, through the user's real Cells.

    One dynamic-shape graph serves every short case and the grad stage (engine/dynamic_graph.py);
    `static`: the batch's own graph instead, for a measurement of what that one shape costs (the
    peak memory of a long input: a dynamic graph reuses the memory pool an earlier call grew)."""
    import mindspore as ms

    from objdebug.engine.gradients import param_grad

    (loss, _), grads = param_grad(ctx.engine, ctx.target, ms.Tensor(ids, ms.int32),
                                  ms.Tensor(labels, ms.int32), static=static)
    stats = ctx.engine.gradient_stats(grads)
    sq, bad = stats["sq_norm"], stats["nonfinite"]
    return {"loss": float(loss.asnumpy()), "grad_norm": float(np.sqrt(sq.sum())),
            "nonfinite_params": int((bad > 0).sum()), "n_params": int(len(bad)),
            "grads": grads}


POISONED = "error occurred in the previous step"


def error_line(exc: BaseException) -> str:
    """The first informative line of a MindSpore error (its messages open with rulers)."""
    lines = [ln.strip(" -") for ln in str(exc).splitlines()]
    return next((ln for ln in lines if any(c.isalpha() for c in ln)), type(exc).__name__)


def flat_grads(grads) -> np.ndarray:
    """All gradients as one float64 vector (for comparing two gradient sets)."""
    return np.concatenate([g.asnumpy().astype(np.float64).ravel() for g in grads])


def objective_on_logits(ctx: Context, logits, labels: np.ndarray, name: str = OBJECTIVE_ON_LOGITS) -> float:
    """The objective alone on a logits Tensor (any dtype) -> its scalar loss as float.

    `name` is the graph: a caller whose call may raise passes a name of its own (see the module
    docstring), e.g. f"{OBJECTIVE_ON_LOGITS}.float16".
    """
    import mindspore as ms

    from objdebug.engine.cells import ObjectiveOnLogits

    cell = ctx.engine.cell(name, lambda: ObjectiveOnLogits(ctx.target))
    total, _ = ctx.engine.call(name, cell, logits, ms.Tensor(labels, ms.int32))
    return float(total.asnumpy())


# --------------------------------------------------------------------------- inputs
def token_stream(ctx: Context, length: int) -> list[int]:
    """`length` tokens of real text: the target's samples concatenated, repeated as needed."""
    def build() -> list[int]:
        out: list[int] = []
        for s in text_samples(ctx):
            out += s.prompt + s.response
        if not out:
            raise ValueError("the target's text samples are empty")
        return out
    base = ctx.provide(token_stream, build)
    reps = -(-length // len(base))
    return (base * reps)[:length]


def text_sample(ctx: Context, length: int, name: str) -> Sample:
    """A sample of exactly `length` real-text tokens, every next token scored."""
    return Sample(id=f"{name}-{length}", prompt=[], response=token_stream(ctx, length), kind=name)


def packed(ctx: Context, samples: list[Sample], length: int, side: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`samples` padded to `length` on `[data] padding_side` (or `side`), marked for the model's mask."""
    return ctx.engine.padding.pack(samples, length, side=side)


def short_length(th: dict[str, Any]) -> int:
    """The shared short shape: long-input reference, all-padding batch, padding-invariance base."""
    return int(th["short_length"])


def rel_diff(a: float, b: float) -> float:
    """|a - b| / max(|b|, 1e-12); NaN if either is not finite."""
    if not (np.isfinite(a) and np.isfinite(b)):
        return float("nan") if a != b else 0.0
    return abs(a - b) / max(abs(b), 1e-12)


def ratio_band(x: float, warn: float, fail: float):
    """A loss ratio (long vs short) judged by band: within [1/warn, warn] PASS, outside
    [1/fail, fail] FAIL, WARN between; a ratio that is not a finite positive number FAILS.
    Shared by OBJ502 (long inputs) and OBJ513 (the objective alone)."""
    from objdebug.core.findings import Verdict

    if not (math.isfinite(x) and x > 0):
        return Verdict.FAIL
    if 1 / warn <= x <= warn:
        return Verdict.PASS
    if x < 1 / fail or x > fail:
        return Verdict.FAIL
    return Verdict.WARN


def max_rel(a: np.ndarray, b: np.ndarray) -> float:
    """The largest relative difference of `a` from `b` (0 where both hold the same non-finite
    values, NaN where only one side is finite)."""
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return 0.0 if np.array_equal(a, b, equal_nan=True) else float("nan")
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12)))
