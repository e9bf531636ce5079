"""Garbage token ids: random in-vocabulary ids (OBJ505) and out-of-range ids (OBJ506, OBJ507).

Random ids are unpredictable: a sound objective gives a finite loss near or above log(V) (an
untrained model sits at log(V), a trained one above it).

Out-of-range ids: four probes, each one position of one row of a valid random batch (batch 1, a
graph per probe): input id V, input id -1, label V, label -1 (skipped when -1 is the
label_pad_id). Three outcomes, judged apart:

- rejected with an error: PASS (the healthy outcome);
- a NaN/Inf loss: FAIL (a bad id poisons the whole batch, and the step after it);
- a finite loss, silently scored: the profile's verdict (`[stress] label_out_of_range` /
  `input_out_of_range`, "info" by default). This is MindSpore's nature rather than an objective
  bug: GatherD accepts indices in [-V, V), so nn.CrossEntropyLoss and nearly every hand-written
  `gather_elements` cross-entropy score label -1 as class V-1, and every standard embedding
  (nn.Embedding, ops.gather) reads row V-1 for input id -1. The label the data pipeline actually
  writes is checked by OBJ105; a note here says the objective would not catch a wrong one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.context import Context
from objdebug.engine.data import Sample
from objdebug.findings import Check, Condition, Verdict
from objdebug.settings import Settings
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
        rng = np.random.default_rng(int(th["seed"]))
        rows = [Sample(id=f"random-{i}", prompt=[], response=[int(t) for t in rng.integers(0, vocab, length)])
                for i in range(ctx.engine.batch_size)]
        return packed(ctx, rows, length)
    return ctx.provide(random_batch, build)


class RandomIds(Check):
    name = "random-ids"
    stage = "stress"

    def skip_reason(self, ctx: Context) -> str | None:
        return _vocab_skip(ctx)

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
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
        low = float(th["random_ids_min_ratio"])

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

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
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
            probes[key] = r = self._probe(ctx, f"stress.probe.{graph}", ids, labels, i, l)
            if not r["rejected"] and bad < 0 and math.isfinite(r["value"]):
                # what was -1 read as? Gather's wrap-around reads it as V-1: the same graph, which
                # did not raise, scores the batch with V-1 in its place
                (i if path == "input" else l)[0, p] = bad + vocab
                r["wrapped_value"] = forward_loss(ctx, f"stress.probe.{graph}", i, l)
                r["wraps"] = bool(abs(r["wrapped_value"] - r["value"]) <= 1e-6 * max(abs(r["value"]), 1.0))
            graph += int(r["rejected"])
        valid = next((r["valid_loss"] for r in probes.values() if "valid_loss" in r), float("nan"))
        return {"vocab": vocab, "valid_loss": valid, "position": p, "shape": list(ids.shape),
                "probes": probes}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        def judge_path(path: str, setting: str):
            # validated when the conditions are built: a typo is a usage error, before any run
            silent_verdict = Verdict.from_setting(th[setting], f"[stress] {setting}")

            def judge(v):
                mine = {k: r for k, r in v["probes"].items() if k.startswith(path)}
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
                        read_as = (f" = the loss with {k.split()[0]} {int(k.split()[1]) + v['vocab']} "
                                   "(wrapped)" if r.get("wraps") else "")
                        parts.append(f"{k}: accepted, loss {r['value']:.4g}{read_as}")
                        silent.append(k)
                msg = (f"{path} ids out of [0, {v['vocab']}) at one position (valid loss "
                       f"{v['valid_loss']:.4g}): " + "; ".join(parts))
                if nonfinite:
                    return Verdict.FAIL, msg + f"; NaN/Inf instead of an error for {', '.join(nonfinite)}", \
                        float(len(nonfinite) + len(silent))
                if silent:
                    nature = ("MindSpore's GatherD accepts [-V, V), as nn.CrossEntropyLoss does; the "
                              "labels your pipeline writes are checked by OBJ105" if path == "label"
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
