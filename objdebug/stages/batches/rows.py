"""OBJ014 / OBJ015 / OBJ016: what each real row trains, its ids, its attention mask.

OBJ014: the supervised share of each row's real tokens and the rows with nothing to learn
(a truncation that cut the whole response, a prompt mask as long as the row). OBJ015: ids
outside the model's vocabulary (inputs anywhere, labels that the objective does not ignore).
OBJ016: an attention mask that disagrees with the padding (1 on the pad run, 0 on real tokens,
values other than 0 and 1). A packed row's mask may number its sequences instead of marking them
1 (MindFormers' DPO packing writes each pair's slot + 1, LLaMA-Factory's neat packing each
sequence's index): a row is such a mask when its nonzero values count 1, 2, ... along it, and
those values mark real tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.core.findings import Check, Condition, Verdict
from objdebug.stages.batches.words import few
from objdebug.stages.batches.show import chat_rows, decoder, view
from objdebug.stages.batches.audit import TRAINED, audit, no_label_objective, real_batches
from objdebug.pipeline.pipeline_batches import edge_runs, run_mask


def _at(lay, r: int) -> str:
    return f"batch {lay.batch.number} row {r}"


class Supervision(Check):
    """OBJ014: every row trains on something; the supervised share per row."""

    name = "batch-supervision"
    stage = "batches"

    def skip_reason(self, ctx: Any) -> str | None:
        return no_label_objective(ctx)  # which positions train is the objective's to say

    def measure(self, ctx: Any, th: Any) -> dict[str, Any]:
        a = audit(ctx, th)
        shares, empty = [], []
        for lay in a.layouts:
            trained = (a.classes(lay) == TRAINED).sum(axis=1)
            real = (~lay.padding).sum(axis=1)
            for r in range(len(real)):
                shares.append(float(trained[r] / real[r]) if real[r] else 0.0)
                if trained[r] == 0:
                    empty.append(_at(lay, r))
        low = int(np.argmin(shares))
        # the same rows `objdebug batches --show` prints, for the HTML report (report/batch_rows.py)
        shown = (view(a, int(th["report_rows"]), decoder(ctx.config), chat_rows(ctx, th))
                 if int(th["report_rows"]) else None)
        return {"source": a.source, "rows": len(shares), "mean_share": float(np.mean(shares)),
                "min_share": shares[low], "empty": empty,
                "empty_share": len(empty) / len(shares), "fail_above": float(th["empty_rows_fail"]),
                "rows_view": shown}

    def conditions(self, th: Any) -> list[Condition]:
        def judge(v):
            share = (f"supervised share of real tokens: mean {v['mean_share']:.0%}, lowest "
                     f"{v['min_share']:.0%}")
            if v["empty"] and v["empty_share"] > v["fail_above"]:
                return Verdict.FAIL, (f"{len(v['empty'])} of {v['rows']} rows of '{v['source']}' "
                                      f"have nothing to learn ({few(v['empty'])}): no position "
                                      f"of theirs is trained; {share}"), v["empty_share"]
            extra = f"; {len(v['empty'])} rows with nothing to learn: {few(v['empty'])}" if v["empty"] else ""
            return Verdict.PASS, f"every row of {v['rows']} trains; {share}{extra}", v["empty_share"]

        return [Condition("OBJ014", "every_row_trains", judge)]


class Vocabulary(Check):
    """OBJ015: input ids and trained labels inside [0, vocabulary)."""

    name = "batch-vocabulary"
    stage = "batches"

    def skip_reason(self, ctx: Any) -> str | None:
        if ctx.engine.vocab_size() is None:
            return ("the model's vocabulary is unknown (no logits, no input embedding found, no "
                    "data.vocab_size or tokenizer declared)")
        return None

    def measure(self, ctx: Any, th: Any) -> dict[str, Any]:
        a = audit(ctx, th)
        vocab, ignored = a.vocab, a.ignored()
        unprobed = no_label_objective(ctx) is not None  # ignored values unknown: negatives not counted
        found = {"input_ids": [], "labels": []}
        counts = {"input_ids": 0, "labels": 0}
        for lay in a.layouts:
            columns = {"input_ids": lay.batch.input_ids}
            if lay.batch.labels is not None:
                columns["labels"] = lay.batch.labels
            for name, values in columns.items():
                out = (values < 0) | (values >= vocab)
                if name == "labels":
                    out &= (values >= 0) if unprobed else ~np.isin(values, ignored)
                counts[name] += int(out.sum())
                for r, t in zip(*np.nonzero(out)):
                    if len(found[name]) < 5:
                        found[name].append(f"{int(values[r, t])} at {_at(lay, r)} position {t}")
        return {"source": a.source, "vocab": vocab, "counts": counts, "examples": found,
                "ignored": ignored}

    def conditions(self, th: Any) -> list[Condition]:
        def judge(v):
            c, n = v["counts"], v["counts"]["input_ids"] + v["counts"]["labels"]
            if n:
                parts = [f"{c[k]} {k} ({', '.join(v['examples'][k][:3])}{', ...' if c[k] > 3 else ''})"
                         for k in c if c[k]]
                return Verdict.FAIL, (f"ids outside the vocabulary [0, {v['vocab']}) in "
                                      f"'{v['source']}': {'; '.join(parts)} (labels the objective "
                                      f"ignores, {v['ignored']}, are not counted)"), float(n)
            return Verdict.PASS, (f"every input id and every trained label is in [0, {v['vocab']})"), 0.0

        return [Condition("OBJ015", "ids_inside_vocabulary", judge)]


def _segment_rows(mask: np.ndarray) -> np.ndarray:
    """bool [B]: the row's mask numbers its packed sequences: its nonzero values count 1, 2, ...
    along the row (each the last or one more), some above 1."""
    out = np.zeros(len(mask), bool)
    for r, row in enumerate(mask):
        on = row[row != 0]
        out[r] = (len(on) > 0 and on[0] == 1 and bool((on > 1).any())
                  and bool(np.isin(np.diff(on), (0, 1)).all()))
    return out


class AttentionMask(Check):
    """OBJ016: the attention mask marks exactly the padding."""

    name = "batch-attention-mask"
    stage = "batches"

    def skip_reason(self, ctx: Any) -> str | None:
        if all(b.attention_mask is None for b in real_batches(ctx).batches):
            return "the batches have no attention_mask column: padding is read from the pad run"
        return None

    def measure(self, ctx: Any, th: Any) -> dict[str, Any]:
        a, d = audit(ctx, th), ctx.config.data
        pad = a.pad_id if a.pad_id is not None else d.pad_id
        side = a.side or d.padding_side
        counts = {"not_binary": 0, "ones_on_padding": 0, "zeros_on_tokens": 0}
        where = {k: [] for k in counts}
        for lay in a.layouts:
            ids, mask = lay.batch.input_ids, lay.batch.attention_mask
            if mask is None:
                continue
            runs = edge_runs(ids, pad, side)
            if side == "right":
                # pad == eos: the last EOS of a row is real; with eos_id undeclared, so is a lone
                # pad id ending a row whose mask has no zero (a full-length row ending in EOS)
                real_eos = (runs > 0) if d.eos_id is not None and pad == d.eos_id else \
                    (runs == 1) & (mask != 0).all(axis=1)
                runs = np.where(real_eos, runs - 1, runs)
            segments = _segment_rows(mask)
            bad = {"not_binary": ~np.isin(mask, (0, 1)) & ~segments[:, None],
                   "ones_on_padding": run_mask(ids.shape, runs, side) & (mask != 0),
                   "zeros_on_tokens": (mask == 0) & (ids != pad)}
            for k, hit in bad.items():
                counts[k] += int(hit.sum())
                where[k] += [_at(lay, int(r)) for r in np.nonzero(hit.any(axis=1))[0]]
        return {"source": a.source, "pad_id": int(pad), "side": side, "counts": counts, "rows": where}

    def conditions(self, th: Any) -> list[Condition]:
        words = {"not_binary": "values other than 0 and 1",
                 "ones_on_padding": "1 on padding (the pad run of {pad} on the {side})",
                 "zeros_on_tokens": "0 on real tokens (ids other than {pad})"}

        def judge(v):
            bad = {k: n for k, n in v["counts"].items() if n}
            if bad:
                parts = [f"{words[k].format(pad=v['pad_id'], side=v['side'])}: {n} positions in "
                         f"{few(sorted(set(v['rows'][k])))}" for k, n in bad.items()]
                return Verdict.FAIL, (f"the attention mask of '{v['source']}' disagrees with the "
                                      f"padding: {'; '.join(parts)}"), float(sum(bad.values()))
            return Verdict.PASS, (f"the attention mask is 0 exactly on the padding (pad id "
                                  f"{v['pad_id']}, {v['side']})"), 0.0

        return [Condition("OBJ016", "mask_matches_padding", judge)]
