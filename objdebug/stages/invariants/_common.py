"""Shared measurements of the invariants stage, cached on the Context.

The stage works on the grad stage's batch (`objdebug.stages.grad.grad_batch`: real rows, their
real lengths, the engine's batch shape) and on the model's logits for it, which `objdebug run` has
already computed there with the same compiled forward. Every objective evaluation goes through
`objdebug.stages.invariants.probe.InvarianceProbe` (graph `invariants.logit_grad[<variant>]`).
"""

from __future__ import annotations


import numpy as np

from objdebug.pipeline.context import Context
from objdebug.engine.gradients import Batch
from objdebug.stages.invariants.probe import InvarianceProbe, LibraryInvarianceProbe, Probe
from objdebug.core.settings import Settings
from objdebug.pipeline.run_data import (grad_batch, library_logits, logit_checks_skip, logit_gradients,
                                        paired)

END_TO_END = ("the end-to-end form (no [model]) does not expose logits: the objective cannot be "
              "called on chosen logits and labels")
F32_EPS = 2.0 ** -23


def settings(ctx: Context) -> Settings:
    """The stage's profile section, for the shared measurements (a check gets it in `measure`)."""
    return ctx.profile.section("invariants")


def skip_end_to_end(ctx: Context, needs: str = "") -> str | None:
    """SKIP reason of a check that the end-to-end form cannot run; `needs`: what the check asks of
    the objective beyond the library's own loss on its own batch (said when the head is probed)."""
    if not ctx.target.end_to_end:
        return None
    if needs and logit_checks_skip(ctx) is None:
        return (f"end-to-end form: the library model's loss runs on its own logits and batch only "
                f"(OBJ701/OBJ702 run on them); this check needs {needs}")
    return logit_checks_skip(ctx) or END_TO_END


def skip_logit_checks(ctx: Context) -> str | None:
    """SKIP reason of a check that runs on the library's own loss too (OBJ701, OBJ702)."""
    return logit_checks_skip(ctx)


def labels(ctx: Context) -> np.ndarray:
    """The labels each logit position is scored against: the batch's (for a library model that
    shifts its labels itself, the next position's; engine/library_logits.py)."""
    if ctx.target.end_to_end:
        return logit_gradients(ctx)["labels"]
    return batch(ctx).labels


def position_labels(ctx: Context) -> np.ndarray:
    """The label each logit position is scored against (the measured pairing: the next
    position's where the objective or the model shifts the labels; engine/label_pairing.py)."""
    if ctx.target.end_to_end:
        return logit_gradients(ctx)["labels"]
    return paired(ctx, batch(ctx).labels)


def batch(ctx: Context) -> Batch:
    return grad_batch(ctx)


def rows(ctx: Context) -> int:
    """Rows of the batch. A short batch is filled with copies of real rows: a duplicated row is
    still a real row of a real length, so every row counts as the user's batch."""
    return int(batch(ctx).input_ids.shape[0])


def logits(ctx: Context) -> np.ndarray:
    """The model's float32 logits [B, T, V] on the batch (the grad stage's compiled forward; the
    end-to-end form: what the library model's output head returned there)."""
    if ctx.target.end_to_end:
        return probe(ctx).head["logits"]
    return ctx.provide(logits,
                      lambda: ctx.engine.logits(batch(ctx).input_ids).astype(np.float32))


def probe(ctx: Context) -> InvarianceProbe | LibraryInvarianceProbe:
    if ctx.target.end_to_end:
        return ctx.provide(probe, lambda: LibraryInvarianceProbe(
            library_logits(ctx), batch(ctx).input_ids, batch(ctx).labels))
    return ctx.provide(probe, lambda: InvarianceProbe(ctx.engine))


def base(ctx: Context) -> Probe:
    """The configured objective on the batch, scale 1: the reference most rules compare with."""
    return ctx.provide(base, lambda: probe(ctx).run(logits(ctx), labels(ctx)))


def scored(ctx: Context, labels: np.ndarray) -> np.ndarray:
    # a pipeline's batch may mask with -100 beside its label pad id: a negative label is no token
    return (labels != ctx.config.data.label_pad_id) & (labels >= 0)


def declared_accumulation(ctx: Context) -> tuple[str, int] | None:
    """The trainer's declared accumulation as (its `[run]` key, its value): `grad_accumulation_steps`
    (micro-batches per step) or `micro_batch_size` (rows per micro-batch); None: not declared."""
    run = ctx.config.run
    for key in ("grad_accumulation_steps", "micro_batch_size"):
        if getattr(run, key, None) is not None:
            return key, int(getattr(run, key))
    return None


def accumulation_steps(ctx: Context) -> int | None:
    """The declared accumulation's micro-batches per batch (None: not declared)."""
    declared = declared_accumulation(ctx)
    if declared is None:
        return None
    key, value = declared
    return value if key == "grad_accumulation_steps" else len(micro_batches(ctx))


def micro_batches(ctx: Context) -> list[tuple[int, int]]:
    """[start, end) row ranges of the micro-batches a training loop would split the batch into.

    The declared accumulation (`[run] grad_accumulation_steps` = K micro-batches, or `[run]
    micro_batch_size` = rows each) when the config says how the trainer accumulates, else
    `[invariants] micro_batches` = K (0: one row each); it must divide the batch's rows, so every
    micro-batch has one shape (one compile)."""
    n = rows(ctx)
    declared = declared_accumulation(ctx)
    if declared is not None and declared[0] == "micro_batch_size":
        size = declared[1]
        if n % size:
            from objdebug.core.errors import InputError

            raise InputError(f"For 'run.micro_batch_size', the value must divide the batch's {n} rows "
                             f"(the profile's [engine] batch_size), but got {size}.")
        return [(i * size, (i + 1) * size) for i in range(n // size)]
    k = declared[1] if declared else int(settings(ctx)["micro_batches"]) or n
    if k < 1 or n % k:
        from objdebug.core.errors import InputError

        key = "run.grad_accumulation_steps" if declared else "[invariants] micro_batches"
        raise InputError(f"For '{key}', the value must divide the batch's {n} rows (the profile's "
                         f"[engine] batch_size), but got {k}.")
    size = n // k
    return [(i * size, (i + 1) * size) for i in range(k)]


def micro_probes(ctx: Context) -> list[Probe]:
    """The configured objective on each micro-batch alone (scale 1): one graph shape, K calls."""
    def build() -> list[Probe]:
        b, x = batch(ctx), logits(ctx)
        return [probe(ctx).run(x[s:e], b.labels[s:e]) for s, e in micro_batches(ctx)]
    return ctx.provide(micro_probes, build)


def rel(a: float, b: float) -> float:
    """|a - b| / max(|b|, tiny); NaN when either is not finite (unless both are the same)."""
    if not (np.isfinite(a) and np.isfinite(b)):
        return 0.0 if a == b or (np.isnan(a) and np.isnan(b)) else float("nan")
    return abs(a - b) / max(abs(b), 1e-30)


def grad_rel(g: np.ndarray, ref: np.ndarray) -> float:
    """max |g - ref| / max |ref|: the largest gradient error relative to the largest element."""
    if not (np.isfinite(g).all() and np.isfinite(ref).all()):
        return float("nan")
    scale = float(np.abs(ref).max())
    diff = float(np.abs(g - ref).max())
    return diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))


def fmt(x: float) -> str:
    return f"{x:.3g}" if np.isfinite(x) else str(x)
