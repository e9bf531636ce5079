"""The contract probe of a `[task] kind` other than the causal LM (issue 47), and the rows its
checks share.

Each kind has its shapes (objdebug/engine/tasks.py): classification logits [B, C] with labels
[B]; tagging emissions [B, T, K] with tags [B, T]; embedding [B, D] per text. `check_target`
runs the model on one batch of token 0 through the shared `model.forward` graph and the
objective once through `task.objective`, and raises an InputError (exit 2) that says what the
kind expects and what came back; a class count that disagrees with `[task] labels` is one too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.core.errors import InputError
from objdebug.engine import tasks
from objdebug.engine.compile_errors import ContractError, compile_error, first_line

# kind -> (the model output's rank, what it is called in messages)
SHAPES = {"classification": (2, "float logits [B, C]"),
          "tagging": (3, "float emissions [B, T, K]"),
          "embedding": (2, "float embeddings [B, D]")}
PROBE_LENGTH = 8


def _expected(kind: str, batch: int, length: int) -> str:
    rank, text = SHAPES[kind]
    dims = f"[{batch}, C]" if kind == "classification" else \
        f"[{batch}, {length}, K]" if kind == "tagging" else f"[{batch}, D]"
    return f"{text} = {dims}"


def check_output(out, kind: str, batch: int, length: int, labels: list[str] | None) -> int:
    """The last dimension of a model output that keeps the kind's contract (C, K or D); InputError."""
    import mindspore as ms

    from objdebug.pipeline.contract import _describe

    expected = _expected(kind, batch, length)
    where = (f"For 'model.factory', with task.kind = \"{kind}\" the model must return {expected} "
             f"for input_ids [{batch}, {length}], but got")
    if not isinstance(out, ms.Tensor):
        raise InputError(f"{where} {_describe(out)}; set [model] output to pick the tensor.")
    shape = tuple(out.shape)
    rank = SHAPES[kind][0]
    lead = (batch, length) if kind == "tagging" else (batch,)
    if len(shape) != rank or shape[:rank - 1] != lead:
        hint = ""
        if kind != "causal-lm" and len(shape) == 3 and kind != "tagging":
            hint = " (a [B, T, ...] output: a token-level model; task.kind = \"tagging\"?)"
        elif kind == "tagging" and len(shape) == 2:
            hint = " (one output per row: task.kind = \"classification\" or \"embedding\"?)"
        raise InputError(f"{where} shape {list(shape)}{hint}.")
    if out.dtype not in (ms.float16, ms.float32, ms.float64, ms.bfloat16):
        raise InputError(f"{where} dtype {out.dtype}.")
    last = int(shape[-1])
    if kind != "embedding":
        if last < 2:
            raise InputError(f"{where} {last} class: a classifier needs at least 2.")
        if labels is not None and last != len(labels):
            raise InputError(f"For 'task.labels', the model returns {last} classes (shape "
                             f"{list(shape)}), so the list must name {last}, but got "
                             f"{len(labels)}: {labels}.")
    return last


def _triplets(cfg, objective) -> bool:
    """Whether the embedding rows are called as triplets: every row has a negative and the
    objective's construct takes one (bound by its signature, `tasks.takes_negative`)."""
    try:
        rows = tasks.read_rows(cfg, "align") or tasks.read_rows(cfg, "scores")
    except InputError:
        return False  # the rows' own errors are reported where they are read
    return bool(rows) and all(r.negative is not None for r in rows) and tasks.takes_negative(objective)


def negatives_unused(ctx) -> bool:
    """The embedding rows carry negatives that the objective's (anchor, positive) construct does
    not take: every check reads the rows as pairs (`_as_called`), and the report says so."""
    return ctx.config.task.kind == "embedding" and not tasks.takes_negative(ctx.target.objective)


def _as_called(ctx, rows: list[tasks.TaskRow]) -> list[tasks.TaskRow]:
    """The rows as the objective is called: an embedding row's negative dropped when its
    construct takes (anchor, positive) only (NEGATIVE_UNUSED, the choice the report states)."""
    from dataclasses import replace

    if rows and negatives_unused(ctx) and any(r.negative is not None for r in rows):
        return [replace(r, negative=None, meta={**r.meta, "negative_unused": True}) for r in rows]
    return rows


def check_target(target, engine) -> dict[str, Any]:
    """The kind's contract on a [batch_size, 8] batch of token 0; records it on the target."""
    import mindspore as ms

    from objdebug.pipeline.contract import _check_objective

    cfg = target.config
    kind = cfg.task.kind
    if target.model is None:
        raise InputError(f"For 'task.kind', the kind \"{kind}\" needs a [model] section (the "
                         f"split form: model output, then the objective on it); the end-to-end "
                         f"form is checked as a causal LM only.", source=cfg.source)
    batch, length = engine.batch_size, PROBE_LENGTH
    ids = np.zeros((batch, length), np.int32)
    info: dict[str, Any] = {"kind": kind, "batch": batch, "length": length}
    if kind == "tagging" and tasks.takes_mask(target.objective):
        # a CRF called (emissions, tags, mask): every graph calls it through one adapter that
        # derives the mask from the tags (label_pad_id: padding, later word pieces)
        target.objective = tasks.with_mask(target.objective, cfg.data.label_pad_id)
        info["mask"] = f"derived: tags != {cfg.data.label_pad_id}"
    try:
        out = tasks.forward(engine, ids)
        last = check_output(out, kind, batch, length, cfg.task.labels)
        info["classes" if kind != "embedding" else "dim"] = last
        info["output_dtype"] = str(out.dtype)
        if kind == "embedding":  # triplets when the rows have negatives: loss(anchor, positive, negative)
            three = _triplets(cfg, target.objective)
            if not tasks.takes_negative(target.objective):
                info["negative"] = tasks.NEGATIVE_UNUSED
            result = tasks.pair_objective(engine, out, out, out if three else None)
        else:
            labels = ms.Tensor(np.zeros(out.shape[:-1], np.int32))
            result = tasks.objective(engine, out, labels)
    except InputError:
        raise
    except Exception as exc:
        err = compile_error(exc, target)
        if err is not None:
            raise err from None
        raise ContractError(f"the target ({kind}) fails on a [{batch}, {length}] probe batch of "
                            f"token 0: {type(exc).__name__}: {first_line(str(exc))} (run with "
                            f"--debug for the full message)", detail=str(exc)) from None
    k = int(result.shape[-1])
    if k != 1 + len(cfg.objective.components):
        _check_objective(tuple(result[i] for i in range(k)) if k > 1 else result[0],
                         list(cfg.objective.components), f"task.kind = '{kind}'")
    info["outputs"] = k
    target.info["contract"] = info
    return info


# --------------------------------------------------------------------------- shared run data
def classes(ctx) -> int:
    """C (classification) or K (tagging) as the contract probe measured it."""
    info = ctx.target.info.get("contract") or {}
    if "classes" not in info:
        info = check_target(ctx.target, ctx.engine)  # a check run alone (tests): probe now
    return int(info["classes"])


def align_rows(ctx) -> list[tasks.TaskRow]:
    """The kind's `[data] align` rows, read once per run (labels checked against C)."""
    return ctx.provide(align_rows, lambda: _as_called(ctx, tasks.read_rows(
        ctx.config, "align", ctx.config.data.vocab_size,
        None if ctx.config.task.kind == "embedding" else classes(ctx))))


def score_rows(ctx) -> list[tasks.TaskRow]:
    return ctx.provide(score_rows, lambda: _as_called(ctx, tasks.read_rows(
        ctx.config, "scores", ctx.config.data.vocab_size,
        None if ctx.config.task.kind == "embedding" else classes(ctx))))


def outputs_of(ctx, rows: list[tasks.TaskRow]) -> np.ndarray:
    """The model's outputs on rows' ids, float64 ([N, C] / [N, T, K] / [N, D]); padded per
    batch of engine.batch_size to the bucket of the longest row (`tasks.bucket`)."""
    pad = ctx.engine.padding.pad_id if hasattr(ctx.engine, "padding") else ctx.config.data.pad_id
    parts = []
    length = tasks.bucket(max(len(r.ids) for r in rows))
    for i in range(0, len(rows), ctx.engine.batch_size):
        chunk = rows[i:i + ctx.engine.batch_size]
        parts.append(tasks.forward(ctx.engine, tasks.pad([r.ids for r in chunk], pad, length))
                     .asnumpy().astype(np.float64))
    return np.concatenate(parts)


def grad_rows(ctx) -> list[tasks.TaskRow]:
    """The gradient batch of the kind's checks: the first batch_size align rows (scores rows
    when there is no align file)."""
    rows = align_rows(ctx) or score_rows(ctx)
    return rows[:ctx.engine.batch_size]


# --------------------------------------------------------------------------- losses and gradients
def texts(ctx, rows, length: int) -> list[np.ndarray]:
    """The rows' ids [B, length] (embedding: one array per text: anchor, positive[, negative])."""
    pad = ctx.engine.padding.pad_id
    if ctx.config.task.kind == "embedding":
        seqs = [[r.ids for r in rows], [r.positive for r in rows]]
        if all(r.negative is not None for r in rows):
            seqs.append([r.negative for r in rows])
        return [tasks.pad(s, pad, length) for s in seqs]
    return [tasks.pad([r.ids for r in rows], pad, length)]


def labels_of(ctx, rows, length: int) -> np.ndarray:
    """Classification: the labels [B]; tagging: the tags [B, length], `label_pad_id` on padding."""
    if ctx.config.task.kind == "classification":
        return np.array([r.target for r in rows], np.int32)
    return tasks.pad([r.target for r in rows], ctx.config.data.label_pad_id, length)


def batch_loss(ctx, rows, length: int) -> float:
    """The objective's total on `rows` padded to `length`, forward only (the shared graphs)."""
    import mindspore as ms

    ids = texts(ctx, rows, length)
    outs = [tasks.forward(ctx.engine, i) for i in ids]
    if ctx.config.task.kind == "embedding":
        return float(tasks.pair_objective(ctx.engine, *outs).asnumpy()[0])
    return float(tasks.objective(ctx.engine, outs[0], ms.Tensor(labels_of(ctx, rows, length))).asnumpy()[0])


def loss_and_param_grads(ctx, rows, length: int) -> tuple[float, list[np.ndarray]]:
    """(the objective's total, d total / d each model parameter float64) on `rows` padded to
    `length`: the objective's gradient w.r.t. the model's output (`task.logit_grad`, or
    `task.pair_grad` for embeddings) carried back by the shared `model.vjp`; every text of an
    embedding row goes through the model, so its gradients add up."""
    import mindspore as ms

    engine = ctx.engine
    ids = texts(ctx, rows, length)
    outs = [tasks.forward(engine, i) for i in ids]
    if ctx.config.task.kind == "embedding":
        outputs, cots = tasks.pair_grad(engine, *outs)
    else:
        outputs, cot = tasks.logit_grad(engine, outs[0], ms.Tensor(labels_of(ctx, rows, length)))
        cots = [cot]
    grads = None
    for i, g in zip(ids, cots):
        part = tasks.param_grad(engine, i, g)[1]
        grads = part if grads is None else [a + b for a, b in zip(grads, part)]
    return float(outputs[0]), grads
