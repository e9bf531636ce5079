"""Task kinds beyond next-token prediction (`[task] kind`, issue 47): their rows, their shapes and
the shared graphs their checks call.

A kind fixes what the model returns and what the objective takes:

| kind | model output | objective call |
|---|---|---|
| causal-lm | logits [B, T, V] | loss(logits, labels [B, T]) (the rest of the engine) |
| classification | logits [B, C] | loss(logits, labels [B]) |
| tagging | emissions [B, T, K] | loss(emissions, tags [B, T]) |
| embedding | embeddings [B, D] per text | loss(anchor [B, D], positive [B, D][, negative [B, D]]) |

Rows live under the causal LM's keys (`[data] align`, `[data] scores`); their fields are the
kind's (`ROW_FIELDS` in engine/data.py). A row the kind cannot use (a label outside `[task]
labels`, a tag sequence of another length than its tokens, a pair without its positive) is an
InputError naming file and line, raised before MindSpore starts (`preflight`, from api.prepare).

Every evaluation goes through the engine's graphs: the model through the shared `model.forward`
(dynamic shapes: any output rank), its parameter gradient through `model.vjp` (`cells.ModelVJP`,
the cotangent at the output's rank), and the objective through `task.objective` (forward) and
`task.logit_grad` (its gradient w.r.t. the model's output), one dynamic-shape graph each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from objdebug.core.errors import InputError
from objdebug.engine.data import Encoder, make_tokenizer, read_jsonl

CAUSAL_LM = "causal-lm"
ANY_VOCAB = 1 << 62  # the model's vocabulary is unknown before the contract probe


@dataclass
class TaskRow:
    """One row of a task kind: `ids` (classification, tagging: the text; embedding: the
    anchor), `target` (classification: the class index; tagging: one tag per id, label_pad_id
    on the pieces after a token's first), `positive` / `negative` ids (embedding)."""

    id: str
    line: int
    source: str
    ids: list[int]
    target: Any = None
    positive: list[int] | None = None
    negative: list[int] | None = None
    score: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"


def kind_of(cfg) -> str:
    return getattr(getattr(cfg, "task", None), "kind", CAUSAL_LM)


def _index(value, names: list[str] | None, count: int | None, what: str, source: str, line: int) -> int:
    """A label / tag given as a name of `[task] labels` or an index into it -> the index."""
    if isinstance(value, str):
        if names is None:
            raise InputError(f"{what} {value!r} is a name, but the config has no [task] labels "
                             f"to look it up in; set task.labels = [...] in index order",
                             source=source, line=line)
        if value not in names:
            raise InputError(f"{what} {value!r} is not in the class list task.labels = {names}",
                             source=source, line=line)
        return names.index(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{what} must be a name or an integer index, but got {value!r}",
                         source=source, line=line)
    limit = len(names) if names is not None else count
    if value < 0 or (limit is not None and value >= limit):
        raise InputError(f"{what} {value} is outside the class list [0, {limit})"
                         + (f" (task.labels = {names})" if names else ""), source=source, line=line)
    return value


def _score(row: dict, required: bool, source: str, line: int) -> float | None:
    x = row.get("score")
    if x is None:
        if required:
            raise InputError("missing field 'score' (a data.scores row needs its human rating)",
                             source=source, line=line)
        return None
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(float(x)):
        raise InputError(f"field 'score' must be a finite number, but got {x!r}", source=source,
                         line=line)
    return float(x)


def _row_id(row: dict, line: int) -> str:
    rid = row.get("id")
    return str(rid) if rid is not None else f"line{line}"


def read_rows(cfg, what: str, vocab_size: int | None = None, classes: int | None = None) -> list[TaskRow]:
    """The rows of `[data] <what>` ("align" or "scores") for `[task] kind`; [] when unset."""
    path = getattr(cfg.data, what)
    if not path:
        return []
    kind = kind_of(cfg)
    names = cfg.task.labels
    enc = Encoder(tokenizer=make_tokenizer(cfg.data.tokenizer, cfg.base_dir),
                  vocab_size=vocab_size or ANY_VOCAB, source=str(path))
    out = []
    for line, row in read_jsonl(path, what, fields=kind):
        score = _score(row, what == "scores", str(path), line)
        rid = _row_id(row, line)
        if kind == "classification":
            ids = enc.field(row, "text", line, required=False) if "ids" not in row else \
                enc.field({"text_ids": row["ids"]}, "text", line)
            if ids is None:
                raise InputError("missing field 'text' (or 'ids')", source=str(path), line=line)
            if "label" not in row:
                raise InputError("missing field 'label' (a class name of task.labels or its index)",
                                 source=str(path), line=line)
            target = _index(row["label"], names, classes, "label", str(path), line)
            out.append(TaskRow(rid, line, str(path), ids, target, score=score, meta=row.get("meta") or {}))
        elif kind == "tagging":
            ids, target = _tagged(row, enc, names, classes, cfg.data.label_pad_id, str(path), line)
            out.append(TaskRow(rid, line, str(path), ids, target, score=score, meta=row.get("meta") or {}))
        elif kind == "embedding":
            anchor = enc.field(row, "anchor", line)
            positive = enc.field(row, "positive", line, required=False)
            if positive is None:
                raise InputError("the row has no 'positive' (or 'positive_ids'): an embedding row "
                                 "is an anchor with its positive (and an optional negative)",
                                 source=str(path), line=line)
            negative = enc.field(row, "negative", line, required=False)
            for name, ids in (("anchor", anchor), ("positive", positive), ("negative", negative)):
                if ids is not None and not ids:
                    raise InputError(f"field '{name}' is empty", source=str(path), line=line)
            out.append(TaskRow(rid, line, str(path), anchor, None, positive, negative, score,
                               row.get("meta") or {}))
        else:
            raise InputError(f"For 'task.kind', rows of kind {kind!r} are read by the causal-LM "
                             f"datasets, not here.")
    return out


def _tagged(row, enc, names, classes, pad, source, line) -> tuple[list[int], list[int]]:
    """(ids, one tag per id): `tokens` (words, each encoded; its tag on its first piece, the other
    pieces `label_pad_id`, as token-classification pipelines label subwords) or `ids` (one tag each)."""
    if "tags" not in row or not isinstance(row["tags"], list):
        raise InputError("missing field 'tags' (a list: one tag name or index per token)",
                         source=source, line=line)
    tags = row["tags"]
    if "ids" in row:
        ids = enc.field({"x_ids": row["ids"]}, "x", line)
        units = [[i] for i in ids]
        what = "ids"
    elif "tokens" in row:
        tokens = row["tokens"]
        if not isinstance(tokens, list) or not all(isinstance(t, str) and t for t in tokens):
            raise InputError("field 'tokens' must be a list of non-empty strings", source=source,
                             line=line)
        units = [enc.field({"t": (" " if k else "") + t}, "t", line) for k, t in enumerate(tokens)]
        what = "tokens"
    else:
        raise InputError("missing field 'tokens' (or 'ids')", source=source, line=line)
    if len(tags) != len(units):
        raise InputError(f"the tag sequence has {len(tags)} tags for {len(units)} {what}: one tag "
                         f"per {what[:-1]}", source=source, line=line)
    if not units:
        raise InputError(f"field '{what}' is empty", source=source, line=line)
    ids, target = [], []
    for unit, tag in zip(units, tags):
        k = _index(tag, names, classes, "tag", source, line)
        ids += unit
        target += [k] + [pad] * (len(unit) - 1)
    return ids, target


def preflight(cfg) -> None:
    """The kind's rows read before MindSpore starts: a bad row is exit 2 at once."""
    for what in ("align", "scores"):
        path = getattr(cfg.data, what)
        if path:
            read_rows(cfg, what)


# --------------------------------------------------------------------------- batches
def pad(seqs: list[list[int]], pad_id: int, length: int | None = None, fill: int | None = None) -> np.ndarray:
    """int32 [len(seqs), length]: right-padded with `fill` (default pad_id)."""
    length = length or max(len(s) for s in seqs)
    out = np.full((len(seqs), length), pad_id if fill is None else fill, np.int32)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = s[:length]
    return out


def bucket(n: int) -> int:
    """The next power of two >= n (at least 8): few shapes, one dynamic graph anyway."""
    return max(8, 1 << (max(n, 1) - 1).bit_length())


# --------------------------------------------------------------------------- graphs
def forward(engine, ids: np.ndarray):
    """The model's output Tensor on int32 ids [B, T], through the shared `model.forward`."""
    import mindspore as ms

    return engine.forward(ms.Tensor(np.asarray(ids, np.int32)))


def _specs(out, labels):
    import mindspore as ms

    return (ms.Tensor(shape=[None] * (len(out.shape) - 1) + [out.shape[-1]], dtype=out.dtype),
            ms.Tensor(shape=[None] * len(labels.shape), dtype=labels.dtype))


def objective(engine, out, labels, name: str = "task.objective"):
    """The objective's outputs float32[K] (total, components...) on Tensors (model output,
    labels), forward only: the dynamic graph `task.objective` (`name`: a graph of its own, for an
    output in another dtype or a call that may raise: a graph that raised refuses later calls)."""
    from objdebug.engine import dynamic_graph
    from objdebug.engine.cells import ObjectiveForward

    return dynamic_graph.call(engine, name, lambda: ObjectiveForward(engine.target.objective),
                              _specs(out, labels), out, labels)


def per_row(engine, out, labels) -> np.ndarray:
    """The objective on each row alone (a batch of one, as a training step of one row calls it)
    -> float64[B]: the per-sample loss of align, correlate and the stress cases."""
    return np.array([float(objective(engine, out[b:b + 1], labels[b:b + 1]).asnumpy()[0])
                     for b in range(int(out.shape[0]))], np.float64)


def logit_grad(engine, out, labels) -> tuple[np.ndarray, np.ndarray]:
    """(outputs float64[K], dL/d(model output) float64, the output's shape) through
    `task.logit_grad`: the objective's own gradient w.r.t. what the model returned."""
    import mindspore as ms

    from objdebug.engine import dynamic_graph
    from objdebug.engine.gradients import ObjectiveLogitGrad

    scale = ms.Tensor(1.0, ms.float32)
    specs = _specs(out, labels) + (ms.Tensor(shape=[], dtype=ms.float32),)
    outputs, g, _, _ = dynamic_graph.call(engine, "task.logit_grad",
                                          lambda: ObjectiveLogitGrad(engine.target.objective, False),
                                          specs, out, labels, scale)
    return outputs.asnumpy().astype(np.float64), g.asnumpy().astype(np.float64)


def param_grad(engine, ids: np.ndarray, cotangent: np.ndarray) -> tuple[list[str], list[np.ndarray]]:
    """dL/dparams from dL/d(model output) through the shared `model.vjp` graph (any output rank)
    -> (names, float64 gradients) of the model's trainable parameters."""
    names, _, grads = vjp(engine, ids, cotangent)
    return names, [g.asnumpy().astype(np.float64) for g in grads]


def vjp(engine, ids: np.ndarray, cotangent: np.ndarray) -> tuple[list[str], Any, tuple]:
    """The shared `model.vjp` graph on int32 ids and dL/d(model output) -> (the trainable
    parameters' names, the model's output Tensor, the gradient Tensors)."""
    import mindspore as ms

    from objdebug.engine import dynamic_graph
    from objdebug.engine.cells import ModelVJP
    from objdebug.engine.gradients import MODEL_VJP

    model = engine.target.model
    params = list(model.trainable_params())
    cot = ms.Tensor(np.asarray(cotangent, np.float32))
    spec = (ms.Tensor(shape=[None, None], dtype=ms.int32),
            ms.Tensor(shape=[None] * (cot.ndim - 1) + [cot.shape[-1]], dtype=ms.float32))
    out, grads = dynamic_graph.call(engine, MODEL_VJP, lambda: ModelVJP(model, params), spec,
                                    ms.Tensor(np.asarray(ids, np.int32)), cot)
    return [p.name for p in params], out, tuple(grads)


# --------------------------------------------------------------------------- settings
WEIGHT_KEYS = ("class_weight", "weight", "weights", "class_weights")


def declared_class_weight(cfg, objective_cell, classes: int) -> tuple[np.ndarray | None, str]:
    """The weight each class should get, index order, and where it was read: `[task]
    class_weight` (by name or index), else the objective's kwargs, else its Cell's attribute
    (`weight`, `class_weight`, ...). (None, "") when nothing declares one."""
    w = cfg.task.class_weight
    if w is not None:
        if isinstance(w, dict):
            names = cfg.task.labels or []
            vec = np.ones(classes)
            for k, v in w.items():
                vec[names.index(k)] = float(v)
            return vec, "task.class_weight"
        return np.asarray(w, np.float64), "task.class_weight"
    for key in WEIGHT_KEYS:
        if cfg.objective.kwargs.get(key) is not None:
            return np.asarray(cfg.objective.kwargs[key], np.float64).reshape(-1), f"objective.kwargs.{key}"
    for key in WEIGHT_KEYS:
        value = getattr(objective_cell, key, None)
        if value is None or isinstance(value, (str, bool)):
            continue
        try:
            arr = np.asarray(value.asnumpy() if hasattr(value, "asnumpy") else value, np.float64)
        except (TypeError, ValueError):
            continue
        if arr.ndim == 1 and arr.size == classes:
            return arr, f"{type(objective_cell).__name__}.{key}"
    return None, ""


def _pair_cell(objective, three: bool):
    from mindspore import nn

    from objdebug.engine.cells import as_outputs

    class PairForward(nn.Cell):
        """(anchor [B, D], positive [B, D], negative [B, D]) -> the objective's outputs float32[K];
        the negative is passed only when the rows have one (`three`)."""

        def __init__(self):
            super().__init__(auto_prefix=False)
            self.objective = objective

        def construct(self, a, p, n):
            return as_outputs(self.objective(a, p, n) if three else self.objective(a, p))[1]

    return PairForward()


def pair_objective_of(engine, cell, name, anchor, positive, negative=None):
    """`pair_objective` on another objective Cell (a variant with one setting changed), through
    a graph of its own (`name`): the configured objective's graph never sees it."""
    import mindspore as ms

    from objdebug.engine import dynamic_graph

    three = negative is not None
    spec = ms.Tensor(shape=[None, anchor.shape[-1]], dtype=anchor.dtype)
    return dynamic_graph.call(engine, name, lambda: _pair_cell(cell, three), (spec, spec, spec),
                              anchor, positive, negative if three else anchor)


def pair_objective(engine, anchor, positive, negative=None):
    """An embedding objective's outputs float32[K] on embeddings [B, D] (anchor, positive and,
    for triplets, negative): the dynamic graph `task.objective.pair` / `.triplet`."""
    import mindspore as ms

    from objdebug.engine import dynamic_graph

    three = negative is not None
    name = "task.objective." + ("triplet" if three else "pair")
    spec = ms.Tensor(shape=[None, anchor.shape[-1]], dtype=anchor.dtype)
    return dynamic_graph.call(engine, name, lambda: _pair_cell(engine.target.objective, three),
                              (spec, spec, spec), anchor, positive,
                              negative if three else anchor)


def _pair_grad_cell(objective, three: bool):
    import mindspore as ms
    from mindspore import nn, ops

    forward = _pair_cell(objective, three)

    class PairGrad(nn.Cell):
        """(anchor, positive, negative) -> (outputs float32[K], d total / d each embedding)."""

        def __init__(self):
            super().__init__(auto_prefix=False)
            self.forward = forward
            self.grad = ops.GradOperation(get_all=True)

        def total(self, a, p, n):
            return self.forward(a, p, n)[0]

        def construct(self, a, p, n):
            return self.forward(a, p, n), self.grad(self.total)(a, p, n)

    del ms
    return PairGrad()


def pair_grad(engine, anchor, positive, negative=None) -> tuple[np.ndarray, list[np.ndarray]]:
    """An embedding objective's outputs and its gradient w.r.t. each embedding [B, D] (anchor,
    positive[, negative]) as float64: the dynamic graph `task.pair_grad`. With `param_grad` on
    each text's ids, the parameter gradient of one contrastive step."""
    import mindspore as ms

    from objdebug.engine import dynamic_graph

    three = negative is not None
    name = "task.pair_grad." + ("triplet" if three else "pair")
    spec = ms.Tensor(shape=[None, anchor.shape[-1]], dtype=anchor.dtype)
    outputs, grads = dynamic_graph.call(engine, name, lambda: _pair_grad_cell(engine.target.objective, three),
                                        (spec, spec, spec), anchor, positive,
                                        negative if three else anchor)
    grads = [g.asnumpy().astype(np.float64) for g in grads[:3 if three else 2]]
    return outputs.asnumpy().astype(np.float64), grads


def takes_negative(objective) -> bool:
    """Whether an embedding objective's construct takes a third text, the negative: (anchor,
    positive, negative). A construct of two, (anchor, positive), is an in-batch loss: every
    other row's positive is its negative (sentence-transformers' MultipleNegativesRankingLoss
    called on pairs, OpenCLIP's ClipLoss); an unreadable signature is taken as it is called."""
    import inspect

    try:
        params = list(inspect.signature(type(objective).construct).parameters.values())[1:]
    except (TypeError, ValueError):
        return True
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    return len([p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]) >= 3


NEGATIVE_UNUSED = ("the rows' negatives are unused: the objective's construct takes (anchor, "
                   "positive), an in-batch loss whose negatives are the other rows' positives")


# --------------------------------------------------------------------------- a CRF with a mask
def takes_mask(objective) -> bool:
    """Whether a tagging objective's construct takes a third input, the mask: (emissions, tags,
    mask), as CRF layers (pytorch-crf's, MindNLP's) are called."""
    import inspect

    try:
        params = list(inspect.signature(objective.construct).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 3 and positional[2].default is inspect.Parameter.empty


def with_mask(objective, ignore: int):
    """The objective as every graph calls a tagging objective, (emissions, tags) -> loss: the
    scored positions (the tags that are not `ignore`: not padding, not a later word piece) packed
    to the front of each row with their emissions, the mask the prefix they fill (the first
    position always on), the rest tag 0 (a valid index), as a token-classification head feeds
    its CRF layer the first piece of each word. The Cell keeps the
    objective's parameter names and its `decode` (Viterbi, OBJ225)."""
    import mindspore as ms
    from mindspore import nn, ops

    class TagsAndMask(nn.Cell):
        MASK_ADAPTER = True  # decode_inputs reads the wrapped objective's decode

        def __init__(self):
            super().__init__(auto_prefix=False)
            self.objective = objective
            self.ignore = ignore

        def construct(self, emissions, tags):
            # the scored positions packed to the front, in order, the mask a prefix: a CRF layer
            # (pytorch-crf's) reads its mask as each row's length (`seq_ends = mask.sum - 1`,
            # the first column on), as token-classification heads feed it the first piece of
            # each word; the transitions then join consecutive scored positions, as in CRFLoss
            mask = tags != self.ignore
            steps = tags.shape[1]
            pos = ops.arange(0, steps, dtype=ms.int32).reshape((1, -1))
            key = ops.where(mask, pos, pos + steps).astype(ms.float32)
            _, order = ops.sort(key, 1)
            order = order.astype(ms.int32)
            packed = ops.gather_d(emissions, 1, ops.broadcast_to(order.expand_dims(2), emissions.shape))
            kept = ops.gather_d(ops.where(mask, tags, ops.zeros_like(tags)), 1, order)
            count = mask.astype(ms.int32).sum(1, keepdims=True)
            prefix = pos < ops.maximum(count, ops.ones_like(count))  # pytorch-crf: the first on
            return self.objective(packed, ops.where(prefix, kept, ops.zeros_like(kept)), prefix)

        def decode(self, emissions):
            return call_decode(self.objective, emissions)

    cell = TagsAndMask()
    if not hasattr(objective, "decode"):
        del TagsAndMask.decode
    return cell


def decode_inputs(objective) -> tuple[list[str] | None, str]:
    """What the objective's `decode` (Viterbi) takes after the emissions, read from its
    signature: ([], "") for decode(emissions), (["mask"], "") for pytorch-crf's decode(emissions,
    mask) (a mask of ones is passed: every position scored), (None, why) for a decode that takes
    a required input objdebug cannot build, or none at all."""
    import inspect

    if getattr(type(objective), "MASK_ADAPTER", False):
        objective = objective.objective
    decode = getattr(objective, "decode", None)
    if not callable(decode):
        return None, "the objective has no decode(emissions): no Viterbi to check"
    try:
        params = list(inspect.signature(decode).parameters.values())
    except (TypeError, ValueError):
        return [], ""
    required = [p.name for p in params[1:] if p.default is inspect.Parameter.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    unknown = [n for n in required if "mask" not in n]
    if unknown:
        return None, (f"{type(objective).__name__}.decode takes {[p.name for p in params]}: "
                      f"objdebug builds the emissions and a mask only, not {unknown}; the Viterbi "
                      f"path is not checked")
    return required, ""


def call_decode(objective, emissions):
    """objective.decode on emissions [B, T, K], with a mask of ones [B, T] for each mask input its
    signature requires (`decode_inputs`)."""
    import mindspore as ms

    if getattr(type(objective), "MASK_ADAPTER", False):
        objective = objective.objective  # the CRF layer's own decode, as decode_inputs read it
    needs, why = decode_inputs(objective)
    if needs is None:
        raise TypeError(why)
    mask = ms.Tensor(np.ones(tuple(emissions.shape[:2]), np.bool_))
    return objective.decode(emissions, *[mask for _ in needs])
