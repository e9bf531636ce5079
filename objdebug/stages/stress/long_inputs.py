"""Long inputs: loss and gradients at profile lengths (batch 1), against the same text short.

Each length is one sequence of real text (the target's samples concatenated and repeated), run
forward and backward through the user's model and objective. A length whose estimated memory
would not fit (see `memory.py`) is skipped with the estimate and what is available, never run.
Codes OBJ501 (finite loss and gradients, per length) and OBJ502 (loss within a band of the
short-input loss: a sum-reduced loss or positions past the trained range show here). On a `[task]`
kind other than the causal LM: row 0's text repeated to each length, in this process
(task_cases.py).

A length whose estimate is above `isolate_above_gib` runs in a process of its own
(`objdebug.pipeline.isolation`): the memory it takes returns when that process exits, and a length
that does not fit after all kills that process, not the run (a SKIP with what it held and what was
left).

On the CPU, with two cores or more and room to spare (the estimate x `memory_safety` plus a
quarter of the machine free), the shortest such length starts in its process when the stress stage
starts (`prepare`, `prepare_at = "stage"`), on one core of its own, so it runs beside the stage's
other checks instead of after them; its result is collected here, the stage's last check. The
stage is where the run waits: each out-of-range probe that the model or the objective rejects
costs MindSpore's fixed ~3 s error-path wait on an idle CPU (garbage_ids.py), and the child's
compile and arithmetic fill it (on the demo, four waits, 12 s, against the child's ~15 s).
Started with the run instead, it slowed the stages before stress by the same seconds it saved
(measured: align 1.4 -> 3.1 s, the grad stage 7.2 -> 9.3 s; the demo's wall 31.2-31.6 s from the
stage, 32.1-34.5 s from the run; on the Llama fixture, whose stress stage waits 6 s against the
child's 39 s, the run's start was ~1.5 s faster). One that is killed for memory
there runs again here, alone. Not on an accelerator: two processes would share one device's memory.

The check runs after the out-of-range probes, which retire the shared graphs they are rejected
on; the short reference it compares each length with goes through those graphs, so `prepare`
takes it when the stage starts (`reference_ahead`), and `measure` reads it (or measures it
itself when nothing was prepared: a check run alone). With `memory_calibration_lengths` the
reference is a point of the memory fit, taken with the calibration lengths, on static graphs of
its own length, which the probes never touch.

A model that names no position limit (engine/position_limit.py) and fails with a shape or index
error at a long (or calibration) length after a shorter one ran has found its limit: the longest
length that ran. The failed length and every longer one are INFO notes naming it, not crashes; any
other error, or one within a known limit, stays the check's ERROR.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from objdebug.pipeline.context import Context
from objdebug.core.findings import Check, Condition, Verdict
from objdebug.core.settings import Settings
import objdebug.stages.stress.memory as memory
from objdebug.stages.stress._common import loss_and_grad, packed, ratio_band, short_length, text_sample
from objdebug.engine import position_limit
from objdebug.engine import host_memory
from objdebug.pipeline import isolation
import objdebug.stages.stress.task_cases as task_cases


def _lengths(th: dict[str, Any]) -> list[int]:
    return [int(t) for t in th["long_lengths"]]


def _gib(n: float) -> str:
    return f"{n / memory.GIB:.2f} GiB"


def measure_one(ctx: Context, ids, labels, static: bool = True) -> dict[str, Any]:
    """Forward + backward on one long batch: loss, gradient norm, time and peak memory (in this
    process or, isolated, in the child that runs it). `static`: through the length's own graph,
    so its peak is that length's (the short reference shares the run's dynamic
    parameter-gradient graph unless calibration fits peaks)."""
    with memory.PeakRss() as rss:
        start = time.perf_counter()
        out = loss_and_grad(ctx, ids, labels, static=static)
        seconds = time.perf_counter() - start
    return {"length": int(ids.shape[1]), "ran": True, "loss": out["loss"], "grad_norm": out["grad_norm"],
            "nonfinite_params": out["nonfinite_params"], "n_params": out["n_params"],
            "seconds": seconds, "peak_rss_bytes": rss.peak_bytes,
            "peak_delta_bytes": rss.delta_bytes, "memory_method": rss.method}


def _ahead(ctx: Context) -> dict[int, Any]:
    """length -> the `Isolated` measurement started by `LongInputs.prepare` (not yet collected)."""
    return ctx.provide(_ahead, dict)


def reference_ahead(ctx: Context) -> dict[int, dict[str, Any]]:
    """length -> the short reference `LongInputs.prepare` measured when the stage started (not
    yet read by `measure`)."""
    return ctx.provide(reference_ahead, dict)


def _sizes(ctx: Context, th: Settings) -> tuple[int, int, dict[str, Any]]:
    """(vocabulary, trainable parameters, the model's shape) the memory estimate reads."""
    vocab = ctx.engine.vocab_size() or int(th["assume_vocab"])
    n_params = sum(int(p.size) for p in ctx.target.trainable_params())
    return vocab, n_params, memory.model_shape(ctx.target.model or ctx.target.objective, vocab, th)


def _usable_cpus() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set()


class LongInputs(Check):
    name = "long-inputs"
    stage = "stress"
    prepare_at = "stage"
    kinds = task_cases.ALL

    def skip_reason(self, ctx: Context) -> str | None:
        return task_cases.no_rows(ctx)

    def prepare(self, ctx: Context, th: Settings) -> None:
        """When the stage starts: take the short reference ahead, then start the shortest length
        that will run in a process of its own (see the module docstring), when the run can
        spare the cores and the memory for it now."""
        if task_cases.is_task(ctx):
            # a kind's lengths run in this process when the check's turn comes; its short
            # reference now, before the out-of-range probes retire the graphs it runs on
            length = position_limit.cap(short_length(th), ctx)
            reference_ahead(ctx)[length] = task_cases.long_one(ctx, length)
            return
        if not th["memory_calibration_lengths"]:  # (with calibration: a point of the fit, later)
            length = position_limit.cap(short_length(th), ctx)
            reference_ahead(ctx)[length] = self._one(ctx, length, static=False)
        cpus = _usable_cpus()
        if (ctx.config.run.device != "CPU" or not isolation.available() or len(cpus) < 2
                or th["memory_calibration_lengths"]):
            return  # calibration refits each length's estimate from peaks this process measures
        lengths = sorted(set(position_limit.capped_lengths(_lengths(th), ctx).values()))
        if not lengths:
            return
        length = lengths[0]
        vocab, n_params, shape = _sizes(ctx, th)
        need = memory.estimate_bytes(length, vocab, n_params, shape, th)
        avail, total = memory.available_bytes(), host_memory.total_bytes()
        if need <= float(th["isolate_above_gib"]) * memory.GIB or avail is None or total is None:
            return  # it runs in this process: nothing to start
        if avail < need * float(th["memory_safety"]) + total // 4:
            return  # no room beside the run: it runs alone, when its turn comes
        sample = text_sample(ctx, length, "long")
        ids, labels = packed(ctx, [sample], length)
        # one core of its own (measured on the demo, 2 cores: unpinned, its kernels' threads
        # slowed the stages' compiles by 30-80%, 54.3 s for the run against 50.6 s pinned)
        handle = isolation.start_isolated(ctx, f"{__name__}:measure_one", stage=self.stage,
                                          check=self.name, cpus={max(cpus)}, ids=ids, labels=labels)
        _ahead(ctx)[length] = handle
        ctx.background.append(handle)

    def _collect(self, ctx: Context, length: int) -> dict[str, Any] | None:
        """The measurement `prepare` started at `length` (None: none was): its result, or, when
        it was killed for memory beside the run, None (the length then runs again, alone)."""
        handle = _ahead(ctx).pop(length, None)
        if handle is None or handle.cancelled:  # (ended with a run that stopped before it)
            return None
        if handle in ctx.background:
            ctx.background.remove(handle)
        try:
            return {**handle.result(), "isolated": True, "started_early": True}
        except isolation.KilledForMemory:
            return None

    def _drop_ahead(self, ctx: Context) -> None:
        """Cancel what `prepare` started and this run did not use (a length it no longer runs)."""
        for handle in _ahead(ctx).values():
            if handle in ctx.background:
                ctx.background.remove(handle)
            handle.cancel()
        _ahead(ctx).clear()

    def _one(self, ctx: Context, length: int, isolate: bool = False, need: int | None = None,
             static: bool = True) -> dict[str, Any]:
        sample = text_sample(ctx, length, "long")
        ids, labels = packed(ctx, [sample], length)
        if not (isolate and isolation.available()):
            return measure_one(ctx, ids, labels, static)
        try:
            return {**isolation.run_isolated(ctx, f"{__name__}:measure_one", need_bytes=need,
                                             ids=ids, labels=labels), "isolated": True}
        except isolation.KilledForMemory as exc:
            return {"length": length, "ran": False, "isolated": True, "reason": str(exc),
                    "child_rss_bytes": exc.child_rss_bytes, "available_bytes": exc.available_bytes}

    def _calibrate(self, ctx: Context, th: dict[str, Any], reference: dict[str, Any],
                   runs: dict[int, dict[str, Any]], fallback: dict[str, Any]) -> dict[str, Any] | None:
        """Peaks at the short length and `memory_calibration_lengths`, fitted a + bT + cT^2;
        the runs go into `runs` by length. A model that names no limit and fails at a calibration
        length: `fallback` gets the longest length that ran and the error, calibration stops."""
        if reference["memory_method"] != "vmhwm-reset":
            return None  # the high-water mark cannot be reset: no per-run peak to fit
        # never past the model's position limit: those lengths cannot run at all
        extra = sorted({position_limit.cap(int(t), ctx) for t in th["memory_calibration_lengths"]})
        lengths, peaks = [reference["length"]], [reference["peak_rss_bytes"]]
        for length in sorted(set(extra) - {reference["length"]}):  # increasing: the pool grows
            try:
                r = self._one(ctx, length)
            except Exception as exc:
                why = position_limit.learnable(exc, ctx)
                if why is None:
                    raise
                position_limit.learned(ctx, max(lengths), length, why)
                fallback.update(fallback_limit=max(lengths), fallback_failed=length, fallback_error=why)
                break
            runs[length] = r
            lengths.append(length)
            peaks.append(r["peak_rss_bytes"])
        return memory.fit_peaks(lengths, peaks)

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        if task_cases.is_task(ctx):  # the kind's row 0 repeated to each length (task_cases.py)
            ref_len = position_limit.cap(short_length(th), ctx)
            return task_cases.long_inputs(ctx, th, _lengths(th), reference_ahead(ctx).pop(ref_len, None))
        try:
            return self._measure(ctx, th)
        finally:  # what `prepare` started and this run did not use (or a crash) goes now
            self._drop_ahead(ctx)

    def _measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        vocab, n_params, shape = _sizes(ctx, th)
        safety = float(th["memory_safety"])
        ref_len = position_limit.cap(short_length(th), ctx)
        # the reference's peak is fitted only by calibration: else it shares the dynamic graph,
        # and `prepare` took it before the out-of-range probes retired that graph
        reference = (reference_ahead(ctx).pop(ref_len, None)
                     or self._one(ctx, ref_len, static=bool(th["memory_calibration_lengths"])))
        calibration_runs: dict[int, dict[str, Any]] = {}
        fallback: dict[str, Any] = {}  # a model that names no limit: the longest length that ran
        calib = self._calibrate(ctx, th, reference, calibration_runs, fallback)
        # the fit is of the process's absolute peak RSS (MindSpore's memory pool only grows, so
        # a delta after an earlier run undercounts); what a length adds is the peak minus now
        out: dict[str, Any] = {"reference": reference, "vocab": vocab, "model_shape": shape,
                               "memory_safety": safety, "lengths": {}, "calibration": calib, **fallback}
        runs_at = position_limit.capped_lengths(_lengths(th), ctx)
        ran_at: dict[int, dict[str, Any]] = {}  # a length that ran (2048 and 4096 both capped to 512: once)
        for asked in sorted(runs_at):
            length = runs_at[asked]
            if length in ran_at:
                out["lengths"][str(asked)] = {**ran_at[length], "asked": asked, "capped_to": length,
                                              "note": position_limit.note(asked, length, ctx)}
                continue
            static = memory.estimate_bytes(length, vocab, n_params, shape, th)
            # the static estimate is the rule only where calibration cannot run (reported beside
            # the prediction otherwise); the floor keeps a flat fit of small peaks honest
            need = (max(memory.predict_bytes(calib, length) - memory.rss_bytes(),
                        memory.floor_bytes(length, vocab, shape)) if calib else static)
            avail = memory.available_bytes()
            row: dict[str, Any] = {"length": length, "estimate_bytes": need, "static_estimate_bytes": static,
                                   "estimate_from": "calibration" if calib else "static estimate",
                                   "fit_lengths": calib["lengths"] if calib else None,
                                   "available_bytes": avail}
            longest = max([reference["length"], *calibration_runs,
                           *(t for t, r in ran_at.items() if r["ran"])])
            killed = next((r for r in ran_at.values() if r.get("child_rss_bytes") is not None), None)
            if out.get("fallback_limit") and length > out["fallback_limit"]:
                row.update(ran=False, beyond_ran=True, longest_ran=out["fallback_limit"],
                           reason=(f"beyond T={out['fallback_limit']}, the longest length that ran "
                                   f"(T={out['fallback_failed']} failed: {out['fallback_error']})"))
            elif killed is not None:  # lengths run in increasing order: a longer one needs more
                row.update(ran=False, reason=(f"T={killed['length']} did not fit in its own process "
                                              f"(it held {_gib(killed['child_rss_bytes'])}); "
                                              f"a longer input needs more"))
            elif (avail is not None and need * safety > avail
                  and not (isolation.available() and memory.floor_bytes(length, vocab, shape) <= avail)):
                row.update(ran=False, reason=(f"predicted {_gib(need)} ({row['estimate_from']}) x safety "
                                              f"{safety} > {_gib(avail)} available"))
            else:
                # a long length that was a calibration length already ran: its numbers stand
                # an estimate over what is free while the lower bound (one copy of the logits and
                # the attention scores) fits: measured in a process of its own, where a wrong
                # estimate costs a SKIP, not the run
                isolate = (need > float(th["isolate_above_gib"]) * memory.GIB
                           or (avail is not None and need * safety > avail))
                try:
                    row.update(calibration_runs.get(length) or self._collect(ctx, length)
                               or self._one(ctx, length, isolate, need))
                except Exception as exc:  # (from its own process: IsolatedError with its text)
                    why = position_limit.learnable(exc, ctx)
                    if why is None:
                        raise  # within a known limit, or not a shape error: the crash it is
                    # a model that names no limit: the longest length that ran is the limit
                    position_limit.learned(ctx, longest, length, why)
                    out.update(fallback_limit=longest, fallback_failed=length, fallback_error=why)
                    row.update(ran=False, beyond_ran=True, longest_ran=longest,
                               reason=f"fails with a shape error after T={longest} ran: {why}")
                    ran_at[length] = row
                    out["lengths"][str(asked)] = row
                    continue
            # a run in this process is the best point of the fit for the next length (a child's
            # peak is another process's, not a point of this one's)
            if row["ran"] and not row.get("isolated") and calib and length not in calib["lengths"]:
                calib = memory.fit_peaks(calib["lengths"] + [length], calib["peaks"] + [row["peak_rss_bytes"]])
                row["refit"] = calib
            if row["ran"]:
                row["ratio"] = (row["loss"] / reference["loss"]
                                if reference["loss"] not in (0.0,) and math.isfinite(reference["loss"])
                                else float("nan"))
            if asked != length:
                row.update(asked=asked, capped_to=length, note=position_limit.note(asked, length, ctx))
            ran_at[length] = row
            out["lengths"][str(asked)] = row
        avail_now, rss_now = memory.available_bytes(), memory.rss_bytes()
        out["longest_fitting"] = (memory.longest_fitting(calib, rss_now + avail_now / safety)
                                  if calib and avail_now else None)
        return out

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        warn, fail = float(th["long_ratio_warn"]), float(th["long_ratio_fail"])

        def finite_at(length: int):
            def judge(v):
                r = v["lengths"][str(length)]
                if r.get("beyond_ran"):  # a model that names no position limit (position_limit.py)
                    return Verdict.INFO, (f"T={length} not run: {r['reason']}; the model names no position "
                                          f"limit, so T={r['longest_ran']}, the longest length that ran, is "
                                          f"taken as its limit (set data.max_length to say it)"), None
                if r.get("raised"):  # a kind's length the objective's graph cannot take
                    return Verdict.INFO, (f"T={length} not run: {r['reason']}; a clear error at this "
                                          "length, not a wrong loss (an unrolled loop per position "
                                          "stops near MindSpore's call depth)"), None
                if not r["ran"]:
                    longest = (f"; the longest length that fits is ~{v['longest_fitting']} tokens"
                               if v.get("longest_fitting") else "")
                    return Verdict.SKIP, f"T={length} not run: {r['reason']}{longest}", None
                fitted = (f"predicted +{_gib(r['estimate_bytes'])} from peak RSS a + bT + cT^2 fitted on T="
                          f"{'/'.join(str(t) for t in r['fit_lengths'])}, static estimate "
                          f"{_gib(r['static_estimate_bytes'])}" if r.get("fit_lengths") else
                          f"static estimate {_gib(r['estimate_bytes'])}")
                longest = (f"; longest length that fits {_gib(r['available_bytes'] or 0)} available / "
                           f"safety: ~{v['longest_fitting']} tokens" if v.get("longest_fitting") else "")
                cost = (f"{r['seconds']:.1f} s incl. compile, measured peak +{_gib(r['peak_delta_bytes'])} "
                        f"(RSS {_gib(r['peak_rss_bytes'])}{' in its own process' if r.get('isolated') else ''}) "
                        f"vs {fitted}{longest}")
                if r.get("capped_to") and math.isfinite(r["loss"]) and r["nonfinite_params"] == 0:
                    # a profile length the model cannot take: a note naming the limit
                    return Verdict.INFO, (f"{r['note']}: loss {r['loss']:.4g}, gradient norm "
                                          f"{r['grad_norm']:.3g}, all finite; {cost}"), r["loss"]
                if math.isfinite(r["loss"]) and r["nonfinite_params"] == 0:
                    return Verdict.PASS, (f"T={length}: loss {r['loss']:.4g}, gradient norm "
                                          f"{r['grad_norm']:.3g}, all finite; {cost}"), r["loss"]
                return Verdict.FAIL, (f"T={r['length']}: loss {r['loss']:.4g}, {r['nonfinite_params']}/"
                                      f"{r['n_params']} parameters with NaN/Inf gradients; {cost}"), \
                    r["loss"]
            return judge

        tol = float(th["long_abs_tolerance"])

        def ratio(v):
            ref = v["reference"]
            ran = [r for r in v["lengths"].values() if r["ran"]]
            if not ran:
                return Verdict.SKIP, "no long length ran (see OBJ501)", None
            worst = max(ran, key=lambda r: abs(math.log(r["ratio"])) if r["ratio"] > 0 and
                        math.isfinite(r["ratio"]) else math.inf)
            x = worst["ratio"]
            shown = ", ".join(f"T={r['length']}: {r['loss']:.4g} (x{r['ratio']:.3g})" for r in ran)
            msg = (f"loss vs the same text at T={ref['length']} ({ref['loss']:.4g}): {shown}; "
                   f"pass within [1/{warn:g}, {warn:g}]x or {tol:g} nats, fail outside [1/{fail:g}, {fail:g}]x")
            # two near-zero losses (a trained encoder's 3e-4 vs 6e-4 nats) have a ratio of noise
            if all(math.isfinite(r["loss"]) and abs(r["loss"] - ref["loss"]) <= tol for r in ran):
                return Verdict.PASS, msg, x
            return ratio_band(x, warn, fail), msg, x

        conds = [Condition("OBJ501", f"finite_at_{t}_tokens", finite_at(t)) for t in _lengths(th)]
        return conds + [Condition("OBJ502", f"loss_ratio_within_{warn:g}x", ratio)]
