"""Supervision coverage (grad stage, OBJ209/OBJ210): every position objdebug labels trains, and the
label contract of one real row at a glance.

OBJ205 checks that masked positions get no gradient; this is the mirror. On the grad stage's batch
and the objective's logit gradient there (`grad.logit_gradients`, no new graph), a supervised
position (label != label_pad_id: a response token, the EOS [data] eos_id appended) is *dropped*
when the objective gives it no gradient although a mean cross-entropy (numpy float64 reference)
would:

- exactly zero where the reference's ||softmax - onehot|| >= `coverage_zero_floor` (a healthy
  objective is exactly 0 only where the softmax saturated in float32, ~1e-7), or
- `coverage_drop_ratio` x the median below the reference, per position, where the reference is
  resolvable (>= `coverage_resolve_floor`): "orders of magnitude below the others". Positions the
  model already predicts with near certainty are left out of this second test on purpose: a
  focal-style objective down-weights them by design (OBJ208 judges that shape).

The dropped positions are then described by pattern: by place in the row (first / last supervised
token, every k-th), by label id (every label equal to X; X named, and whether it is the pad or EOS
id) and by row (rows with no trained token). OBJ210 is the data side: each row's share of tokens
that train, rows with no supervised token, rows whose scored text lacks EOS when eos_id is set;
its measurement carries the contract table of one real row (objdebug/report/contract_table.py).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.pipeline.context import Context
from objdebug.pipeline.datasets import encoder
from objdebug.core.findings import Check, Condition, Verdict, listing
from objdebug.core.settings import Settings
from objdebug.pipeline.run_data import grad_batch, logit_gradients, pairing_skip

_LISTED = 8


def _token(ctx: Context, token: int) -> str:
    """A token id as the reader knows it: 'id (text)', and 'pad' / 'EOS' / 'BOS' named."""
    d = ctx.config.data
    names = [n for n, i in (("pad", d.pad_id), ("EOS", d.eos_id), ("BOS", d.bos_id)) if i == token]
    try:
        text = encoder(ctx).tokenizer.decode([int(token)])
    except Exception:  # a tokenizer that cannot decode one id: the id is enough
        text = ""
    shown = repr(text) if text and "\ufffd" not in text else ""
    return f"{token}" + (f" {shown}" if shown else "") + (f" [{'/'.join(names)}]" if names else "")


def _periodic(dropped_idx: list[np.ndarray], supervised: list[int], max_period: int) -> tuple[int, int] | None:
    """(k, r) when the dropped positions are exactly every k-th supervised token (index % k == r)
    in every row, else None. Row index lists are positions in the row's supervised order."""
    for k in range(2, max_period + 1):
        for r in range(k):
            want = [np.arange(r, n, k) for n in supervised]
            if sum(w.size for w in want) >= 2 and all(np.array_equal(d, w) for d, w in zip(dropped_idx, want)):
                return k, r
    return None


class SupervisionCoverage(Check):
    """Every supervised position gets gradient (OBJ209); the data's label contract (OBJ210)."""

    name = "supervision-coverage"
    stage = "grad"

    def skip_reason(self, ctx: Context) -> str | None:
        return pairing_skip(ctx)

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        batch, lg = grad_batch(ctx), logit_gradients(ctx)
        # the labels each logit position is scored against (a library model that shifts its
        # labels itself: the next position's), the input at that position beside it
        labels = lg["labels"]
        ids = batch.input_ids[:, :labels.shape[1]]
        pid, eos = ctx.engine.padding.label_pad_id, ctx.config.data.eos_id
        sup = labels != pid
        n = int(sup.sum())
        sq = np.asarray(lg["sq"], np.float64)
        ref = np.sqrt(np.asarray(lg["reference_sq"], np.float64)) * max(n, 1)  # ||softmax - onehot||
        user = np.sqrt(sq)
        finite = bool(np.isfinite(sq[sup]).all())
        rows_real = len(batch.samples)  # the rest are copies filling the batch
        lengths = [s.length for s in batch.samples]
        out: dict[str, Any] = {
            "label_pad_id": pid, "eos_id": eos, "pad_id": ctx.config.data.pad_id,
            "rows": int(labels.shape[0]), "data_rows": rows_real, "supervised": n,
            "finite": finite}
        # ---- data side (OBJ210)
        per_row = [int(sup[b].sum()) for b in range(rows_real)]
        out["train_share"] = [c / max(L, 1) for c, L in zip(per_row, lengths)]
        out["empty_rows"] = [b for b in range(rows_real) if per_row[b] == 0]
        out["empty_ids"] = [batch.samples[b].id for b in out["empty_rows"]]
        # EOS is expected in a framed prompt + response, and in the corpus piece that ends a
        # document (data.text cuts long documents into consecutive pieces: the others have none)
        expects = [s.kind != "text" or s.response[-1:] == [eos] for s in batch.samples]
        out["eos_missing_rows"] = ([b for b in range(rows_real)
                                    if expects[b] and per_row[b] and not (labels[b][sup[b]] == eos).any()]
                                   if eos is not None else [])
        # ---- objective side (OBJ209)
        zero_floor, resolve_floor = float(th["coverage_zero_floor"]), float(th["coverage_resolve_floor"])
        drop_ratio = float(th["coverage_drop_ratio"])
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(ref > 0, user * max(n, 1) / ref, np.nan)  # 1 for a mean CE
        resolvable = sup & (ref >= resolve_floor) & np.isfinite(ratio)
        # the median of the positions that do train: "the others" a dropped one is compared with
        others = resolvable & (sq > 0)
        median = float(np.median(ratio[others])) if others.any() else float("nan")
        zero = sup & (sq == 0) & (ref >= zero_floor)
        far = resolvable & (ratio < drop_ratio * median) if median > 0 else np.zeros_like(sup)
        dropped = (zero | far) if finite else np.zeros_like(sup)
        out.update({"median_ratio": median, "resolvable": int(resolvable.sum()),
                    "saturated": int((sup & (ref < zero_floor)).sum()),
                    "dropped": int(dropped.sum()), "dropped_zero": int((dropped & zero).sum()),
                    "dropped_rows": sorted({int(b) for b in np.nonzero(dropped)[0]})})
        out["patterns"] = self._patterns(ctx, labels, sup, dropped, th)
        out["contract"] = self._contract(ctx, ids, labels, sup, dropped, sq, lengths, th)
        if out["contract"]["row"] is not None:
            out["contract"]["id"] = batch.samples[out["contract"]["row"]].id
        return out

    def _patterns(self, ctx: Context, labels, sup, dropped, th: Settings) -> dict[str, Any]:
        """Which positions are dropped, as a person would say it."""
        rows = [b for b in range(labels.shape[0]) if sup[b].any()]
        pos = {b: np.nonzero(sup[b])[0] for b in rows}
        d_idx = {b: np.nonzero(dropped[b][pos[b]])[0] for b in rows}  # indices in supervised order
        last = [b for b in rows if dropped[b][pos[b][-1]]]
        first = [b for b in rows if dropped[b][pos[b][0]]]
        only_last = all(np.array_equal(d_idx[b], [pos[b].size - 1]) for b in rows) and bool(rows)
        only_first = all(np.array_equal(d_idx[b], [0]) for b in rows) and bool(rows)
        period = _periodic([d_idx[b] for b in rows], [pos[b].size for b in rows],
                           int(th["coverage_max_period"])) if rows and dropped.any() else None
        by_label = []
        for x in sorted({int(v) for v in labels[dropped]}):
            total, hit = int((sup & (labels == x)).sum()), int((dropped & (labels == x)).sum())
            if hit == total:
                d = ctx.config.data
                by_label.append({"label": x, "count": total, "token": _token(ctx, x),
                                 "is_pad": x == d.pad_id, "is_eos": x == d.eos_id})
        explained = dropped.copy()
        for e in by_label:
            explained &= labels != e["label"]
        no_trained = [b for b in rows if d_idx[b].size == pos[b].size]
        return {"rows": len(rows), "last": last, "first": first, "only_last": only_last,
                "only_first": only_first, "period": list(period) if period else None,
                "labels": by_label, "labels_explain_all": bool(by_label) and not explained.any(),
                "no_trained_rows": no_trained}

    def _contract(self, ctx: Context, ids, labels, sup, dropped, sq, lengths, th: Settings) -> dict[str, Any]:
        """One real row, position by position: input, label, trains?, share of the row's gradient.
        The row shown is the first with a dropped position (else the first row); a long row keeps
        its first and last positions around the supervised span (`contract_rows` lines at most)."""
        if not lengths:
            return {"row": None, "positions": []}
        rows = [b for b in range(len(lengths)) if dropped[b].any()] or [0]
        b = rows[0]
        length = int(lengths[b])
        keep = int(th["contract_rows"])
        span = np.nonzero(sup[b][:length])[0]
        start = max(int(span[0]) - 2, 0) if span.size else 0
        idx = list(range(start, length))
        if len(idx) > keep:  # head and tail of the span: the boundaries are where masks go wrong
            head = keep // 2
            idx = idx[:head] + [-1] + idx[-(keep - head - 1):]
        row_sq = float(np.nansum(sq[b]))
        lines = []
        for t in idx:
            if t < 0:
                lines.append(None)
                continue
            lab = int(labels[b, t])
            s = bool(sup[b, t])
            trains = "dropped" if dropped[b, t] else ("yes" if s and sq[b, t] > 0 else
                                                     ("no (gradient 0)" if s else "no"))
            share = float(sq[b, t] / row_sq) if row_sq > 0 and math.isfinite(row_sq) else 0.0
            lines.append({"position": t, "input": _token(ctx, int(ids[b, t])),
                          "label": _token(ctx, lab) if s else f"{lab} (ignored)",
                          "trains": trains, "share": share})
        return {"row": b, "length": length, "positions": lines}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        empty_v = Verdict.from_setting(th["coverage_empty_rows"], "[grad] coverage_empty_rows")
        eos_v = Verdict.from_setting(th["coverage_eos_missing"], "[grad] coverage_eos_missing")

        def coverage(v):
            n, d = v["supervised"], v["dropped"]
            if not v["finite"]:
                return Verdict.SKIP, "not judged: the logit gradient is not finite, see OBJ203", None
            if n == 0:
                return Verdict.SKIP, "not judged: the gradient batch has no supervised position", None
            basis = (f"{n} supervised positions in {v['rows']} rows (label != {v['label_pad_id']}); "
                     f"dropped = exactly 0 where a mean CE's ||softmax - onehot|| >= "
                     f"{th['coverage_zero_floor']:g}, or below {th['coverage_drop_ratio']:g} x the median "
                     f"gradient ratio to a mean CE ({v['median_ratio']:.3g}) at the {v['resolvable']} "
                     f"resolvable positions")
            if not d:
                return Verdict.PASS, (f"every supervised position trains: {basis}"
                                      + (f"; {v['saturated']} saturated (not judged)" if v["saturated"] else "")), 0.0
            return Verdict.FAIL, (f"{d} of {n} supervised positions get no gradient ({v['dropped_zero']} "
                                  f"exactly 0) in rows {listing(v['dropped_rows'], _LISTED)}: "
                                  f"{describe(v)}; {basis}"), float(d)

        def contract(v):
            share = v["train_share"]
            what = (f"{v['data_rows']} data rows: {min(share):.0%} .. {max(share):.0%} of each row's "
                    f"tokens are supervised (median {float(np.median(share)):.0%})" if share else
                    "no data rows")
            if v["eos_id"] is not None:
                what += f"; eos_id {v['eos_id']} " + ("is the pad id too" if v["eos_id"] == v["pad_id"] else "set")
            bad, msgs = Verdict.PASS, []
            if v["empty_rows"]:
                bad = max(bad, empty_v, key=lambda x: x.rank)
                msgs.append(f"{len(v['empty_rows'])} rows have no supervised token: "
                            f"{listing(v['empty_ids'], _LISTED)}")
            if v["eos_missing_rows"]:
                bad = max(bad, eos_v, key=lambda x: x.rank)
                msgs.append(f"{len(v['eos_missing_rows'])} rows do not score EOS ({v['eos_id']}) although "
                            f"data.eos_id is set: rows {listing(v['eos_missing_rows'], _LISTED)}")
            return bad, "; ".join([what] + msgs), float(len(v["empty_rows"]) + len(v["eos_missing_rows"]))

        return [Condition("OBJ209", "every_supervised_position_trains", coverage),
                Condition("OBJ210", "label_contract", contract)]


def describe(v: dict[str, Any]) -> str:
    """The dropped positions' pattern in words: by label id, by place in the row, by row.

    The two can coincide (EOS is the last supervised token of a row): a single pad / EOS label
    that explains every dropped position is named first (the pad-id mask); otherwise the place
    (an off-by-one mask drops the last token whatever it is, so several labels)."""
    p, bits = v["patterns"], []
    special = p["labels_explain_all"] and any(e["is_pad"] or e["is_eos"] for e in p["labels"])
    place = None
    if p["only_last"]:
        place = (f"the last supervised token of every row ({len(p['last'])} of {p['rows']} rows"
                 + ("" if special else "; an off-by-one in the mask") + ")")
    elif p["only_first"]:
        place = f"the first supervised token of every row ({len(p['first'])} of {p['rows']} rows)"
    elif p["period"]:
        k, r = p["period"]
        place = f"every {k}-th supervised token (index {r} mod {k}) in every row"
    if special or (p["labels_explain_all"] and not place):
        for e in p["labels"]:
            role = (" — the EOS id, which is also the pad id: the loss masks the pad id"
                    if e["is_eos"] and e["is_pad"] else " — the EOS id: the model never learns to stop"
                    if e["is_eos"] else " — the pad id: the loss masks the pad id as well as the ignore index"
                    if e["is_pad"] else "")
            bits.append(f"every label equal to {e['token']} ({e['count']} positions){role}")
    if place:
        bits.append(place)
    elif not bits:
        if p["last"]:
            bits.append(f"the last supervised token in {len(p['last'])} of {p['rows']} rows")
        if p["first"]:
            bits.append(f"the first in {len(p['first'])} of {p['rows']} rows")
        if not (p["last"] or p["first"]):
            bits.append("scattered positions (no place or label pattern)")
    if p["no_trained_rows"]:
        bits.append(f"{len(p['no_trained_rows'])} rows with no trained token at all: rows "
                    f"{listing(p['no_trained_rows'], _LISTED)}")
    return "; ".join(bits)


def checks() -> list[Check]:
    return [SupervisionCoverage()]
