"""The stress cases on a `[task] kind` other than the causal LM (issue 47): the same measurements
as the causal LM's cases, so the same codes and the same conditions, on the kind's rows and
graphs (engine/tasks.py: the shared `model.forward` / `model.vjp`, `task.objective`,
`task.logit_grad`, and for embeddings `task.pair_grad`).

- all padding (OBJ503), the kind's own case (engine/kinds.py): tagging (and a classifier whose
  objective declares an ignore_index), one row of `short_length` pad ids whose label (every tag)
  is `label_pad_id`: the loss must be 0 and finite, the gradients finite; classification
  otherwise, the gradient rows' ids all padding with their real labels (an all-padding *input*:
  no label of a classifier is ever ignored), finite; embedding, the gradient rows with every text all padding (an empty text: a mean pooling that
  divides by the count of real tokens, a cosine of a zero vector): loss and gradients finite.
- padding invariance (OBJ504, every kind): the first `batch_size` align rows padded to their
  longest length + 0, + each `pad_extra`: loss and parameter gradients must not move.
- extreme outputs (OBJ508, every kind): the objective on the model's outputs times each of
  `logit_scales`, float32: finite.
- low precision (OBJ509, every kind): the same outputs in float16 / bfloat16 against float32.
- random ids (OBJ505, every kind): the gradient rows with their ids drawn at random from the input
  vocabulary (each text at its own length; the labels and tags kept): loss and gradients finite,
  and for classification and tagging the mean per-row loss at least `random_ids_min_ratio` x the
  chance level of labels the input says nothing about: the entropy of the rows' (class-weighted)
  label distribution, the least any prediction independent of the input scores (cross-entropy >=
  entropy). A contrastive objective's chance level depends on its form (log B in-batch, the
  margin for a triplet): only finiteness is judged there.
- out-of-range ids (OBJ506, OBJ507, every kind): the causal LM's probes (garbage_ids.py) on the
  random rows: input ids V and -1 in row 0's first text through `model.forward`, then `model.vjp`;
  labels C and -1 (classification: row 0's label; tagging: one tag) into the objective alone on
  the model's outputs, `task.objective` then `task.logit_grad`; an embedding row has no label.
- long inputs (OBJ501, OBJ502, every kind): row 0's text (tags with it) repeated to each
  `long_lengths` length (capped at the model's position limit), batch 1; embeddings: every
  gradient row's texts so repeated (an in-batch loss of one row is a constant): loss and
  gradients finite, the loss within the band of the same construction at `short_length`. A length
  whose static memory estimate x `memory_safety` exceeds what is available is not run (SKIP);
  one the objective's graph cannot take (an unrolled CRF past MindSpore's call depth) is a note
  naming the error: a clear error, not a wrong loss.
- determinism (OBJ510, OBJ511, every kind): the gradient rows evaluated twice; each of the first
  `batch_samples` rows run through the model in a batch of copies of itself against its outputs
  in the mixed batch: its loss (classification, tagging: the row alone through the objective) or,
  for embeddings, whose in-batch loss depends on the other rows by design, the batch's loss from
  embeddings each computed alone.

Every value has the keys the causal LM's conditions read, so each check keeps one judgement.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.engine import kinds, tasks
from objdebug.pipeline import task_kind
from objdebug.stages.stress._common import PROBE_POSITION, error_line, max_rel, rel_diff

CAUSAL_LM = tasks.CAUSAL_LM
ALL = kinds.NAMES


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
    """One row of pad ids, every label `label_pad_id` (classification, tagging); embedding: the
    gradient rows with every text (anchor, positive, negative) `short_length` pad ids, an empty
    text the pipeline let through (no label to mask: finiteness is what is judged)."""
    from objdebug.engine.tasks import TaskRow

    cfg = ctx.config.data
    length = int(th["short_length"])
    kind = tasks.kind_of(ctx.config)
    case = kinds.all_padding_case(ctx.config, ctx.target.objective)
    empty = [cfg.pad_id] * length
    if case == kinds.EMPTY_TEXTS:
        rows = [TaskRow(f"all-padding-{i}", 0, "", empty, positive=empty,
                        negative=None if r.negative is None else empty)
                for i, r in enumerate(task_kind.grad_rows(ctx))]
    elif case == kinds.PADDING_INPUT:  # a classifier's rows are never ignored: real labels kept
        rows = [TaskRow(f"all-padding-{i}", 0, "", empty, r.target)
                for i, r in enumerate(task_kind.grad_rows(ctx))]
    else:
        label = cfg.label_pad_id if kinds.of(kind).label == "row" else [cfg.label_pad_id] * length
        rows = [TaskRow("all-padding", 0, "", empty, label)]
    out = loss_and_grads(ctx, rows, length)
    out.pop("grads")
    return {"kind": kind, "case": case, "rows": len(rows), "length": length, "pad_id": cfg.pad_id,
            "label_pad_id": cfg.label_pad_id, **out}


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
            length_failures(ctx)[base + extra] = error_line(exc)[:200]
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


# --------------------------------------------------------------------------- OBJ505
def input_vocab(ctx) -> int | None:
    """The input vocabulary random ids are drawn from (the model's output is classes, tags or an
    embedding, not the vocabulary): `data.vocab_size`, else the rows of the model's input
    embedding, else a declared tokenizer's size (engine/vocabulary.py; never the byte
    tokenizer's 256 for a model that has more or fewer ids). Looked for once per run."""
    def build() -> int | None:
        from objdebug.engine import vocabulary

        if ctx.config.data.vocab_size:
            return int(ctx.config.data.vocab_size)
        found = vocabulary.embedding_of_target(ctx.target, 2, 8)
        if "vocab" in found:
            return int(found["vocab"])
        try:
            return vocabulary.declared(ctx.config)[0]
        except Exception:  # noqa: BLE001 - no tokenizer to read: the check skips saying so
            return None
    return ctx.provide(input_vocab, build)


def _texts_of(row) -> list[list[int]]:
    return [s for s in (row.ids, row.positive, row.negative) if s is not None]


def random_rows(ctx, th) -> list:
    """The gradient rows, every text's ids drawn uniformly from the input vocabulary less the
    pad id, at its own length; labels and tags kept."""
    from dataclasses import replace

    rng = np.random.default_rng(int(th["seed"]))
    vocab, pad = input_vocab(ctx), ctx.engine.padding.pad_id

    def draw(seq):
        if seq is None:
            return None
        ids = rng.integers(0, vocab - 1, len(seq))
        return [int(t) + int(t >= pad) for t in ids]  # never the pad id: the row keeps its length

    return [replace(r, id=f"random-{r.id}", ids=draw(r.ids), positive=draw(r.positive),
                    negative=draw(r.negative)) for r in task_kind.grad_rows(ctx)]


def _chance(ctx, rows, length: int) -> float | None:
    """The entropy (nats) of the rows' label distribution, class-weighted as the objective
    declares: the least cross-entropy a prediction that ignores the input can score."""
    classes = task_kind.classes(ctx)
    labels = task_kind.labels_of(ctx, rows, length).reshape(-1)
    labels_flat = labels[(labels >= 0) & (labels < classes)]
    if not labels_flat.size:
        return None
    weight, _ = tasks.declared_class_weight(ctx.config, ctx.target.objective, classes)
    mass = np.bincount(labels_flat, minlength=classes).astype(np.float64)
    if weight is not None and weight.size == classes:
        mass = mass * weight
    p = mass[mass > 0] / mass.sum()
    return float(-(p * np.log(p)).sum())


def best_constant_loss(ctx, rows, length: int, steps: int = 200) -> float | None:
    """The least loss a prediction that ignores the input scores on `rows`' labels, measured
    through the objective itself: one output vector z shared by every row (and position), fitted
    by gradient descent on the objective's own gradient (`task.logit_grad`, the gradients of
    every row summed into z's), from the class-weighted label frequencies' log (a cross-entropy's
    optimum, whose loss is the labels' entropy). A focal or smoothed loss has its own chance
    level: this is it. None when the rows score no label."""
    import mindspore as ms

    classes = task_kind.classes(ctx)
    labels = task_kind.labels_of(ctx, rows, length)
    flat = labels.reshape(-1)
    counts = np.bincount(flat[(flat >= 0) & (flat < classes)], minlength=classes).astype(np.float64)
    if not counts.sum():
        return None
    weight, _ = tasks.declared_class_weight(ctx.config, ctx.target.objective, classes)
    if weight is not None and weight.size == classes:
        counts = counts * weight  # a weighted cross-entropy's optimum: the weighted frequencies
    z = np.log(np.maximum(counts / counts.sum(), 1e-6))
    shape = labels.shape + (classes,)
    y = ms.Tensor(labels.astype(np.int32))

    def at(v):
        out, g = tasks.logit_grad(ctx.engine, ms.Tensor(np.broadcast_to(v, shape).astype(np.float32)), y)
        return float(out[0]), g.reshape(-1, classes).sum(0)

    best, grad = at(z)
    m, v, lr = np.zeros(classes), np.zeros(classes), 0.05
    for k in range(1, steps + 1):  # Adam: the scale of an arbitrary objective's gradient is unknown
        m = 0.9 * m + 0.1 * grad
        v = 0.999 * v + 0.001 * grad * grad
        z = z - lr * (m / (1 - 0.9 ** k)) / (np.sqrt(v / (1 - 0.999 ** k)) + 1e-12)
        loss, grad = at(z)
        if not np.isfinite(loss):
            break
        best = min(best, loss)
    return best


def informed_loss(ctx, rows, length: int) -> float | None:
    """The objective's loss when every row's output names its own label confidently (logits +s on
    the label, -s elsewhere, the least over s in 1, 3, 10; a smoothed loss is least at a moderate s):
    what knowing the label is worth, to compare with `best_constant_loss`."""
    import mindspore as ms

    classes = task_kind.classes(ctx)
    labels = task_kind.labels_of(ctx, rows, length)
    # +s on the label, -s elsewhere: a softmax sees s x one-hot (a shift changes nothing), one
    # sigmoid per class (a focal loss) sees every other class confidently off
    signs = 2.0 * np.eye(classes, dtype=np.float32)[np.clip(labels, 0, classes - 1)] - 1.0
    y = ms.Tensor(labels.astype(np.int32))
    losses = [float(tasks.objective(ctx.engine, ms.Tensor(signs * s), y).asnumpy()[0]) for s in (1.0, 3.0, 10.0)]
    finite = [x for x in losses if np.isfinite(x)]
    return min(finite) if finite else None


def random_ids(ctx, th) -> dict[str, Any]:
    rows = random_rows(ctx, th)
    length = tasks.bucket(max(len(s) for r in rows for s in _texts_of(r)))
    kind = tasks.kind_of(ctx.config)
    grad = loss_and_grads(ctx, rows, length)
    grad.pop("grads")
    out: dict[str, Any] = {"kind": kind, "vocab": input_vocab(ctx), "shape": [len(rows), length],
                           "grad_loss": grad["loss"], "grad_norm": grad["grad_norm"],
                           "nonfinite_params": grad["nonfinite_params"], "n_params": grad["n_params"]}
    if kind == "embedding":  # the batch's one in-batch loss
        losses = np.array([grad["loss"]])
        out["chance"] = None
    else:
        import mindspore as ms

        outputs = tasks.forward(ctx.engine, tasks.pad([r.ids for r in rows], ctx.engine.padding.pad_id, length))
        losses = tasks.per_row(ctx.engine, outputs, ms.Tensor(task_kind.labels_of(ctx, rows, length)))
        out["entropy"] = _chance(ctx, rows, length)
        out["chance"] = best_constant_loss(ctx, rows, length)
        out["informed"] = informed_loss(ctx, rows, length)
    return {**out, "losses": losses, "mean_loss": float(np.mean(losses)), "min_loss": float(np.min(losses))}


# --------------------------------------------------------------------------- OBJ510, OBJ511
def _row_losses(ctx, rows, length: int, outputs: list) -> np.ndarray:
    """Classification, tagging: each row's loss alone on `outputs` (the model's, one Tensor);
    embedding: the batch's in-batch loss on the texts' embeddings (one per text)."""
    import mindspore as ms

    if tasks.kind_of(ctx.config) == "embedding":
        return np.array([float(tasks.pair_objective(ctx.engine, *outputs).asnumpy()[0])])
    return tasks.per_row(ctx.engine, outputs[0], ms.Tensor(task_kind.labels_of(ctx, rows, length)))


def determinism(ctx, th) -> dict[str, Any]:
    import mindspore as ms

    rows = task_kind.grad_rows(ctx)
    pad, engine = ctx.engine.padding.pad_id, ctx.engine
    n_texts = len(_texts_of(rows[0]))
    length = tasks.bucket(max(len(s) for r in rows for s in _texts_of(r)))

    def texts(batch_rows):  # one [B, length] array per text: anchor, positive[, negative]
        return [tasks.pad([_texts_of(r)[k] for r in batch_rows], pad, length) for k in range(n_texts)]

    mixed = texts(rows)
    first = _row_losses(ctx, rows, length, [tasks.forward(engine, t) for t in mixed])
    second = _row_losses(ctx, rows, length, [tasks.forward(engine, t) for t in mixed])
    n_alone = min(int(th["batch_samples"]), len(rows))
    # each row through the model among copies of itself (as the engine fills a short batch)
    alone_out = [[tasks.forward(engine, t).asnumpy()[0] for t in texts([r] * len(rows))]
                 for r in (rows if tasks.kind_of(ctx.config) == "embedding" else rows[:n_alone])]
    if tasks.kind_of(ctx.config) == "embedding":
        stacked = [ms.Tensor(np.stack([a[k] for a in alone_out])) for k in range(n_texts)]
        alone, in_batch, ids = _row_losses(ctx, rows, length, stacked), first, ["the batch's in-batch loss"]
    else:
        alone = np.array([_row_losses(ctx, [r], length, [ms.Tensor(a[0][None])])[0]
                          for r, a in zip(rows, alone_out)])
        in_batch, ids = first[:n_alone], [r.id for r in rows[:n_alone]]
    return {"shape": [len(rows), length], "repeat_first": first, "repeat_second": second,
            "repeat_max_rel": max_rel(second, first), "sample_ids": ids, "in_batch": in_batch,
            "alone": alone, "batch_max_rel": max_rel(alone, in_batch)}


# --------------------------------------------------------------------------- OBJ506, OBJ507
def out_of_range_paths(ctx, th) -> dict[str, Any]:
    """What OutOfRangeIds probes on a kind: the random rows' first text `ids` [B, L] and `labels`
    (classification [B], tagging [B, L]; embedding: a placeholder [B]), the index each path's
    probe writes (`input_at`, `label_at`), and the graphs of each path, in order: (ids, labels)
    -> the loss of row 0 (embedding: the batch's in-batch loss). Every valid output the probes
    need is computed here, before any probe can make a graph raise."""
    import mindspore as ms

    engine, kind = ctx.engine, tasks.kind_of(ctx.config)
    rows = random_rows(ctx, th)
    length = tasks.bucket(max(len(s) for r in rows for s in _texts_of(r)))
    texts = task_kind.texts(ctx, rows, length)
    outs = [tasks.forward(engine, t) for t in texts]
    position = min(PROBE_POSITION, len(rows[0].ids) - 1)

    def row0(out, labels):  # the loss of row 0 (embedding: the batch's, the others' texts as they were)
        if kind == "embedding":
            return float(tasks.pair_objective(engine, out, *outs[1:]).asnumpy()[0])
        return float(tasks.objective(engine, out[:1], ms.Tensor(labels[:1])).asnumpy()[0])

    def through_vjp(i, l):  # the gradient path's own graph: the model's output of its VJP
        _, out, _ = tasks.vjp(engine, i, np.zeros(outs[0].shape, np.float32))
        return row0(out, l)

    paths: dict[str, Any] = {"vocab": input_vocab(ctx), "ids": texts[0], "input_at": (0, position),
                             "input_graphs": [lambda i, l: row0(tasks.forward(engine, i), l), through_vjp]}
    if kind == "embedding":
        return {**paths, "classes": None, "labels": np.zeros(len(rows), np.int32), "label_at": (0,),
                "label_graphs": None}
    labels = task_kind.labels_of(ctx, rows, length)

    def label_grad(_, l):
        return float(tasks.logit_grad(engine, outs[0][:1], ms.Tensor(l[:1]))[0][0])
    return {**paths, "classes": task_kind.classes(ctx), "labels": labels,
            "label_at": (0,) if kind == "classification" else (0, position),
            "label_graphs": [lambda _, l: row0(outs[0], l), label_grad]}


# --------------------------------------------------------------------------- OBJ501, OBJ502
def long_rows(ctx, length: int) -> list:
    """Row 0's text repeated to exactly `length` tokens (its tags with it, its label kept);
    embedding: every gradient row's texts so repeated."""
    from dataclasses import replace

    def fill(seq):
        return (list(seq) * (-(-length // len(seq))))[:length]

    rows = task_kind.grad_rows(ctx)
    kind = tasks.kind_of(ctx.config)
    if kind == "embedding":
        return [replace(r, id=f"long-{length}-{r.id}", ids=fill(r.ids), positive=fill(r.positive),
                        negative=None if r.negative is None else fill(r.negative)) for r in rows]
    r = rows[0]
    return [replace(r, id=f"long-{length}-{r.id}", ids=fill(r.ids),
                    target=r.target if kind == "classification" else fill(r.target))]


def length_failures(ctx) -> dict[int, str]:
    """length -> the error a kind's batch of that length raised in this run (padding invariance,
    long inputs): a longer input is not tried again (an unrolled CRF compiles for minutes before
    MindSpore's call-depth error)."""
    return ctx.provide(length_failures, dict)


def long_one(ctx, length: int) -> dict[str, Any]:
    import time

    import objdebug.stages.stress.memory as memory

    rows = long_rows(ctx, length)
    with memory.PeakRss() as rss:
        start = time.perf_counter()
        m = loss_and_grads(ctx, rows, length)
        seconds = time.perf_counter() - start
    return {"length": length, "rows": len(rows), "ran": True, "loss": m["loss"], "grad_norm": m["grad_norm"],
            "nonfinite_params": m["nonfinite_params"], "n_params": m["n_params"], "seconds": seconds,
            "peak_rss_bytes": rss.peak_bytes, "peak_delta_bytes": rss.delta_bytes,
            "memory_method": rss.method}


def _long_bytes(rows: int, length: int, width: int, n_params: int, shape: dict[str, Any], th) -> int:
    """memory.estimate_bytes' terms for `rows` texts of `length` tokens, the output `width` per
    token (tag scores; 1 for a pooled output), at least one layer of activations (a model with no
    attention Cell still holds its embeddings)."""
    t = int(length)
    per_row = (th["memory_logits_copies"] * t * width
               + th["memory_attention_copies"] * shape["layers"] * shape["heads"] * t * t
               + th["memory_activation_copies"] * max(shape["layers"], 1) * t * shape["width"])
    return int(4 * (rows * per_row + 3 * n_params))


def long_inputs(ctx, th, lengths: list[int], reference: dict[str, Any] | None = None) -> dict[str, Any]:
    """The value LongInputs' conditions read, measured on the kind's rows (see the docstring);
    `reference`: the short length's, taken when the stage started (LongInputs.prepare), before
    the out-of-range probes retired the graphs it runs on."""
    from objdebug.engine import position_limit
    import objdebug.stages.stress.memory as memory

    kind = tasks.kind_of(ctx.config)
    width = task_kind.classes(ctx) if kind == "tagging" else 1  # per-token outputs (tag scores)
    n_params = sum(int(p.size) for p in ctx.target.trainable_params())
    shape = memory.model_shape(ctx.target.model, input_vocab(ctx) or 0, th)
    if "layers" not in shape["from_model"]:  # no attention Cell found: no T^2 term to assume
        shape.update(layers=0, heads=0)
    safety = float(th["memory_safety"])
    reference = reference or long_one(ctx, position_limit.cap(int(th["short_length"]), ctx))
    out: dict[str, Any] = {"kind": kind, "reference": reference, "vocab": width, "model_shape": shape,
                           "memory_safety": safety, "lengths": {}, "calibration": None,
                           "longest_fitting": None}
    for asked, length in sorted(position_limit.capped_lengths(lengths, ctx).items()):
        need = _long_bytes(len(long_rows(ctx, 1)), length, width, n_params, shape, th)
        avail = memory.available_bytes()
        row: dict[str, Any] = {"length": length, "estimate_bytes": need, "static_estimate_bytes": need,
                               "estimate_from": "static estimate", "fit_lengths": None,
                               "available_bytes": avail}
        failed = min((t for t in length_failures(ctx) if t <= length), default=None)
        if failed is not None:  # a shorter (or this) length raised already: a longer one is not tried
            row.update(ran=False, raised=True, reason=(f"T={failed} raised already in this run "
                                                       f"({length_failures(ctx)[failed]}), not tried"))
        elif avail is not None and need * safety > avail:
            row.update(ran=False, reason=(f"estimated {need / memory.GIB:.2f} GiB x safety {safety} > "
                                          f"{avail / memory.GIB:.2f} GiB available"))
        else:
            try:
                row.update(long_one(ctx, length))
            except Exception as exc:  # noqa: BLE001 - a length the model or objective cannot take
                from objdebug.core.interrupts import raise_swallowed

                raise_swallowed()
                length_failures(ctx)[length] = error_line(exc)[:200]
                row.update(ran=False, raised=True, reason=f"raises: {error_line(exc)[:200]}")
        if row["ran"]:
            row["ratio"] = (row["loss"] / reference["loss"]
                            if reference["loss"] != 0.0 and np.isfinite(reference["loss"]) else float("nan"))
        if asked != length:
            row.update(asked=asked, capped_to=length, note=position_limit.note(asked, length, ctx))
        out["lengths"][str(asked)] = row
    return out
