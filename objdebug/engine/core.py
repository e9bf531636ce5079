"""Runs the user's objective for real and keeps compiled graphs for reuse.

MindSpore compiles a graph per Cell instance and input shape. The engine therefore holds one Cell
per kind of computation (per-sample loss, logits, gradients, ...), pads inputs to a few length
buckets with a fixed batch size, and records every first call of a (graph, shape) pair as a
compile with its time, per stage. Stages share one Engine, so no stage recompiles what another
stage already built.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from objdebug.engine.data import Sample, bucket_length
from objdebug.engine.model_inputs import pack_for, padding_batch
from objdebug.progress import Progress, shapes_text
from objdebug.engine.target import Target


@dataclass
class CompileRecord:
    graph: str
    shapes: str
    seconds: float  # first call: compile + one run
    stage: str


@dataclass
class CompileLog:
    records: list[CompileRecord] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.records)

    @property
    def seconds(self) -> float:
        return float(sum(r.seconds for r in self.records))

    def by_stage(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for r in self.records:
            s = out.setdefault(r.stage, {"count": 0, "seconds": 0.0})
            s["count"] += 1
            s["seconds"] += r.seconds
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "seconds": round(self.seconds, 3), "by_stage": self.by_stage(),
                "graphs": [asdict(r) for r in self.records]}


class Engine:
    """Compiled, reusable evaluation of one target."""

    def __init__(self, target: Target, batch_size: int = 8, buckets: Sequence[int] | None = None,
                 progress: Progress | None = None):
        self.target = target
        self.batch_size = int(batch_size)
        self.buckets = tuple(buckets) if buckets else None
        self.compiles = CompileLog()
        self.stage = "setup"
        self.progress = progress or Progress()  # no display unless the caller passes one
        self._cells: dict[str, Any] = {}
        self._seen: set[tuple[str, str]] = set()
        self._vocab: int | None = target.config.data.vocab_size
        self.max_length: int | None = None  # the model's longest input, when known (contract.py)

    # ------------------------------------------------------------------ plumbing
    def cell(self, name: str, builder: Callable[[], Any]) -> Any:
        """The cached Cell `name`, built once per engine."""
        if name not in self._cells:
            self._cells[name] = builder()
        return self._cells[name]

    def call(self, name: str, fn: Callable, *args: Any) -> Any:
        """Call a compiled function; the first call per (name, input shapes) is logged as a compile."""
        sig = ",".join(f"{getattr(a, 'dtype', type(a).__name__)}{list(getattr(a, 'shape', ()))}"
                       for a in args)
        key = (name, sig)
        if key in self._seen:
            return fn(*args)
        shapes = shapes_text(sig)
        self.progress.compile_start(name, shapes)  # the display shows what compiles, and for how long
        start = time.perf_counter()
        try:
            out = fn(*args)
        finally:
            self.progress.compile_end(name, shapes, time.perf_counter() - start)
        self._seen.add(key)
        self.compiles.records.append(CompileRecord(name, sig, time.perf_counter() - start, self.stage))
        return out

    def called(self, name: str) -> bool:
        """Whether the graph `name` has completed a call (at any shape)."""
        return any(n == name for n, _ in self._seen)

    def bucket(self, n: int) -> int:
        b = bucket_length(n, self.buckets) if self.buckets else bucket_length(n)
        if self.max_length and n <= self.max_length:  # never pad past the model's position table
            b = min(b, self.max_length)
        return b

    # ------------------------------------------------------------------ vocabulary
    def vocab_size(self) -> int | None:
        """Model vocabulary: from the config, else the logits' last dimension (split form)."""
        if self._vocab is None and self.target.model is not None:
            # token 0, not pad_id: pad_id is checked against the vocabulary this probe measures
            ids = np.zeros((self.batch_size, self.bucket(1)), np.int32)
            self._vocab = int(self.logits(ids).shape[-1])
        return self._vocab

    # ------------------------------------------------------------------ computations
    def logits(self, input_ids: np.ndarray) -> np.ndarray:
        """The model's logits float[B, T, V] (split form only)."""
        import mindspore as ms

        if self.target.model is None:
            raise RuntimeError("the end-to-end form does not expose logits")
        out = self.call("model.forward", self.target.model, ms.Tensor(input_ids, ms.int32))
        return out.asnumpy()

    def per_sample_raw(self, input_ids: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """The objective on each row of a [batch_size, T] batch -> float64[B, K] (K = total + components)."""
        import mindspore as ms

        from objdebug.engine.cells import PerSampleObjective

        cell = self.cell("objective.per_sample", lambda: PerSampleObjective(self.target, self.batch_size))
        out = self.call("objective.per_sample", cell, ms.Tensor(input_ids, ms.int32),
                        ms.Tensor(labels, ms.int32))
        return out.asnumpy().astype(np.float64)

    def evaluate(self, samples: list[Sample], extra_pad: int = 0, label: str = "") -> np.ndarray:
        """Per-sample objective outputs float64[N, K], in input order; batched per length bucket.

        Under `--workers N` (msrun) each worker evaluates its share of the same batches and the
        rows are combined with one collective (objdebug/distributed.py): the result is the same
        in every worker and equal to a single process's.
        """
        from objdebug.distributed import shard_and_combine

        groups: dict[int, list[int]] = {}
        for i, s in enumerate(samples):
            groups.setdefault(self.bucket(s.length + extra_pad), []).append(i)
        batches = [(length, idx[start:start + self.batch_size])
                   for length, idx in sorted(groups.items())
                   for start in range(0, len(idx), self.batch_size)]

        def run_batch(b: int) -> np.ndarray:
            length, chunk = batches[b]
            # fill a short batch with copies of its first row: same shape, same graph
            rows = [samples[i] for i in chunk] + [samples[chunk[0]]] * (self.batch_size - len(chunk))
            ids, labels = pack_for(self.target.config, rows, length, extra_pad=extra_pad)
            out = self.per_sample_raw(ids, labels)[:len(chunk)]
            tick()
            return out

        if not samples:
            return np.zeros((0, 1))
        with self.progress.task(label or f"{self.stage}: objective", total=len(batches)) as tick:
            combined = shard_and_combine(len(samples), 1, [c for _, c in batches], run_batch)
            if combined is not None:
                return combined
            results = np.concatenate([run_batch(b) for b in range(len(batches))])
        order = np.concatenate([np.asarray(c) for _, c in batches])
        out = np.empty_like(results)
        out[order] = results
        return out

    def masked_probe(self, length: int | None = None) -> np.ndarray:
        """The objective on rows whose labels are all label_pad_id: what a fully masked sample scores."""
        cfg = self.target.config.data
        length = length or self.bucket(1)
        ids = padding_batch(self.target.config, (self.batch_size, length))  # mask 0 if it takes one
        labels = np.full((self.batch_size, length), cfg.label_pad_id, np.int32)
        return self.per_sample_raw(ids, labels)[0]
