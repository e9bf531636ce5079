"""Measurements that several stages share, computed once per run and cached on the Context.

The gradient batch and the gradients on it are the grad stage's measurements that invariants,
stress and the model state read too; `logits_of_rows` is the model's logits of real rows at the
engine's buckets (over-smoothing, the model state; `mean_token_nll` each row's mean token NLL from
them, OBJ102's model ranking). Each function is its own provider key
(`ctx.provide(grad_batch, build)`), so whichever stage asks first computes it, and a stage never
imports another stage.
"""

from __future__ import annotations

import numpy as np

from objdebug.core.errors import InputError
from objdebug.engine.data import Sample
from objdebug.engine.gradients import Batch, GradientProbe, ParamGradients, reference_mean_ce_grad
from objdebug.engine import label_pairing
from objdebug.engine.label_pairing import Pairing
from objdebug.engine.library_logits import LibraryLogits, model_shifts, of_end_to_end
from objdebug.pipeline.context import Context
from objdebug.pipeline.datasets import text_samples
from objdebug.pipeline.pipeline_batches import first_batch


def grad_batch(ctx: Context) -> Batch:
    """The gradient batch: with `[data] batches`, the pipeline's first batch as it is
    (`pipeline_batches.first_batch`); else --samples data rows (default: the batch size),
    --batch-size rows."""
    def build() -> Batch:
        real = first_batch(ctx)
        if real is not None:
            return real
        opts = ctx.options
        rows = int(opts.batch_size if opts.batch_size is not None else ctx.engine.batch_size)
        n = int(opts.samples if opts.samples is not None else rows)
        for name, value in (("--batch-size", rows), ("--samples", n)):
            if value < 1:
                raise InputError(f"For '{name}', the value must be >= 1, but got {value}.")
        samples = text_samples(ctx, n)
        length = ctx.engine.bucket(max(s.length for s in samples))
        return ctx.engine.batches(samples, length, size=max(rows, len(samples)))[0]
    return ctx.provide(grad_batch, build)


def grad_probe(ctx: Context) -> GradientProbe:
    return ctx.provide(grad_probe, lambda: GradientProbe(ctx.engine))


def fd_directions(ctx: Context) -> list[np.ndarray]:
    s = ctx.profile.section("grad")
    return ctx.provide(fd_directions, lambda: grad_probe(ctx).random_directions(
        int(s["n_directions"]), int(s["seed"])))


def param_gradients(ctx: Context) -> ParamGradients:
    """Per-parameter statistics and g.d along the FD directions: one compiled call."""
    return ctx.provide(param_gradients, lambda: grad_probe(ctx).parameters(grad_batch(ctx),
                                                                         fd_directions(ctx)))


def library_logits(ctx: Context) -> LibraryLogits:
    """The end-to-end library model's own loss on its own logits (engine/library_logits.py)."""
    return ctx.provide(library_logits, lambda: LibraryLogits(ctx.engine))


def pairing(ctx: Context) -> Pairing:
    """Which label each logit position is scored against (engine/label_pairing.py): measured on
    the configured objective in the split form, by the library model's setup probe end to end."""
    def build() -> Pairing:
        if ctx.target.end_to_end:  # at the output head found inside the Cell (label_pairing.py)
            found = of_end_to_end(ctx.target)
            info = (ctx.target.info or {}).get("library_model") or {}
            if not found.measured and info.get("shifts_labels") is not None:
                offset = 1 if model_shifts(ctx.target) else 0
                return Pairing(offset=offset, measured=True, why="the library model's setup probe")
            return found
        return label_pairing.of(ctx.engine)
    return ctx.provide(pairing, build)


def pairing_skip(ctx: Context) -> str | None:
    """Why a position-wise check cannot pair logits with labels here (None: it can)."""
    return logit_checks_skip(ctx) or label_pairing.custom_reason(pairing(ctx))


def paired(ctx: Context, labels: np.ndarray, positions: int | None = None) -> np.ndarray:
    """`labels` [B, T] as the logit positions see them: position t holds the label it is scored
    against (labels[t + 1] when the objective or the model shifts them), label_pad_id where none."""
    return label_pairing.paired_labels(labels, pairing(ctx).offset,
                                       ctx.engine.padding.label_pad_id, positions)


def logit_gradients(ctx: Context) -> dict[str, np.ndarray]:
    """Logits of the batch, the objective's squared logit-gradient norm per position, reference,
    and the labels each logit position is scored against ("labels": the batch's labels as the
    measured pairing reads them: the next position's where the objective or the model shifts;
    every negative label read as label_pad_id)."""
    def build() -> dict[str, np.ndarray]:
        batch = grad_batch(ctx)
        pid = ctx.engine.padding.label_pad_id
        if ctx.target.end_to_end:  # the library's loss in its own graph, through its output head
            out = library_logits(ctx).run(batch.input_ids, batch.labels)
            ref = reference_mean_ce_grad(out["logits"], out["labels"], pid)
            return {**out, "reference_sq": ref}
        logits = ctx.engine.logits(batch.input_ids)
        outputs, sq, g = grad_probe(ctx).logits(logits, batch.labels)
        # a pipeline's batch may mask with more than one value (-100 on the prompt, its pad id on
        # padding): a negative label is never a token, so the checks read it as masked (objdebug's
        # own rows hold label_pad_id and token ids only: unchanged)
        labels = paired(ctx, batch.labels)
        labels = np.where(labels < 0, pid, labels)
        ref = reference_mean_ce_grad(logits, labels, pid)
        return {"outputs": outputs, "sq": sq, "reference_sq": ref, "grad": g, "logits": logits,
                "labels": labels}
    return ctx.provide(logit_gradients, build)


def logit_checks_skip(ctx: Context) -> str | None:
    """Why a check on the objective's logit gradient cannot run here (None: it can)."""
    if not ctx.target.end_to_end:
        return None
    from objdebug.engine.library_logits import unavailable

    return unavailable(ctx.target)


def logits_of_rows(ctx: Context, samples: list[Sample]):
    """(float64 logits [n, T, V], int labels [n, T]: at t the real token after t) of the real
    rows, batch by batch: the engine's length buckets and batch size (short batches filled, the
    filler dropped), so the `model.forward` graphs are the ones every stage shares. Used by
    over-smoothing and the model state (OBJ004). A library model as the end-to-end target: its output head's logits and the
    labels they are scored against, from its own loss graph (engine/library_logits.py)."""
    for _, x, labels in indexed_logits_of_rows(ctx, samples):
        yield x, labels


def indexed_logits_of_rows(ctx: Context, samples: list[Sample]):
    """`logits_of_rows` with each batch's rows named: (indices into `samples`, logits, labels);
    the batches follow the length buckets, not the order of `samples`."""
    for batch in ctx.engine.batches(samples):
        n = len(batch.samples)
        if ctx.target.end_to_end:
            out = library_logits(ctx).run(batch.input_ids, batch.labels)
            yield batch.index[:n], out["logits"][:n].astype(np.float64), out["labels"][:n]
            continue
        # the model's quality, not the objective's: each position against the real next token,
        # as the labels' layout (`[data] shift`) places it, whatever pairing the objective uses
        nxt = label_pairing.declared(ctx.config.data.shift, "").offset
        yield (batch.index[:n], ctx.engine.logits(batch.input_ids)[:n].astype(np.float64),
               label_pairing.paired_labels(batch.labels[:n], nxt, ctx.engine.padding.label_pad_id))


def mean_token_nll(ctx: Context, samples: list[Sample]) -> np.ndarray:
    """The model's own mean negative log-likelihood (nats per token) of each sample's labelled
    tokens, numpy float64 from the logits: a reference measurement of the MODEL (how likely it
    finds each answer), never a verdict on the objective. NaN for a sample with no labelled token."""
    from scipy.special import log_softmax

    out = np.full(len(samples), np.nan)
    pid = ctx.engine.padding.label_pad_id
    for index, x, labels in indexed_logits_of_rows(ctx, samples):
        for i, xi, yi in zip(index, x, labels.astype(np.int64)):
            keep = (yi != pid) & (yi >= 0)
            if not keep.any():
                continue
            logp = log_softmax(xi[keep], axis=-1)[np.arange(int(keep.sum())), yi[keep]]
            out[i] = float(-logp.mean())
    return out
