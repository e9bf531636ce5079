"""The objective alone on long logits (OBJ513): sum-reduction and overflow at long T without the model.

The model may not fit in memory at 8192 or 32768 tokens; the objective alone needs only a few
copies of the [1, T, V] logits. Rows of the model's real logits on the target's data (scored
positions of the gradient batch, with the labels they were scored against) are resampled with
replacement to T positions, so every length sees the same per-token loss distribution: a mean
reduction gives about the loss of the real rows taken once (the reference, at most
`objective_reference_rows` of them) at every T, a sum grows ~T / rows, an overflow shows as
Inf/NaN. Loss and the gradient w.r.t. the logits run on the configured objective's
`objective.logit_grad` graph (dynamic B and T: the grad stage's batch, the reference and every long
length share one compile; an objective that cannot compile with dynamic shapes falls back to one
static graph per length), with the gradient reduced in graph (squared norm, non-finite count).

Memory: each length runs only if (copies x T x V x 4 bytes) x memory_safety fits MemAvailable,
with `copies` measured on the lengths already run (peak RSS delta / logits bytes), before the
first one the profile's `memory_logits_copies`. A length estimated above `isolate_above_gib` runs
in a process of its own (`objdebug.pipeline.isolation`), so what it takes returns at its exit and a
length that does not fit after all is a SKIP with what it held, never a killed run.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from objdebug.pipeline.context import Context
from objdebug.core.findings import Check, Condition, Verdict
from objdebug.core.settings import Settings
import objdebug.stages.stress.memory as memory
from objdebug.engine import label_pairing
from objdebug.pipeline import isolation
from objdebug.pipeline.run_data import grad_batch, logit_gradients, paired, pairing, pairing_skip
from objdebug.stages.stress._common import ratio_band

GRAPH = "objective.logit_grad"  # the engine's (engine/gradients.py)
_MIN_COPIES = 3.0


def real_rows(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    """Scored rows of the model's real logits on the target's data [n, V] and the labels they are
    scored against [n] (the objective's measured pairing: engine/label_pairing.py)."""
    def build():
        batch = grad_batch(ctx)
        cached = ctx.provided(logit_gradients)  # the grad stage's logits, when it ran
        logits = cached["logits"] if cached else ctx.engine.logits(batch.input_ids)
        targets = paired(ctx, batch.labels)
        scored = (targets != ctx.config.data.label_pad_id) & (targets >= 0)  # -100 masks too
        return logits[scored].astype(np.float32), targets[scored].astype(np.int32)
    return ctx.provide(real_rows, build)


def objective_labels(targets: np.ndarray, offset: int, label_pad_id: int) -> np.ndarray:
    """The labels [1, T] to hand the objective so that logit position t is scored against
    targets[t]: as they are, or one position later for an objective that shifts them itself."""
    return label_pairing.labels_for_targets(targets, offset, label_pad_id)


def resampled(rows: np.ndarray, labels: np.ndarray, length: int, seed: int):
    idx = np.random.default_rng(seed).integers(0, len(rows), size=length)
    return rows[idx][None], labels[idx][None]


def _gib(n: float) -> str:
    return f"{n / memory.GIB:.2f} GiB"


def _call(ctx: Context, x, y):
    """The configured objective's logit-gradient graph `objective.logit_grad` (dynamic B and T,
    shared with the grad stage; a static one per length where the objective cannot compile
    with dynamic shapes, engine/dynamic_graph.py) -> (loss, squared logit-gradient norm,
    non-finite count); the gradient itself is reduced in the graph and never copied."""
    import mindspore as ms

    from objdebug.engine.gradients import objective_logit_grad_norm

    flat = ctx.config.objective.call == "flat"
    outputs, sq, bad = objective_logit_grad_norm(ctx.engine, ctx.target.objective, flat,
                                                 ms.Tensor(x, ms.float32), ms.Tensor(y, ms.int32))
    return outputs[0], sq, bad


def measure_one(ctx: Context, rows, labels, length: int | None, seed: int,
                offset: int = 0) -> dict[str, Any]:
    """The objective alone on the real rows resampled to `length` (None: once, in order): loss,
    logit-gradient norm, non-finite count, time and peak memory (here, or in the child that runs it).
    `offset`: the objective's pairing (1: it scores logits[t] against labels[t + 1])."""
    with memory.PeakRss() as rss:
        start = time.perf_counter()
        x, y = resampled(rows, labels, length, seed) if length else (rows[None], labels[None])
        y = objective_labels(y, offset, ctx.config.data.label_pad_id)
        loss, sq, bad = _call(ctx, x, y)
        loss, sq, bad = float(loss.asnumpy()), float(sq.asnumpy()), int(bad.asnumpy())
        seconds = time.perf_counter() - start
    return {"length": int(x.shape[1]), "ran": True, "loss": loss, "grad_norm": math.sqrt(sq),
            "nonfinite_grad": bad, "seconds": seconds, "peak_delta_bytes": rss.delta_bytes,
            "memory_method": rss.method, "logits_bytes": int(x.nbytes)}


class LongObjective(Check):
    name = "long-objective"
    stage = "stress"

    def skip_reason(self, ctx: Context) -> str | None:
        if ctx.target.end_to_end:
            if (ctx.target.info or {}).get("library_model"):  # its loss exists only inside the model
                return ("end-to-end form: the library model's loss runs only inside the model, on "
                        "inputs within its positions, not on logits alone at these lengths")
            return "end-to-end form: the objective takes input_ids, it cannot run on logits alone"
        return pairing_skip(ctx)

    def _one(self, ctx: Context, rows, labels, length: int | None, seed: int,
             isolate: bool = False, need: int | None = None) -> dict[str, Any]:
        """length None: `rows` as they are, in order (a reference run)."""
        offset = pairing(ctx).offset
        if not (isolate and isolation.available()):
            return measure_one(ctx, rows, labels, length, seed, offset)
        try:  # the child resamples: only the real rows travel
            return {**isolation.run_isolated(ctx, f"{__name__}:measure_one", need_bytes=need, rows=rows,
                                             labels=labels, length=length, seed=seed, offset=offset),
                    "isolated": True}
        except isolation.KilledForMemory as exc:
            return {"length": length, "ran": False, "isolated": True, "reason": str(exc),
                    "child_rss_bytes": exc.child_rss_bytes}

    def _reference(self, ctx: Context, rows, labels, cap: int, seed: int) -> dict[str, Any]:
        """The real rows once, in order (at most `cap`, evenly spaced): the exact mean a mean-reduced
        loss converges to on the resampled long sequences. A resampled or truncated short
        sequence would miss the few high-loss tokens of a well-trained model (measured on the
        demo: 128 of 174 rows gave a reference 3x too low)."""
        idx = np.linspace(0, len(rows) - 1, cap).round().astype(int) if len(rows) > cap else slice(None)
        return self._one(ctx, rows[idx], labels[idx], None, seed)

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        seed = int(th["seed"])
        safety = float(th["memory_safety"])
        rows, labels = real_rows(ctx)
        vocab = int(rows.shape[1])
        ref = self._reference(ctx, rows, labels, int(th["objective_reference_rows"]), seed)
        copies = float(th["memory_logits_copies"])
        copies_from = "profile memory_logits_copies"
        out: dict[str, Any] = {"reference": ref, "vocab": vocab, "rows": int(len(rows)),
                               "memory_safety": safety, "lengths": {}}
        for length in sorted(int(t) for t in th["objective_long_lengths"]):
            need = int(copies * length * vocab * 4)
            avail = memory.available_bytes()
            row: dict[str, Any] = {"length": length, "estimate_bytes": need, "copies": copies,
                                   "copies_from": copies_from, "available_bytes": avail}
            killed = next((r for r in out["lengths"].values() if r.get("child_rss_bytes") is not None), None)
            if killed is not None:  # increasing lengths: a longer one needs more
                row.update(ran=False, reason=(f"T={killed['length']} did not fit in its own process "
                                              f"(it held {_gib(killed['child_rss_bytes'])})"))
            elif (avail is not None and need * safety > avail
                  and not (isolation.available() and _MIN_COPIES * length * vocab * 4 <= avail)):
                row.update(ran=False, reason=(f"estimated {_gib(need)} ({copies:.3g} copies of the "
                                              f"logits, {copies_from}) x safety {safety} > "
                                              f"{_gib(avail)} available"))
            else:  # an estimate over what is free, with the lower bound fitting: measured in a
                # process of its own, where a wrong estimate costs a SKIP, not the run
                isolate = (need > float(th["isolate_above_gib"]) * memory.GIB
                           or (avail is not None and need * safety > avail))
                try:
                    row.update(self._one(ctx, rows, labels, length, seed, isolate, need))
                except Exception as exc:  # noqa: BLE001 - the reference ran: a limit of this length
                    # e.g. MindSpore's CPU kernels refuse buffers over 2 GiB ("GatherDGradV2,
                    # memset_s failed" at [1, 32768, 32000]); the lengths that ran are judged
                    from objdebug.core import crash
                    from objdebug.core.interrupts import swallowed

                    if swallowed() is not None:  # a signal turned into an error on the way: stop
                        raise

                    row.update(ran=False, failed=True, reason=f"failed at this length: {crash.summary(exc)}")
            if row["ran"]:
                row["ratio"] = (row["loss"] / ref["loss"] if ref["loss"] != 0 and math.isfinite(ref["loss"])
                                else float("nan"))
                measured = row["peak_delta_bytes"] / row["logits_bytes"]
                if measured > 0:  # the next length is judged by what this one really needed,
                    # at least the logits, their softmax and their gradient (a memory pool grown by
                    # an earlier run hides what a run reuses)
                    copies, copies_from = max(measured, _MIN_COPIES), f"measured at T={length}"
            out["lengths"][str(length)] = row
        return out

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        warn, fail = float(th["long_ratio_warn"]), float(th["long_ratio_fail"])

        def judge(v):
            ref = v["reference"]
            ran = [r for r in v["lengths"].values() if r["ran"]]
            skipped = [r for r in v["lengths"].values() if not r["ran"]]
            skip_note = "".join(f"; T={r['length']} not run: {r['reason']}" for r in skipped)
            if not ran:
                return Verdict.SKIP, f"no length ran{skip_note}", None
            shown = ", ".join(
                f"T={r['length']}: {r['loss']:.4g} (x{r['ratio']:.3g}, |grad| {r['grad_norm']:.3g}, "
                f"peak +{_gib(r['peak_delta_bytes'])} = {r['peak_delta_bytes'] / r['logits_bytes']:.3g} "
                f"logits copies, {r['seconds']:.1f} s)" for r in ran)
            msg = (f"objective alone on [1, T, {v['vocab']}] logits resampled from the model's real logits "
                   f"vs {ref['length']} of its {v['rows']} real rows once ({ref['loss']:.4g}): "
                   f"{shown}{skip_note}; "
                   f"pass within [1/{warn:g}, {warn:g}]x, fail outside [1/{fail:g}, {fail:g}]x or non-finite")
            bad = [r for r in ran if not math.isfinite(r["loss"]) or r["nonfinite_grad"]]
            if bad or not math.isfinite(ref["loss"]):
                r = bad[0] if bad else ref
                return Verdict.FAIL, (f"non-finite at T={r['length']} (loss {r['loss']:.4g}, "
                                      f"{r['nonfinite_grad']} NaN/Inf gradient elements): " + msg), float("nan")
            worst = max(ran, key=lambda r: abs(math.log(r["ratio"])) if r["ratio"] > 0 else math.inf)
            x = worst["ratio"]
            return ratio_band(x, warn, fail), msg, x

        return [Condition("OBJ513", f"objective_long_ratio_within_{warn:g}x", judge)]
