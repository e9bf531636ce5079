"""Garbage token ids: random in-vocabulary ids (OBJ505) and out-of-range ids (OBJ506, OBJ507).

Random ids are unpredictable: a sound objective gives a finite loss near or above log(V) (an
untrained model sits at log(V), a trained one above it). On a `[task] kind` other than the causal
LM, the kind's rows with random ids and their own labels, against the labels' entropy
(task_cases.py).

Out-of-range ids: four probes, each one position of row 0 of a valid random batch: input id V,
input id -1, label V, label -1 (skipped when -1 is the label_pad_id). Three outcomes, judged
apart:

- rejected with an error: PASS (the healthy outcome);
- a NaN/Inf loss: FAIL (a bad id poisons the whole batch, and the step after it);
- a finite loss, silently scored: the profile's verdict (`[stress] label_out_of_range` /
  `input_out_of_range`, "info" by default). This is MindSpore's nature rather than an objective
  bug: GatherD accepts indices in [-V, V), so nn.CrossEntropyLoss and nearly every hand-written
  `gather_elements` cross-entropy score label -1 as class V-1, and every standard embedding
  (nn.Embedding, ops.gather) reads row V-1 for input id -1. The label the data pipeline actually
  writes is checked by OBJ105; a note here says the objective would not catch a wrong one.

What the probes cost (docs/performance.md): a MindSpore call that raises returns after a fixed
3 s on CPU (a hard-coded wait in the graph scheduler's error path) and its graph refuses every
later call, so the engine drops a graph that raised (`Engine.retire`) and compiles it again if it
is called again. The probes therefore run on graphs the run compiled already, on the batch
shapes those graphs have: the input probes on the random batch [B, T] through `model.forward` +
`objective.forward` (the loss of row 0), then, where the parameter gradient goes through the
model's VJP, through `model.vjp` on row 0 (its own forward's logits scored by the objective; else
the fused `objective.param_grad`); the label probes (split form; labels reach only the objective,
so the label facts are the same) on the model's logits of such a batch through
`objective.forward`, then through the dynamic `objective.logit_grad`. A probe that is rejected
moves the next probe of its path to the next graph, so no probe compiles a graph; the check runs
after every check of the stage that calls those graphs, so no later check pays for a dropped graph
either (one that did would compile it again: its result is never affected, only the compile
count). Only long inputs come after it: their lengths run on graphs of their own, and their short
reference is taken when the stage starts (long_inputs.py). Their process, started then, computes
through the waits below. Raising calls in parallel threads mix up their error
messages (MindSpore keeps one pending error per process), so they run one at a time. One raising
call can establish one rejection only (the first failing kernel stops the graph), so the calls
that raise are already the fewest: the -1 probe of each path runs before the V probe (-1 is the
one a standard MindSpore model accepts, and a graph that did not raise serves the next probe).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from objdebug.pipeline.context import Context
from objdebug.engine.data import Sample
from objdebug.core.findings import Check, Condition, Verdict
from objdebug.core.interrupts import raise_swallowed
from objdebug.core.settings import Settings
from objdebug.engine.gradients import objective_logit_grad
from objdebug.stages.stress._common import POISONED, PROBE_POSITION, error_line, loss_and_grad, packed, short_length
from objdebug.engine import position_limit, tasks
import objdebug.stages.stress.task_cases as task_cases

_NO_VOCAB_TASK = ("the input vocabulary is unknown (no tokenizer to read it from): set data.vocab_size "
                  "to draw random ids")
_NO_VOCAB = ("the vocabulary size is unknown (the end-to-end form does not expose logits): set "
             "data.vocab_size to draw random and out-of-range ids")


def _vocab_skip(ctx: Context) -> str | None:
    """SKIP, not ERROR, when the vocabulary the ids are drawn from is unknown."""
    return None if ctx.engine.vocab_size() else _NO_VOCAB


def random_batch(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    """[batch_size, T] uniformly random in-vocabulary ids, every next token scored, at the length
    of the model.forward graph the contract probe compiled (the planned bucket the stages use),
    so scoring them compiles nothing new; short_length where the probe ran no model."""
    def build():
        th = ctx.profile.section("stress")
        vocab = ctx.engine.vocab_size()
        length = position_limit.cap(int(ctx.target.info.get("contract", {}).get("length")
                                        or short_length(th)), ctx)
        if not vocab:
            raise ValueError("the vocabulary size is unknown: set data.vocab_size for the "
                             "end-to-end form")
        return _random_rows(ctx, ctx.engine.batch_size, length, int(th["seed"]))
    return ctx.provide(random_batch, build)


def random_row(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    """One [1, short_length] row of random ids (another draw): the gradient of random tokens, on
    the batch-1 graph the all-padding batch and the long-input reference share."""
    th = ctx.profile.section("stress")
    length = position_limit.cap(short_length(th), ctx)
    return ctx.provide(random_row, lambda: _random_rows(ctx, 1, length, int(th["seed"]) + 1))


def _random_rows(ctx: Context, n: int, length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    vocab = ctx.engine.vocab_size()
    rows = [Sample(id=f"random-{i}", prompt=[], response=[int(t) for t in rng.integers(0, vocab, length)])
            for i in range(n)]
    return packed(ctx, rows, length)


def label_batch(ctx: Context) -> tuple[np.ndarray, np.ndarray, Any]:
    """(ids [B, T], labels [B, T], the model's logits [B, T, V] as a Tensor) of the random batch:
    the label probes' input (split form only), through the `model.forward` graph at its shape."""
    def build():
        import mindspore as ms

        ids, labels = random_batch(ctx)
        return ids, labels, ms.Tensor(ctx.engine.logits(ids))
    return ctx.provide(label_batch, build)


def input_graphs(ctx: Context) -> list[Callable[[np.ndarray, np.ndarray], float]]:
    """The graphs the input probes run on, in order (see the module docstring): (ids [B, T],
    labels [B, T]) -> the loss of row 0. Where the parameter gradient goes through the model's
    VJP (engine/gradients.py), the second is `model.vjp` itself, its forward's logits scored by
    the objective: the gradient path's own graph, not `model.forward` a second time."""
    from objdebug.engine.gradients import vjp_applies

    if not vjp_applies(ctx.target):
        return [lambda i, l: float(ctx.engine.per_sample_raw(i, l)[0, 0]),
                lambda i, l: loss_and_grad(ctx, i[:1], l[:1])["loss"]]

    def through_vjp(i, l):
        import mindspore as ms

        from objdebug.engine.gradients import model_vjp

        vocab = ctx.engine.vocab_size()
        logits, _ = model_vjp(ctx.engine, ctx.target, ms.Tensor(i[:1], ms.int32),
                              ms.Tensor(np.zeros((1, i.shape[1], vocab), np.float32)))
        return float(ctx.engine.per_sample_of(logits, ms.Tensor(l[:1], ms.int32)).asnumpy()[0, 0])
    return [lambda i, l: float(ctx.engine.per_sample_raw(i, l)[0, 0]), through_vjp]


def label_graphs(ctx: Context, logits: Any) -> list[Callable[[np.ndarray, np.ndarray], float]]:
    """The graphs the label probes run on (split form), the objective alone on `logits`
    [B, T, V]: labels [B, T] -> the loss of row 0."""
    import mindspore as ms

    flat = ctx.config.objective.call == "flat"
    one = ms.Tensor(np.float32(1.0), ms.float32)

    def logit_grad(_, l):
        outputs, _ = objective_logit_grad(ctx.engine, ctx.target.objective, flat, logits[:1],
                                          ms.Tensor(l[:1], ms.int32), one)
        return float(outputs.asnumpy()[0])
    return [lambda _, l: float(ctx.engine.per_sample_of(logits, ms.Tensor(l, ms.int32)).asnumpy()[0, 0]),
            logit_grad]


class RandomIds(Check):
    name = "random-ids"
    stage = "stress"
    kinds = task_cases.ALL

    def skip_reason(self, ctx: Context) -> str | None:
        if task_cases.is_task(ctx):
            return task_cases.no_rows(ctx) or (None if task_cases.input_vocab(ctx) else _NO_VOCAB_TASK)
        return _vocab_skip(ctx)

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        if task_cases.is_task(ctx):  # the kind's rows with random ids, their labels kept
            return task_cases.random_ids(ctx, th)
        ids, labels = random_batch(ctx)
        losses = ctx.engine.per_sample_raw(ids, labels)[:, 0]
        grad = loss_and_grad(ctx, *random_row(ctx))
        vocab = ctx.engine.vocab_size()
        return {"vocab": vocab, "log_vocab": math.log(vocab), "shape": list(ids.shape),
                "losses": losses, "mean_loss": float(np.mean(losses)),
                "min_loss": float(np.min(losses)),
                "grad_loss": grad["loss"], "grad_norm": grad["grad_norm"],
                "nonfinite_params": grad["nonfinite_params"], "n_params": grad["n_params"]}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        low = float(th["random_ids_min_ratio"])

        def judge(v):
            x = v["mean_loss"]
            grads = (f"gradients of {'a random row' if 'kind' not in v else 'the batch'}: norm "
                     f"{v['grad_norm']:.3g}, {v['nonfinite_params']}/{v['n_params']} non-finite")
            if "kind" not in v:  # the causal LM: chance is log(V)
                base, what = v["log_vocab"], f"log(V={v['vocab']}) = {v['log_vocab']:.4g}"
            else:  # a kind: the labels' entropy (None: a contrastive loss, finiteness only)
                base, what = v["chance"], (None if v["chance"] is None else
                                           f"chance {v['chance']:.4g} (the least loss an input-blind "
                                           f"prediction scores, fitted through the objective; the labels' "
                                           f"entropy {v.get('entropy', float('nan')):.4g})")
            shown = f"{v['shape'][0]}x{v['shape'][1]} random ids: mean loss {x:.4g} (min {v['min_loss']:.4g})"
            ratio = x / base if base else None
            msg = shown + (f" = {ratio:.3g} x {what}" if ratio is not None else "") + "; " + grads
            if not np.all(np.isfinite(v["losses"])) or v["nonfinite_params"] or not math.isfinite(v["grad_loss"]):
                return Verdict.FAIL, msg + "; NaN/Inf on random tokens", ratio
            informed = v.get("informed")
            if "kind" in v and base is not None and base <= 0:
                return Verdict.WARN, (msg + f"; the best input-blind prediction scores {base:.4g} <= 0: "
                                      f"the objective pays for not knowing the label (it rewards "
                                      f"unpredictable outputs)"), ratio
            if base is not None and informed is not None and base <= informed + 1e-6 * max(abs(informed), 1.0):
                return Verdict.WARN, (msg + f"; the best input-blind prediction scores {base:.4g}, a confident "
                                      f"right one {informed:.4g}: the objective does not pay for knowing the "
                                      f"label (it rewards unpredictable outputs)"), ratio
            if ratio is None:
                why = ("a contrastive loss's chance level depends on its form: finiteness judged"
                       if v.get("kind") == "embedding" else "the rows' labels are one class: no chance level")
                return Verdict.PASS, msg + f"; {why}", None
            if ratio < low:
                return Verdict.WARN, (msg + f"; below {low:g} x {'log(V)' if 'kind' not in v else 'chance'}: "
                                      f"the objective rewards unpredictable tokens"), ratio
            return Verdict.PASS, msg + f"; pass >= {low:g} x {'log(V)' if 'kind' not in v else 'chance'}", ratio

        return [Condition("OBJ505", f"random_ids_loss_at_least_{low:g}_log_vocab", judge)]


class OutOfRangeIds(Check):
    name = "out-of-range-ids"
    stage = "stress"
    kinds = task_cases.ALL

    def skip_reason(self, ctx: Context) -> str | None:
        if task_cases.is_task(ctx):
            return task_cases.no_rows(ctx) or (None if task_cases.input_vocab(ctx) else _NO_VOCAB_TASK)
        return _vocab_skip(ctx)

    def _probe(self, run, ids: np.ndarray, labels: np.ndarray,
               bad_ids: np.ndarray, bad_labels: np.ndarray) -> dict[str, Any]:
        valid = run(ids, labels)  # the graph works: an error below is the probe's
        try:
            value = run(bad_ids, bad_labels)
        except Exception as exc:  # rejection is the healthy outcome
            raise_swallowed()  # a ^C turned into an error on the way is no rejection
            if POISONED in str(exc).lower():
                raise
            return {"rejected": True, "valid_loss": valid,
                    "error": f"{type(exc).__name__}: {error_line(exc)[:200]}"}
        return {"rejected": False, "valid_loss": valid, "value": value}

    def _path(self, ctx: Context, path: str, graphs, ids: np.ndarray, labels: np.ndarray,
              probes: dict[str, Any], bound: int | None = None, at: tuple = (0, PROBE_POSITION)) -> None:
        """The probes of one path (input or label) on the batch (ids, labels), each at index `at`
        (one position of row 0); `graphs`: (ids, labels) -> the loss of row 0, one per graph;
        `bound`: the path's range [0, bound) (default: the vocabulary)."""
        vocab = bound or ctx.engine.vocab_size()
        pad = ctx.config.data.label_pad_id
        graph = 0  # a rejected probe moves the next one to the next graph (the module docstring)
        for bad in (-1, vocab):  # -1 first: the one a standard model accepts keeps its graph
            key = f"{path} {bad}"
            if path == "label" and bad == pad:
                probes[key] = {"skipped": "-1 is the label_pad_id"}
                continue
            i, l = ids.copy(), labels.copy()
            (i if path == "input" else l)[at] = bad
            run = graphs[min(graph, len(graphs) - 1)]
            probes[key] = r = self._probe(run, ids, labels, i, l)
            if not r["rejected"] and bad < 0 and math.isfinite(r["value"]):
                # what was -1 read as? Gather's wrap-around reads it as V-1: the same graph, which
                # did not raise, scores the batch with V-1 in its place
                (i if path == "input" else l)[at] = bad + vocab
                r["wrapped_value"] = run(i, l)
                r["wraps"] = bool(abs(r["wrapped_value"] - r["value"]) <= 1e-6 * max(abs(r["value"]), 1.0))
            graph += int(r["rejected"])

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        if task_cases.is_task(ctx):  # the kind's rows, inputs out of the vocabulary, labels out of C
            return self._measure_task(ctx, th)
        ids, labels = random_batch(ctx)
        vocab = ctx.engine.vocab_size()
        # the report's order: V before -1 (the probes run -1 first, see the module docstring)
        probes: dict[str, Any] = {f"{path} {bad}": None for path in ("input", "label")
                                  for bad in (vocab, -1)}
        label_ids, label_labels, graphs = ids, labels, input_graphs(ctx)  # end-to-end form
        if ctx.target.model is not None:  # labels reach only the objective: score it on logits
            # (taken before the input probes, which may leave model.forward to compile again)
            label_ids, label_labels, logits = label_batch(ctx)
            graphs = label_graphs(ctx, logits)
        self._path(ctx, "input", input_graphs(ctx), ids, labels, probes)
        self._path(ctx, "label", graphs, label_ids, label_labels, probes)
        valid = {path: next((r["valid_loss"] for k, r in probes.items()
                             if k.startswith(path) and "valid_loss" in r), float("nan"))
                 for path in ("input", "label")}
        return {"vocab": vocab, "valid_loss": valid["input"], "label_valid_loss": valid["label"],
                "position": PROBE_POSITION, "row": 0, "shape": list(ids.shape),
                "label_shape": list(label_labels.shape), "probes": probes}

    def _measure_task(self, ctx: Context, th: Settings) -> dict[str, Any]:
        """The same probes on a `[task] kind` (task_cases.out_of_range_paths): input ids V and -1
        in row 0's first text; labels C and -1 (a tag at one position) into the objective alone on
        the model's outputs; an embedding row has no label."""
        paths = task_cases.out_of_range_paths(ctx, th)
        probes: dict[str, Any] = {f"input {b}": None for b in (paths["vocab"], -1)}
        if paths["label_graphs"] is not None:  # (an embedding row has none: OBJ506 a SKIP saying so)
            probes.update({f"label {b}": None for b in (paths["classes"], -1)})
            # the labels' probes first: their graphs score the valid outputs taken before any probe
            self._path(ctx, "label", paths["label_graphs"], paths["ids"], paths["labels"], probes,
                       bound=paths["classes"], at=paths["label_at"])
        self._path(ctx, "input", paths["input_graphs"], paths["ids"], paths["labels"], probes,
                   bound=paths["vocab"], at=paths["input_at"])
        valid = {path: next((r["valid_loss"] for k, r in probes.items()
                             if k.startswith(path) and r and "valid_loss" in r), float("nan"))
                 for path in ("input", "label")}
        return {"kind": tasks.kind_of(ctx.config), "vocab": paths["vocab"], "input_bound": paths["vocab"],
                "label_bound": paths["classes"], "valid_loss": valid["input"],
                "label_valid_loss": valid["label"], "position": paths["input_at"][1], "row": 0,
                "shape": list(paths["ids"].shape), "label_shape": list(paths["labels"].shape),
                "probes": probes}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        def judge_path(path: str, setting: str):
            # validated when the conditions are built: a typo is a usage error, before any run
            silent_verdict = Verdict.from_setting(th[setting], f"[stress] {setting}")

            def judge(v):
                bound = v.get(f"{path}_bound") or v["vocab"]  # a kind's labels: its C classes
                mine = {k: r for k, r in v["probes"].items() if k.startswith(path)}
                if path == "label" and v.get("kind") == "embedding":
                    return Verdict.SKIP, "an embedding row has no label: no label to probe", None
                parts, silent, nonfinite = [], [], []
                for k, r in mine.items():
                    if "skipped" in r:
                        parts.append(f"{k}: skipped ({r['skipped']})")
                    elif r["rejected"]:
                        parts.append(f"{k}: rejected ({r['error'][:100]})")
                    elif not math.isfinite(r["value"]):
                        parts.append(f"{k}: loss {r['value']:.4g}")
                        nonfinite.append(k)
                    else:
                        read_as = (f" = the loss with {k.split()[0]} {int(k.split()[1]) + bound} "
                                   "(wrapped)" if r.get("wraps") else "")
                        parts.append(f"{k}: accepted, loss {r['value']:.4g}{read_as}")
                        silent.append(k)
                valid = v.get(f"{path}_valid_loss", v["valid_loss"])  # the batch of this path
                msg = (f"{path} ids out of [0, {bound}) at one position (valid loss "
                       f"{valid:.4g}): " + "; ".join(parts))
                if nonfinite:
                    return Verdict.FAIL, msg + f"; NaN/Inf instead of an error for {', '.join(nonfinite)}", \
                        float(len(nonfinite) + len(silent))
                if silent:
                    nature = ("MindSpore's GatherD accepts [-V, V), as nn.CrossEntropyLoss does; the "
                              "labels your pipeline writes are checked by OBJ105" if path == "label"
                              and "kind" not in v else "MindSpore's GatherD accepts [-C, C): a label "
                              "outside the class list is read as another class" if path == "label"
                              else "every standard MindSpore embedding (nn.Embedding, ops.gather) "
                              "wraps a negative id")
                    return silent_verdict, (msg + f"; silently scored ({nature}; profile "
                                            f"{setting} = {silent_verdict.value.lower()})"), float(len(silent))
                return Verdict.PASS, msg, 0.0
            return judge

        return [Condition("OBJ506", "out_of_range_labels_rejected",
                          judge_path("label", "label_out_of_range")),
                Condition("OBJ507", "out_of_range_input_ids_rejected",
                          judge_path("input", "input_out_of_range"))]
