"""Runs the user's objective for real and keeps compiled graphs for reuse.

MindSpore compiles a graph per Cell instance and input shape. The engine therefore holds one Cell
per kind of computation (per-sample loss, logits, gradients, ...), pads inputs to a few length
buckets with a fixed batch size, and records every first call of a (graph, shape) pair as a
compile with its time, per stage. Stages share one Engine, so no stage recompiles what another
stage already built.

The engine owns batching: the padding (`Padding`, read once from `[data]`), the length buckets
(chosen once for the rows at hand by `plan_buckets`, see `choose_buckets`) and `batches()`, the
one way rows become [batch_size, T] arrays. Listeners added with `add_compile_listener` hear
every first call of a (graph, shapes) pair before and after it runs (the compile cache).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

from objdebug.engine.data import (Batch, Padding, Sample, bucket_length, choose_buckets, filled_rows,
                                  group_by_length)
from objdebug.core.progress import Progress, shapes_text
from objdebug.engine.target import Target
from objdebug.engine.cache_fallback import CacheUnusable, caused_by_cache
from objdebug.core.interrupts import raise_swallowed, reassert as reassert_signals
from objdebug.engine import cache_proof, host_memory, row_scoring, watchdog


FORWARD = "model.forward"
HEADROOM_ENV = "OBJDEBUG_GRAPH_HEADROOM_BYTES"  # tests: a headroom no machine has, so graphs are let go


@dataclass
class CompileRecord:
    graph: str
    shapes: str
    seconds: float  # first call: compile + one run
    stage: str
    check: str = ""  # the check (or pipeline step: contract, model-state) whose call compiled it
    holds_model: bool = False  # the graph holds a whole model (`Engine.holds_model`): its compile is the costly kind


@dataclass
class CompileLog:
    records: list[CompileRecord] = field(default_factory=list)
    uses: dict[str, set[str]] = field(default_factory=dict)  # check -> every graph it called
    released: list[dict[str, Any]] = field(default_factory=list)  # graphs let go for memory (Engine.make_room)
    retired: list[dict[str, Any]] = field(default_factory=list)  # graphs that raised, dropped to compile afresh (Engine.retire)

    def by_check(self) -> dict[str, dict[str, Any]]:
        """The compile budget per check: the graphs it compiled (count, seconds) and every graph
        it used, compiled by whom ever came first (a check that adds no graph reuses others')."""
        out: dict[str, dict[str, Any]] = {}
        for check, graphs in self.uses.items():
            out[check] = {"count": 0, "seconds": 0.0, "compiled": [], "uses": sorted(graphs)}
        for r in self.records:
            c = out.setdefault(r.check or r.stage, {"count": 0, "seconds": 0.0, "compiled": [],
                                                    "uses": []})
            c["count"] += 1
            c["seconds"] = round(c["seconds"] + r.seconds, 3)
            c["compiled"].append(f"{r.graph} {shapes_text(r.shapes)}".rstrip())
        return out

    @property
    def count(self) -> int:
        return len(self.records)

    @property
    def seconds(self) -> float:
        return float(sum(r.seconds for r in self.records))

    @property
    def model_count(self) -> int:
        """Compiles of graphs that hold a whole model: on an accelerator each costs minutes
        (docs/performance.md), so this count, not the total, sets a gate run's wall time."""
        return sum(1 for r in self.records if r.holds_model)

    def by_stage(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for r in self.records:
            s = out.setdefault(r.stage, {"count": 0, "holds_model": 0, "seconds": 0.0})
            s["count"] += 1
            s["holds_model"] += int(r.holds_model)
            s["seconds"] += r.seconds
        return out

    def to_dict(self) -> dict[str, Any]:
        out = {"count": self.count, "holds_model": self.model_count, "seconds": round(self.seconds, 3),
               "by_stage": self.by_stage(),
               "by_check": self.by_check(), "graphs": [asdict(r) for r in self.records]}
        if self.released:
            out["released"] = list(self.released)
        if self.retired:
            out["retired"] = list(self.retired)
        return out


def _parameter_elements(cell: Any) -> int:
    """Elements of the distinct parameters `cell` holds (0 for anything that is not a Cell)."""
    get = getattr(cell, "get_parameters", None)
    if get is None:
        return 0
    seen, total = set(), 0
    for p in get():
        if id(p) not in seen:
            seen.add(id(p))
            total += int(np.prod(p.shape)) if p.shape else 1
    return total


class CompileListener(Protocol):
    """Hears every first call of a (graph, input signature) pair: a compile."""

    def before_compile(self, graph: str, signature: str) -> None: ...

    def after_compile(self, graph: str, signature: str, seconds: float) -> None: ...


class Engine:
    """Compiled, reusable evaluation of one target."""

    def __init__(self, target: Target, batch_size: int = 8, progress: Progress | None = None):
        self.target = target
        self.batch_size = int(batch_size)
        self.padding = Padding.of(target.config)
        self.compiles = CompileLog()
        self.stage = "setup"
        self.check = ""  # the check now running (api.run sets it): compiles and uses are charged to it
        self.progress = progress or Progress()  # no display unless the caller passes one
        self._cells: dict[str, Any] = {}
        self._holds: dict[str, bool] = {}  # graph name -> whether it holds a whole model (holds_model)
        self._model_elements: int | None = None
        self._seen: set[tuple[str, str]] = set()
        self._listeners: list[CompileListener] = []
        self._vocab: int | None = target.config.data.vocab_size
        self._vocab_tried = False  # the model's vocabulary looked for (vocab_size)
        self.vocab_source = "data.vocab_size" if self._vocab else ""  # where vocab_size() read it
        self.max_length: int | None = None  # the model's longest input, when known (contract.py)
        self.buckets: tuple[int, ...] | None = None  # chosen by plan_buckets; None: the ladder
        self._last_used: dict[str, int] = {}  # graph name -> call counter at its last call
        self._calls = 0
        self._largest_growth = 0  # the most one first call (compile + run) added to the RSS
        self._completed: set[str] = set()  # graphs that completed a first call (`called`)
        self.static_fallbacks: set[str] = set()  # dynamic graphs that could not compile (dynamic_graph.py)
        self._forward_of: Any = None  # the model object the shared forward graph was built on
        self.reference: Callable = cache_proof.eager  # a graph's answer without the graph (cache proof)
        # seconds in calls of graphs already compiled (first calls: `compiles`), read before and
        # after each step of a run: where its time goes (pipeline/time_profile.py)
        self.call_seconds = 0.0
        self.static_rows = False  # rows scored through one fused static graph per bucket (row_scoring.py)
        self._row_stash: Any = None  # (logits, labels, outputs) of the last fused call (`forward`)

    # ------------------------------------------------------------------ plumbing
    def cell(self, name: str, builder: Callable[[], Any]) -> Any:
        """The cached Cell `name`, built once per engine."""
        if name not in self._cells:
            self._cells[name] = builder()
            self._holds[name] = self.holds_model(self._cells[name])
        return self._cells[name]

    def _model_size(self) -> int:
        """Elements of the model's parameters (split form: the model's; end-to-end: the
        objective's, which holds the model), counted once per run."""
        if self._model_elements is None:
            model = getattr(self.target, "model", None)
            self._model_elements = _parameter_elements(model if model is not None else
                                                       getattr(self.target, "objective", None))
        return self._model_elements

    def holds_model(self, cell: Any) -> bool:
        """Whether the graph of `cell` holds a whole model: its parameters add up to at least
        half the model's elements. By size, not identity, so a second copy of the model (the
        preference stage's reference, a policy copy) counts as one too; an objective's own
        parameters (a learned loss weight) do not."""
        if not hasattr(cell, "get_parameters"):  # a function, not a Cell: holds nothing
            return False
        size = self._model_size()
        return size > 0 and _parameter_elements(cell) * 2 >= size

    def add_compile_listener(self, listener: CompileListener) -> None:
        """`listener.before_compile(graph, signature)` before, `after_compile(graph, signature,
        seconds)` after (also when it raised) every first call of a (graph, input signature)."""
        self._listeners.append(listener)

    def call(self, name: str, fn: Callable, *args: Any, signature: str | None = None,
             probe: tuple[Any, Sequence[Any], bool] | None = None) -> Any:
        """Call a compiled function; the first call per (name, input shapes) is logged as a compile.

        `signature`: what names the compile when the argument shapes would be a long list (the
        gradient statistics take one tensor per parameter); it must change where they change.
        `probe`: (the Cell, its inputs, whether every input is batch-first) when `fn` is a closure
        over a Cell (a dynamic graph): a compile-cache hit of this graph is proved on that Cell
        (`_prove`), on the first row alone when batch-first; else on `fn` and `args`."""
        sig = signature or ",".join(f"{getattr(a, 'dtype', type(a).__name__)}{list(getattr(a, 'shape', ()))}"
                                    for a in args)
        key = (name, sig)
        self.compiles.uses.setdefault(self.check or self.stage, set()).add(name)
        self._calls += 1
        self._last_used[name] = self._calls
        if key in self._seen:
            start = time.perf_counter()
            try:
                out = fn(*args)
            except Exception:
                self.retire(name, fn)
                raise
            finally:
                reassert_signals()  # each graph run re-installs MindSpore's SIGINT handler
                self.call_seconds += time.perf_counter() - start
            # a ^C whose Interrupted MindSpore's own Python code caught on the way (a bare
            # `except` in its compile path) stops the run here (measured: under load, 1 in 4
            # later-stage ^C runs of tests/test_gate_signals.py went on and lost the message)
            raise_swallowed()
            return out
        shapes = shapes_text(sig) or "(dynamic shapes)"  # what the display and a --timeout name
        self.make_room(name)
        rss_before = host_memory.rss_bytes()
        for listener in self._listeners:
            listener.before_compile(name, sig)
        self.progress.compile_start(name, shapes)  # the display shows what compiles, and for how long
        watchdog.compiling(name, shapes)  # what a --timeout names
        start = time.perf_counter()
        try:
            out = fn(*args)
        except Exception as exc:
            if caused_by_cache(exc):  # not the target's fault: the CLI reruns without the cache
                raise CacheUnusable(name) from exc
            self.retire(name, fn)
            raise
        finally:
            reassert_signals()  # MindSpore's runtime took SIGINT over (it turns it into SIGTERM)
            watchdog.compiling(None)
            seconds = time.perf_counter() - start
            self.progress.compile_end(name, shapes, seconds)
            for listener in self._listeners:
                listener.after_compile(name, sig, seconds)
        self._seen.add(key)
        self._completed.add(name)
        if name not in self._holds:  # called directly, not built through `cell` (the model itself)
            self._holds[name] = self.holds_model(fn)
        self.compiles.records.append(CompileRecord(name, sig, seconds, self.stage, self.check,
                                                   self._holds[name]))
        self._largest_growth = max(self._largest_growth, host_memory.rss_bytes() - rss_before)
        raise_swallowed()  # as above
        return self._prove(name, sig, fn, args, out, signature, probe)

    def _prove(self, name: str, sig: str, fn: Callable, args: tuple, out: Any,
               signature: str | None, probe: tuple[Any, Sequence[Any], bool] | None = None) -> Any:
        """A graph loaded from the compile cache counts only once it answered like the Cell does
        without it (engine/cache_proof.py): else it is dropped, compiled afresh (the cache is off
        from there on) and the fresh output is the result."""
        provers = [p for p in self._listeners if getattr(p, "wants_proof", None) and p.wants_proof(name, sig)]
        if not provers:
            return out
        start = time.perf_counter()
        why = ""
        got = out
        subject, inputs, rows = fn, args, False
        if probe is not None:  # a dynamic graph's Cell and inputs (engine/dynamic_graph.py)
            subject, inputs, rows = probe[0], tuple(probe[1]), probe[2]
        try:
            if probe is not None and rows:  # batch-first: proved on its first row (no compile)
                from objdebug.engine.dynamic_graph import first_row

                inputs = first_row(inputs)
                got = subject(*inputs)
                reassert_signals()
            forward = self._proved_forward(subject)
            want, eager = cache_proof.answer(subject, inputs, got, self.reference, forward), True
        except Exception as exc:  # a Cell that cannot run eagerly: a fresh compile answers instead
            raise_swallowed()
            want, eager = None, False
            why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ''}"
        seconds = time.perf_counter() - start
        if eager and cache_proof.same_answer(got, want):
            for p in provers:
                p.proved(name, sig, seconds)
            return out
        how = "eager" if eager else f"not eager: {why}"
        if eager and not self._deterministic(subject, inputs, got, want):
            how = "not deterministic"  # dropout in training mode: no answer to compare with
        for p in provers:  # MindSpore must miss from here on: the recompile cannot load a file
            p.reject(name, sig, seconds, how)
        self._drop_phases(name, self._cells.get(name, fn))
        fresh = self.call(name, fn, *args, signature=signature)
        if not eager and not cache_proof.same_answer(out, fresh):
            for p in provers:  # the fresh compile answered otherwise: the entry was another's
                p.reject(name, sig, 0.0, "eager")
        return fresh

    def _proved_forward(self, subject: Any) -> Callable | None:
        """The engine's `model.forward` graph as a plain call, for proving the VJP of the same
        model (`cache_proof.vjp_answer`): only once it completed a call (a hit is proved on its
        first call, a miss is a fresh compile) and takes any shape (not the static fallback, which
        would compile per shape); else None (the proof runs the model in PyNative)."""
        cell = self._cells.get(FORWARD)
        if (not getattr(subject, "proof_vjp", False) or cell is None or FORWARD not in self._completed
                or FORWARD in self.static_fallbacks or self._forward_of is not getattr(subject, "model", None)):
            return None
        return lambda x: cell(x)

    def _deterministic(self, fn: Callable, args: tuple, got: Any, want: Any) -> bool:
        """Whether the Cell answers the same twice without its graph (else a mismatch proves
        nothing about the cached graph: it is recompiled, not called another model's)."""
        try:
            return cache_proof.same_answer(cache_proof.answer(fn, args, got, self.reference,
                                                              self._proved_forward(fn)), want)
        except Exception:
            raise_swallowed()
            return False

    # ------------------------------------------------------------------ memory
    def make_room(self, compiling: str, want: int | None = None) -> None:
        """Before a compile: when MemAvailable is under the headroom (a quarter of the machine, at
        least twice the most one compile has added so far), let go of the graphs this engine
        built, least recently called first, until it is not.

        Why: in MindSpore 2.10 every compiled graph keeps its memory until its Cell goes (measured
        on a 32000-token vocabulary: +1.0-2.5 GiB per [8, 128, V] graph, 18.9 GiB after four
        stages, and the run killed by the kernel in the fifth); `del_net_res` on a graph gives it
        back (5.97 -> 2.13 GiB). A graph let go compiles again if it is called again: one compile
        more, counted as such, instead of a dead run. Outputs already returned stay valid.
        The model's forward is never let go, nor a graph the running check has called (see
        below). `want`: the bytes to have
        free instead of the headroom (a measurement about to run in a process of its own).
        """
        avail, total = host_memory.available_bytes(), host_memory.total_bytes()
        if avail is None or total is None:
            return
        if want is None:
            want = int(os.environ.get(HEADROOM_ENV) or max(total // 4, 2 * self._largest_growth))
        if avail >= want:
            return
        import gc

        # the graphs the running check calls stay: its parameter gradient is a chain of three
        # shared graphs (forward, logit gradient, VJP), and letting one go before another's call
        # would compile them in turn at every step
        working = self.compiles.uses.get(self.check or self.stage, set())
        for victim in sorted(self._cells, key=lambda n: self._last_used.get(n, -1)):
            if victim == compiling or victim.startswith(FORWARD) or victim in working:
                continue
            if self.static_rows and victim == row_scoring.NAME:  # there the model's forward too
                continue
            self.release(victim)
            gc.collect()
            avail = host_memory.available_bytes() or 0
            if avail >= want:
                break

    def release(self, name: str) -> None:
        """Let go of the graph `name` (its compiled resources); its next call compiles again."""
        cell = self._cells.pop(name, None)
        if cell is None:
            return
        self._drop_phases(name, cell)
        self.compiles.released.append({"graph": name, "stage": self.stage, "check": self.check,
                                       "available_bytes": host_memory.available_bytes()})

    def retire(self, name: str, fn: Any = None) -> None:
        """The graph `name` raised at run time: drop its compiled phases, so its next call
        compiles it again (counted) instead of failing.

        Why: a MindSpore 2.10 graph that raised refuses every later call ("An error occurred in
        the previous step of this model execution"), while a graph holding it, or another Cell,
        runs on (measured). `del_net_res` on its phases makes the same Cell compile afresh; the
        Cell itself is kept (the user's model stays the object every stage holds). So a check
        may run a probe that is expected to raise on a graph other checks share: the result
        never depends on the order of checks, only the compile count does.
        """
        self._drop_phases(name, self._cells.get(name, fn))
        self.compiles.retired.append({"graph": name, "stage": self.stage, "check": self.check})

    def _drop_phases(self, name: str, cell: Any) -> None:
        """MindSpore's compiled phases of `cell` go (`del_net_res`), and the graph `name` counts
        as never compiled: its next call is a compile (`release`, `retire`)."""
        from objdebug.engine.ms_versions import graph_api

        _cell_graph_executor = graph_api()._cell_graph_executor
        phases = getattr(cell, "compile_cache", None)
        if phases:
            _cell_graph_executor.del_net_res(cell, set(phases))
            phases.clear()
        self._seen = {k for k in self._seen if k[0] != name}

    def called(self, name: str) -> bool:
        """Whether the graph `name` has completed a call (at any shape), ever in this run: a
        graph retired after a run-time error (`retire`) still has."""
        return name in self._completed

    # ------------------------------------------------------------------ lengths and batches
    def plan_buckets(self, lengths: Sequence[int]) -> tuple[int, ...]:
        """Choose the length buckets once for the rows every stage will batch (see
        `choose_buckets`): the cheapest set of graphs + padded work. Later calls keep the plan,
        so every stage pads to the same lengths and reuses the same graphs."""
        if self.buckets is None and len(lengths):
            choose = row_scoring.plan if self.static_rows else choose_buckets  # static: its own lengths
            self.buckets = choose(lengths, self.batch_size, cap=self.max_length)
        return self.buckets or ()

    def bucket(self, n: int) -> int:
        """The padded length of a row of n tokens: the smallest planned bucket that holds it,
        beyond the plan (or before one is made) the power-of-two ladder."""
        planned = [b for b in self.buckets or () if b >= n]
        b = planned[0] if planned else bucket_length(n)
        if self.max_length and n <= self.max_length:  # never pad past the model's position table
            b = min(b, self.max_length)
        return b

    def batches(self, samples: Sequence[Sample], length: int | None = None,
                size: int | None = None) -> list[Batch]:
        """The rows packed into batches of `size` rows (default: the batch size), short ones
        filled (`filled_rows`); `index` maps each batch's data rows back to `samples`.

        length None: grouped by length bucket (one graph per bucket); else every batch has this
        length (one graph for all, e.g. a gradient batch list).
        """
        size = int(size or self.batch_size)
        if length is None:
            groups = group_by_length([s.length for s in samples], self.bucket, size)
        else:
            groups = [(length, list(range(k, min(k + size, len(samples)))))
                      for k in range(0, len(samples), size)]
        out = []
        for n, idx in groups:
            rows = [samples[i] for i in idx]
            ids, labels = self.padding.pack(filled_rows(rows, size), n)
            out.append(Batch(ids, labels, rows, size - len(rows), list(idx)))
        return out

    def gradient_stats(self, grads: Sequence[Any]) -> dict[str, np.ndarray]:
        """Per-parameter statistics of a gradient tuple (`objdebug.engine.gradients.reduce_gradients`:
        on the host for small gradients, else one graph per set of parameter shapes that every
        forward + backward graph of the run shares), its compiles counted here."""
        from objdebug.engine.gradients import reduce_gradients

        def run(name: str, cell: Any, tensors: list) -> Any:
            full = ",".join(f"{g.dtype}{list(g.shape)}" for g in tensors)
            elements = sum(int(np.prod(g.shape)) for g in tensors)
            # '[P, elements]' in the compile table; the digest tells parameter sets apart (the cache's key)
            signature = f"Tensors[{len(tensors)}, {elements}]#{hashlib.sha1(full.encode()).hexdigest()[:12]}"
            return self.call(name, cell, *tensors, signature=signature)

        return reduce_gradients(grads, run)

    # ------------------------------------------------------------------ vocabulary
    def vocab_size(self) -> int | None:
        """The model's vocabulary, resolved once (engine/vocabulary.py): `[data] vocab_size`, the
        logits' last dimension (split form; the contract probe's in the end-to-end form), the
        input embedding's rows (a reward model, a Cell that returns only a loss), a declared
        tokenizer's size; None when none of them tells (never the byte tokenizer's 256)."""
        if self._vocab is not None:
            self.vocab_source = self.vocab_source or "data.vocab_size"
            return self._vocab
        if self._vocab_tried:
            return None
        from objdebug.engine import vocabulary

        cfg = self.target.config
        if cfg.objective.call != "reward" and self.target.model is not None:
            # token 0, not pad_id: pad_id is checked against the vocabulary this probe measures
            ids = np.zeros((self.batch_size, self.bucket(1)), np.int32)
            self._vocab, self.vocab_source = int(self.logits(ids).shape[-1]), "the model's logits"
            return self._vocab
        self._vocab_tried = True  # no logits: looked for once, found or not
        found = vocabulary.embedding_of_target(self.target, 2, 8)
        if "vocab" in found:
            self._vocab = int(found["vocab"])
            self.vocab_source = f"the model's input embedding '{found['parameter']}'"
            return self._vocab
        self._vocab, self.vocab_source = vocabulary.declared(cfg)
        return self._vocab

    # ------------------------------------------------------------------ computations
    def forward(self, input_ids: Any) -> Any:
        """The model's output on an int32 Tensor [B, T] (split form): the one evaluation-mode
        forward graph of the run, `model.forward`, with dynamic batch and length
        (engine/dynamic_graph.py), so every stage, every bucket and every gradient's logits share
        one compile of the model's forward. When the contract wraps the model (its output
        picked from a tuple), the graph is built again on the wrapped model."""
        import mindspore as ms

        from objdebug.engine import dynamic_graph
        from objdebug.engine.cells import ModelForward

        model = self.target.model
        if model is None:
            raise RuntimeError("the end-to-end form does not expose logits")
        if self.static_rows and (logits := row_scoring.forward(self, input_ids)) is not None:
            return logits  # a run that only scores rows, on CPU: the fused static graph
        if self._forward_of is not model:
            if self._forward_of is not None:  # a graph of the previous model: never called again
                for name in (FORWARD, FORWARD + dynamic_graph.STATIC_SUFFIX):
                    self._cells.pop(name, None)
                    self._holds.pop(name, None)
                    self._completed.discard(name)  # the new graph may fall back to static shapes
                    self.static_fallbacks.discard(name)
                self._seen = {k for k in self._seen if not k[0].startswith(FORWARD)}
            self._forward_of = model
        return dynamic_graph.call(self, FORWARD, lambda: ModelForward(model),
                                  (ms.Tensor(shape=[None, None], dtype=ms.int32),), input_ids, rows=True)

    def logits(self, input_ids: np.ndarray) -> np.ndarray:
        """The model's logits float[B, T, V] (split form only)."""
        import mindspore as ms

        return self.forward(ms.Tensor(input_ids, ms.int32)).asnumpy()

    def per_sample_raw(self, input_ids: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """The objective on each row of a [batch_size, T] batch -> float64[B, K] (K = total + components).

        Split form: two graphs, the shared `model.forward` (the contract probe's, the model
        state's, the logit checks') and the objective alone per row on its logits, which stay
        MindSpore Tensors between the two; end-to-end: one graph on the ids."""
        import mindspore as ms

        x = ms.Tensor(input_ids, ms.int32)
        if self.static_rows and (got := row_scoring.score(self, x, ms.Tensor(labels, ms.int32))) is not None:
            return got[0].asnumpy().astype(np.float64)  # model + per-row objective: one static call
        if self.target.model is not None:
            x = self.forward(x)
        return self.per_sample_of(x, ms.Tensor(labels, ms.int32)).asnumpy().astype(np.float64)

    def per_sample_of(self, x: Any, labels: Any) -> Any:
        """Each row's objective outputs on MindSpore Tensors -> float32[B, K]: x is the logits
        [B, T, V] of `model.forward` (split form) or the input ids (end-to-end).

        Split form: the objective called once per row, as the user calls it on a batch of one
        (flat: [T, V] / [T]), through the one dynamic-shape graph `objective.forward`
        (`objective_forward`), so every batch shape, the invariants' forward and every row share
        one compile. End-to-end: `objective.per_sample`, one graph that unrolls the rows."""
        import mindspore as ms

        from objdebug.engine.cells import PerSampleObjective

        if self.static_rows and (outs := row_scoring.stashed(self, x, labels)) is not None:
            return outs  # the fused graph scored these logits' rows with these labels already
        if self.target.model is None:
            cell = self.cell("objective.per_sample",
                             lambda: PerSampleObjective(self.target, self.batch_size, on_logits=False))
            return self.call("objective.per_sample", cell, x, labels)
        flat = self.target.config.objective.call == "flat"
        rows = []
        for b in range(int(x.shape[0])):
            xb, yb = (x[b], labels[b]) if flat else (x[b:b + 1], labels[b:b + 1])
            rows.append(self.objective_forward(xb, yb).asnumpy())
        return ms.Tensor(np.stack(rows).astype(np.float32))

    def objective_forward(self, logits: Any, labels: Any) -> Any:
        """The configured objective alone, forward only, evaluation mode, on Tensors exactly as
        it receives them (flat: [N, V] / [N]; else [B, T, V] / [B, T]) -> outputs float32[K];
        through the dynamic-shape graph `objective.forward` (one per logits dtype)."""
        import mindspore as ms

        from objdebug.engine import dynamic_graph
        from objdebug.engine.cells import ObjectiveForward

        lead = [None] * (len(logits.shape) - 1)
        name = "objective.forward" + ("" if logits.dtype == ms.float32 else f".{str(logits.dtype).lower()}")
        return dynamic_graph.call(self, name, lambda: ObjectiveForward(self.target.objective),
                                  (ms.Tensor(shape=lead + [logits.shape[-1]], dtype=logits.dtype),
                                   ms.Tensor(shape=lead, dtype=ms.int32)), logits, labels)

    def evaluate(self, samples: list[Sample], label: str = "") -> np.ndarray:
        """Per-sample objective outputs float64[N, K], in input order; batched per length bucket.

        Under `--workers N` (msrun) each worker evaluates its share of the same batches and the
        rows are combined with one collective (objdebug/engine/distributed.py): the result is the same
        in every worker and equal to a single process's.
        """
        from objdebug.engine.distributed import shard_and_combine

        if not samples:
            return np.zeros((0, 1))
        batches = self.batches(samples)

        def run_batch(b: int) -> np.ndarray:
            batch = batches[b]
            out = self.per_sample_raw(batch.input_ids, batch.labels)[:len(batch.samples)]
            tick()
            return out

        with self.progress.task(label or f"{self.stage}: objective", total=len(batches)) as tick:
            combined = shard_and_combine(len(samples), 1, [b.index for b in batches], run_batch)
            if combined is not None:
                return combined
            results = np.concatenate([run_batch(b) for b in range(len(batches))])
        order = np.concatenate([np.asarray(b.index) for b in batches])
        out = np.empty_like(results)
        out[order] = results
        return out

    def masked_probe(self, length: int | None = None, label: int | None = None) -> np.ndarray:
        """The objective on rows whose labels are all `label` (default label_pad_id): what a fully
        masked sample scores (0, or NaN from 0/0, when the objective ignores that value)."""
        length = length or self.bucket(1)
        ids = self.padding.only((self.batch_size, length))  # marked (mask 0) when the model takes a mask
        value = self.padding.label_pad_id if label is None else int(label)
        labels = np.full((self.batch_size, length), value, np.int32)
        return self.per_sample_raw(ids, labels)[0]
