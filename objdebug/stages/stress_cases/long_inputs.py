"""Long inputs: loss and gradients at profile lengths (batch 1), against the same text short.

Each length is one sequence of real text (the target's samples concatenated and repeated), run
forward and backward through the user's model and objective. A length whose estimated memory
would not fit (see `memory.py`) is skipped with the estimate and what is available, never run.
Codes OBJ501 (finite loss and gradients, per length) and OBJ502 (loss within a band of the
short-input loss: a sum-reduced loss or positions past the trained range show here).
"""

from __future__ import annotations

import math
import time
from typing import Any

from objdebug.context import Context
from objdebug.findings import Check, Condition, Verdict
from objdebug.stages.stress_cases import memory
from objdebug.stages.stress_cases._common import loss_and_grad, packed, short_length, text_sample


def _lengths(th: dict[str, Any]) -> list[int]:
    return [int(t) for t in th.get("long_lengths", [2048, 4096])]


def _gib(n: float) -> str:
    return f"{n / memory.GIB:.2f} GiB"


class LongInputs(Check):
    name = "long-inputs"
    stage = "stress"
    codes = ("OBJ501", "OBJ502")

    def _one(self, ctx: Context, length: int) -> dict[str, Any]:
        sample = text_sample(ctx, length, "long")
        ids, labels = packed(ctx, [sample], length)
        with memory.PeakRss() as rss:
            start = time.perf_counter()
            out = loss_and_grad(ctx, ids, labels)
            seconds = time.perf_counter() - start
        return {"length": length, "ran": True, "loss": out["loss"], "grad_norm": out["grad_norm"],
                "nonfinite_params": out["nonfinite_params"], "n_params": out["n_params"],
                "seconds": seconds, "peak_rss_bytes": rss.peak_bytes,
                "peak_delta_bytes": rss.delta_bytes, "memory_method": rss.method}

    def measure(self, ctx: Context) -> dict[str, Any]:
        th = ctx.profile.section(self.stage)
        vocab = ctx.engine.vocab_size() or int(th.get("assume_vocab", 32000))
        n_params = sum(int(p.size) for p in ctx.target.trainable_params())
        shape = memory.model_shape(ctx.target.model or ctx.target.objective, vocab, th)
        safety = float(th.get("memory_safety", 1.5))
        ref_len = short_length(th)
        reference = self._one(ctx, ref_len)
        out: dict[str, Any] = {"reference": reference, "vocab": vocab, "model_shape": shape,
                               "memory_safety": safety, "lengths": {}}
        for length in _lengths(th):
            need = memory.estimate_bytes(length, vocab, n_params, shape, th)
            avail = memory.available_bytes()
            row: dict[str, Any] = {"length": length, "estimate_bytes": need, "available_bytes": avail}
            if avail is not None and need * safety > avail:
                row.update(ran=False, reason=(f"estimated {_gib(need)} x safety {safety} > "
                                              f"{_gib(avail)} available"))
            else:
                row.update(self._one(ctx, length))
                row["ratio"] = (row["loss"] / reference["loss"]
                                if reference["loss"] not in (0.0,) and math.isfinite(reference["loss"])
                                else float("nan"))
            out["lengths"][str(length)] = row
        return out

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        warn, fail = float(th.get("long_ratio_warn", 2.0)), float(th.get("long_ratio_fail", 10.0))

        def finite_at(length: int):
            def judge(v):
                r = v["lengths"][str(length)]
                if not r["ran"]:
                    return Verdict.SKIP, f"T={length} not run: {r['reason']}", None
                cost = (f"{r['seconds']:.1f} s incl. compile, peak RSS {_gib(r['peak_rss_bytes'])} "
                        f"(+{_gib(r['peak_delta_bytes'])}, estimate {_gib(r['estimate_bytes'])})")
                if math.isfinite(r["loss"]) and r["nonfinite_params"] == 0:
                    return Verdict.PASS, (f"T={length}: loss {r['loss']:.4g}, gradient norm "
                                          f"{r['grad_norm']:.3g}, all finite; {cost}"), r["loss"]
                return Verdict.FAIL, (f"T={length}: loss {r['loss']:.4g}, {r['nonfinite_params']}/"
                                      f"{r['n_params']} parameters with NaN/Inf gradients; {cost}"), \
                    r["loss"]
            return judge

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
                   f"pass within [1/{warn:g}, {warn:g}]x, fail outside [1/{fail:g}, {fail:g}]x")
            if not (math.isfinite(x) and x > 0):
                return Verdict.FAIL, msg, x
            if 1 / warn <= x <= warn:
                return Verdict.PASS, msg, x
            if x < 1 / fail or x > fail:
                return Verdict.FAIL, msg, x
            return Verdict.WARN, msg, x

        conds = [Condition("OBJ501", f"finite_at_{t}_tokens", finite_at(t)) for t in _lengths(th)]
        return conds + [Condition("OBJ502", f"loss_ratio_within_{warn:g}x", ratio)]
