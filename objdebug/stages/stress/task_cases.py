"""The stress cases on a `[task] kind` other than the causal LM (issue 47): the same measurements
as the causal LM's cases, so the same codes and the same conditions, on the kind's rows and
graphs (engine/tasks.py: the shared `model.forward` / `model.vjp`, `task.objective`,
`task.logit_grad`, and for embeddings `task.pair_grad`).

- all padding (OBJ503, classification and tagging): one row of `short_length` pad ids whose
  label (every tag) is `label_pad_id`: the loss must be 0 and finite, the gradients finite.
- padding invariance (OBJ504, every kind): the first `batch_size` align rows padded to their
  longest length + 0, + each `pad_extra`: loss and parameter gradients must not move.
- extreme outputs (OBJ508, every kind): the objective on the model's outputs times each of
  `logit_scales`, float32: finite.
- low precision (OBJ509, every kind): the same outputs in float16 / bfloat16 against float32.

Every value has the keys the causal LM's conditions read, so each check keeps one judgement.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.engine import tasks
from objdebug.pipeline import task_kind
from objdebug.stages.stress._common import error_line, rel_diff

CAUSAL_LM = tasks.CAUSAL_LM
ALL = (CAUSAL_LM, "classification", "tagging", "embedding")


def is_task(ctx) -> bool:
    return tasks.kind_of(ctx.config) != CAUSAL_LM


def no_rows(ctx) -> str | None:
    """Why a kind's case cannot run (None: it can): the cases draw on the align / scores rows."""
    if is_task(ctx) and not (ctx.config.data.align or ctx.config.data.scores):
        return f"no {tasks.kind_of(ctx.config)} rows: set data.align (or data.scores) to the kind's JSONL"
    return None


def loss_and_grads(ctx, rows, length: int) -> dict[str, Any]:
    """The objective's loss and the model's parameter gradients (one float64 vector) on `rows`
    padded to `length` (pipeline/task_kind.py: the kind's graphs)."""
    loss, grads = task_kind.loss_and_param_grads(ctx, rows, length)
    flat = np.concatenate([g.ravel() for g in grads])
    bad = sum(int(not np.isfinite(g).all()) for g in grads)
    return {"loss": loss, "grad_norm": float(np.linalg.norm(flat)), "nonfinite_params": bad,
            "n_params": len(grads), "grads": flat}


# --------------------------------------------------------------------------- OBJ503
def all_padding(ctx, th) -> dict[str, Any]:
    """One row of pad ids, every label `label_pad_id` (classification, tagging)."""
    from objdebug.engine.tasks import TaskRow

    cfg = ctx.config.data
    length = int(th["short_length"])
    target = cfg.label_pad_id if tasks.kind_of(ctx.config) == "classification" else [cfg.label_pad_id] * length
    row = TaskRow("all-padding", 0, "", [cfg.pad_id] * length, target)
    out = loss_and_grads(ctx, [row], length)
    out.pop("grads")
    return {"length": length, "pad_id": cfg.pad_id, "label_pad_id": cfg.label_pad_id, **out}


# --------------------------------------------------------------------------- OBJ504
def padding_invariance(ctx, th) -> dict[str, Any]:
    rows = task_kind.grad_rows(ctx)
    if tasks.kind_of(ctx.config) == "embedding":
        base = max(len(s) for r in rows for s in (r.ids, r.positive, r.negative) if s is not None)
    else:
        base = max(len(r.ids) for r in rows)
    out_rows, ref, not_run = [], None, {}
    for extra in [0] + sorted({int(e) for e in th["pad_extra"]} - {0}):
        if not_run:
            not_run[str(extra)] = "beyond the longest length that ran"
            continue
        try:
            m = loss_and_grads(ctx, rows, base + extra)
        except Exception as exc:  # noqa: BLE001 - a length the objective's graph cannot take
            if ref is None:
                raise
            # a CRF written as a Python loop unrolls one graph step per position: MindSpore's call
            # depth limit (1000) stops it near 500 positions. The objective's limit, not padding's
            not_run[str(extra)] = (f"T={base + extra} does not run after T="
                                   f"{out_rows[-1]['length']} did: {error_line(exc)[:200]}")
            continue
        g = m["grads"]
        if ref is None:
            ref = m
        gdiff = float(np.linalg.norm(g - ref["grads"]) / max(np.linalg.norm(ref["grads"]), 1e-30)) \
            if np.all(np.isfinite(g)) and np.all(np.isfinite(ref["grads"])) else float("nan")
        out_rows.append({"extra_pad": extra, "length": base + extra, "loss": m["loss"],
                         "grad_norm": m["grad_norm"], "loss_rel_diff": rel_diff(m["loss"], ref["loss"]),
                         "grad_rel_diff": gdiff})
    extra_keys = {"not_run": not_run, "not_run_note": (
        "; the objective's graph cannot take that length (an unrolled loop per position?): "
        "padding invariance is judged on the lengths that ran")} if not_run else {}
    return {"tokens": base, "rows_in_batch": len(rows), "rows": out_rows, **extra_keys,
            "max_loss_rel_diff": float(np.max([r["loss_rel_diff"] for r in out_rows])),
            "max_grad_rel_diff": float(np.max([r["grad_rel_diff"] for r in out_rows]))}


# --------------------------------------------------------------------------- OBJ508, OBJ509
def outputs_batch(ctx):
    """(the model's float32 outputs on the gradient rows: a list, one per text for embeddings;
    labels or None), measured once per run."""
    def build():
        import mindspore as ms

        rows = task_kind.grad_rows(ctx)
        pad = ctx.engine.padding.pad_id
        if tasks.kind_of(ctx.config) == "embedding":
            triplet = all(r.negative is not None for r in rows)
            texts = [[r.ids for r in rows], [r.positive for r in rows]] + ([[r.negative for r in rows]] if triplet else [])
            return [tasks.forward(ctx.engine, tasks.pad(t, pad, tasks.bucket(max(map(len, t))))).asnumpy()
                    for t in texts], None
        length = tasks.bucket(max(len(r.ids) for r in rows))
        out = tasks.forward(ctx.engine, tasks.pad([r.ids for r in rows], pad, length)).asnumpy()
        return [out], ms.Tensor(task_kind.labels_of(ctx, rows, length))
    return ctx.provide(outputs_batch, build)


def loss_on(ctx, outputs: list[np.ndarray], labels, dtype: str) -> float:
    """The objective alone on `outputs` cast to `dtype` (a graph of its own per dtype)."""
    import mindspore as ms

    xs = [ms.Tensor(np.asarray(o, np.float32)).astype(getattr(ms, dtype)) for o in outputs]
    suffix = "" if dtype == "float32" else f".{dtype}"
    if tasks.kind_of(ctx.config) == "embedding":
        if dtype == "float32":
            return float(tasks.pair_objective(ctx.engine, *xs).asnumpy()[0])
        name = "task.objective." + ("triplet" if len(xs) == 3 else "pair") + suffix
        return float(tasks.pair_objective_of(ctx.engine, ctx.target.objective, name, *xs).asnumpy()[0])
    return float(tasks.objective(ctx.engine, xs[0], labels, name="task.objective" + suffix).asnumpy()[0])


def scaled_losses(ctx, scales: list[float]) -> dict[float, dict[str, Any]]:
    """The float32 loss at each scale of the outputs (OBJ508's rows, OBJ509's reference)."""
    def build():
        outputs, labels = outputs_batch(ctx)
        return {s: {"scale": s, "max_abs_logit": float(max(np.abs(o * s).max() for o in outputs)),
                    "loss": loss_on(ctx, [o * np.float32(s) for o in outputs], labels, "float32")}
                for s in scales}
    return ctx.provide(scaled_losses, build)


def shape(ctx) -> list[int]:
    return list(outputs_batch(ctx)[0][0].shape)
