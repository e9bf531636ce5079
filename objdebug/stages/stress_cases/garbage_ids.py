"""Garbage token ids: random in-vocabulary ids (OBJ505) and out-of-range ids (OBJ506, OBJ507).

Random ids are unpredictable: a sound objective gives a finite loss near or above log(V) (an
untrained model sits at log(V), a trained one above it). Out-of-range ids must be rejected with an
error, never turned into a number: MindSpore's Gather wraps a negative input id silently (-1 reads
the last row) and nn.CrossEntropyLoss scores a label of -1 as class V-1. Four probes, each one
position of one row of a valid random batch (batch 1, a graph per probe): input id V, input id -1,
label V, label -1 (skipped when -1 is the label_pad_id).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.context import Context
from objdebug.data import Sample
from objdebug.errors import InputError
from objdebug.findings import Check, Condition, Verdict
from objdebug.stages.stress_cases._common import (POISONED, error_line, forward_loss, loss_and_grad,
                                                  packed, short_length)

_PROBE_POSITION = 5
_NO_VOCAB = ("the vocabulary size is unknown (the end-to-end form does not expose logits): set "
             "data.vocab_size to draw random and out-of-range ids")


def _vocab_skip(ctx: Context) -> str | None:
    """SKIP, not ERROR, when the vocabulary the ids are drawn from is unknown."""
    return None if ctx.engine.vocab_size() else _NO_VOCAB


def random_batch(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    """[batch_size, short_length] uniformly random in-vocabulary ids, every next token scored."""
    def build():
        th = ctx.profile.section("stress")
        length, vocab = short_length(th), ctx.engine.vocab_size()
        if not vocab:
            raise ValueError("the vocabulary size is unknown: set data.vocab_size for the "
                             "end-to-end form")
        rng = np.random.default_rng(int(th.get("seed", 0)))
        rows = [Sample(id=f"random-{i}", prompt=[], response=[int(t) for t in rng.integers(0, vocab, length)])
                for i in range(ctx.engine.batch_size)]
        return packed(ctx, rows, length)
    return ctx.cached("stress.random_batch", build)


class RandomIds(Check):
    name = "random-ids"
    stage = "stress"
    codes = ("OBJ505",)

    def skip_reason(self, ctx: Context) -> str | None:
        return _vocab_skip(ctx)

    def measure(self, ctx: Context) -> dict[str, Any]:
        ids, labels = random_batch(ctx)
        losses = ctx.engine.per_sample_raw(ids, labels)[:, 0]
        grad = loss_and_grad(ctx, ids[:1], labels[:1])
        vocab = ctx.engine.vocab_size()
        return {"vocab": vocab, "log_vocab": math.log(vocab), "shape": list(ids.shape),
                "losses": losses, "mean_loss": float(np.mean(losses)),
                "min_loss": float(np.min(losses)),
                "grad_loss": grad["loss"], "grad_norm": grad["grad_norm"],
                "nonfinite_params": grad["nonfinite_params"], "n_params": grad["n_params"]}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        low = float(th.get("random_ids_min_ratio", 0.8))

        def judge(v):
            x, lv = v["mean_loss"], v["log_vocab"]
            ratio = x / lv
            msg = (f"{v['shape'][0]}x{v['shape'][1]} random ids: mean loss {x:.4g} (min {v['min_loss']:.4g})"
                   f" = {ratio:.3g} x log(V={v['vocab']}) = {lv:.4g}; gradients of row 0: norm "
                   f"{v['grad_norm']:.3g}, {v['nonfinite_params']}/{v['n_params']} non-finite")
            if not np.all(np.isfinite(v["losses"])) or v["nonfinite_params"]:
                return Verdict.FAIL, msg + "; NaN/Inf on random tokens", ratio
            if ratio < low:
                return Verdict.WARN, (msg + f"; below {low:g} x log(V): the objective rewards "
                                      f"unpredictable tokens"), ratio
            return Verdict.PASS, msg + f"; pass >= {low:g} x log(V)", ratio

        return [Condition("OBJ505", f"random_ids_loss_at_least_{low:g}_log_vocab", judge)]


class OutOfRangeIds(Check):
    name = "out-of-range-ids"
    stage = "stress"
    codes = ("OBJ506", "OBJ507")

    def skip_reason(self, ctx: Context) -> str | None:
        return _vocab_skip(ctx)

    def _probe(self, ctx: Context, name: str, ids: np.ndarray, labels: np.ndarray,
               bad_ids: np.ndarray, bad_labels: np.ndarray) -> dict[str, Any]:
        valid = forward_loss(ctx, name, ids, labels)  # the graph works: an error below is the probe's
        try:
            value = forward_loss(ctx, name, bad_ids, bad_labels)
        except Exception as exc:  # rejection is the healthy outcome
            if POISONED in str(exc).lower():
                raise
            return {"rejected": True, "valid_loss": valid,
                    "error": f"{type(exc).__name__}: {error_line(exc)[:200]}"}
        return {"rejected": False, "valid_loss": valid, "value": value}

    def measure(self, ctx: Context) -> dict[str, Any]:
        ids, labels = random_batch(ctx)
        ids, labels = ids[:1], labels[:1]  # batch 1: small probe graphs
        vocab = ctx.engine.vocab_size()
        p, pad = _PROBE_POSITION, ctx.config.data.label_pad_id
        probes: dict[str, Any] = {}
        graph = 0  # a graph that raised refuses every later call: the next probe gets a fresh one
        for path, bad in (("input", vocab), ("input", -1), ("label", vocab), ("label", -1)):
            key = f"{path} {bad}"
            if path == "label" and bad == pad:
                probes[key] = {"skipped": "-1 is the label_pad_id"}
                continue
            i, l = ids.copy(), labels.copy()
            (i if path == "input" else l)[0, p] = bad
            probes[key] = self._probe(ctx, f"stress.probe.{graph}", ids, labels, i, l)
            graph += int(probes[key]["rejected"])
        valid = next((r["valid_loss"] for r in probes.values() if "valid_loss" in r), float("nan"))
        return {"vocab": vocab, "valid_loss": valid, "position": p, "shape": list(ids.shape),
                "probes": probes}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        def judge_path(path: str, setting: str, default: str):
            value = str(th.get(setting, default)).lower()
            if value not in ("warn", "fail"):
                raise InputError(f"For '[stress] {setting}', the value must be in ['warn', 'fail'], "
                                 f"but got {value!r}.")
            verdict = Verdict(value.upper())

            def judge(v):
                mine = {k: r for k, r in v["probes"].items() if k.startswith(path)}
                parts, silent = [], []
                for k, r in mine.items():
                    if "skipped" in r:
                        parts.append(f"{k}: skipped ({r['skipped']})")
                    elif r["rejected"]:
                        parts.append(f"{k}: rejected ({r['error'][:100]})")
                    else:
                        parts.append(f"{k}: accepted, loss {r['value']:.4g}")
                        silent.append(k)
                msg = (f"{path} ids out of [0, {v['vocab']}) at one position (valid loss "
                       f"{v['valid_loss']:.4g}): " + "; ".join(parts))
                if silent:
                    return verdict, msg + f"; silently scored (profile {setting} = {verdict.value.lower()})", \
                        float(len(silent))
                return Verdict.PASS, msg, 0.0
            return judge

        return [Condition("OBJ506", "out_of_range_labels_rejected",
                          judge_path("label", "label_out_of_range", "fail")),
                Condition("OBJ507", "out_of_range_input_ids_rejected",
                          judge_path("input", "input_out_of_range", "warn"))]
