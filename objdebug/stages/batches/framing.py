"""OBJ020 / OBJ021 / OBJ022: how each real row ends, read against the labels the objective trains.

OBJ020: with `[data] eos_id` set (the data frames rows with EOS), every EOS of a row is predicted by
a trained label (a collator that masks every pad id masks the EOS too when pad == eos: the model
never learns to stop), and a row shorter than the batch holds one. OBJ021: the label paired with
the last real token's logits (pre-shifted: its own label; unshifted: the label after it) does not
train it toward the pad id (a shift that ran into the padding). OBJ022: with a `position_ids`
column, positions reset after an EOS inside a row (documents packed without a boundary attend to
and are positioned after the one before).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.core.findings import Check, Condition, Verdict
from objdebug.stages.batches.words import few
from objdebug.stages.batches.audit import audit, has_labels, no_label_objective, real_batches
from objdebug.stages.batches.chat_checks import eos_judged
from objdebug.pipeline.pipeline_batches import offset_words


def _at(lay, r: int) -> str:
    return f"batch {lay.batch.number} row {r}"


def _label_of(offset: int, j: int) -> int:
    """The position whose label says "predict the input token at j" (labels[t] = input_ids[t + d])."""
    return j - offset


def _layout_skip(ctx: Any, th: Any) -> str | None:
    if no_label_objective(ctx):
        return no_label_objective(ctx)
    if not has_labels(ctx):
        return "the batches have no labels column: nothing trained to read"
    if audit(ctx, th).offset is None:
        return ("the labels follow the inputs at no single offset (OBJ013): which label predicts a "
                "token is unknown")
    return None


class EosTrained(Check):
    """OBJ020: every EOS of a row is a trained target; rows that end before the batch hold one."""

    name = "batch-eos"
    stage = "batches"

    def skip_reason(self, ctx: Any) -> str | None:
        if ctx.config.data.eos_id is None:
            return "data.eos_id is not set: the data does not frame rows with EOS"
        return _layout_skip(ctx, ctx.profile.section("batches"))

    def measure(self, ctx: Any, th: Any) -> dict[str, Any]:
        a, eos = audit(ctx, th), int(ctx.config.data.eos_id)
        ignored = set(a.ignored())
        rows = eos_rows = 0
        untrained, missing = [], []
        for lay in a.layouts:
            ids, labels = lay.batch.input_ids, lay.batch.labels
            for r in range(len(ids)):
                real = np.nonzero(~lay.padding[r])[0]
                if not len(real):
                    continue
                rows += 1
                at = [int(j) for j in real if ids[r, j] == eos and 0 <= j - a.offset < ids.shape[1]
                      and j >= 1]
                if not at:
                    if lay.padding[r].any():  # a full-length row may be cut before its EOS
                        missing.append(_at(lay, r))
                    continue
                eos_rows += 1
                judged = eos_judged(ctx, th, lay, r)  # [chat]: an EOS after a user turn rightly untrained
                at = at if judged is None else [j for j in at if judged[j]]
                if any(labels[r, _label_of(a.offset, j)] != eos
                       or labels[r, _label_of(a.offset, j)] in ignored for j in at):
                    untrained.append(_at(lay, r))
        return {"source": a.source, "eos_id": eos, "rows": rows, "eos_rows": eos_rows,
                "untrained": untrained, "missing": missing, "layout": a.layout}

    def conditions(self, th: Any) -> list[Condition]:
        def judge(v):
            eos, parts = v["eos_id"], []
            if v["untrained"]:
                parts.append(f"the EOS ({eos}) is not a trained label in {len(v['untrained'])} of "
                             f"{v['eos_rows']} rows holding it ({few(v['untrained'], 3)}): the "
                             f"model never learns to stop (a collator that masks the pad id masks "
                             f"the EOS too when pad == eos)")
            if v["missing"]:
                parts.append(f"{len(v['missing'])} rows shorter than their batch hold no EOS "
                             f"({few(v['missing'], 3)})")
            if parts:
                return Verdict.FAIL, (f"{'; '.join(parts)} (data.eos_id = {eos}, in "
                                      f"'{v['source']}')"), float(len(v["untrained"]) + len(v["missing"]))
            return Verdict.PASS, (f"every EOS ({eos}) in {v['eos_rows']} of {v['rows']} rows is a "
                                  f"trained label (the others fill their batch)"), 0.0

        return [Condition("OBJ020", "eos_trained", judge)]


class LastToken(Check):
    """OBJ021: the last real token's logits are not trained toward the pad id."""

    name = "batch-last-token"
    stage = "batches"

    def skip_reason(self, ctx: Any) -> str | None:
        th = ctx.profile.section("batches")
        why = _layout_skip(ctx, th)
        if why is None and audit(ctx, th).offset not in (0, 1):
            why = (f"{offset_words(audit(ctx, th).offset)}: no objective pairs the last token's "
                   f"logits with one label of such rows (OBJ019 counts the shifts)")
        return why

    def measure(self, ctx: Any, th: Any) -> dict[str, Any]:
        a, d = audit(ctx, th), ctx.config.data
        pad = a.pad_id if a.pad_id is not None else d.pad_id
        ignored = set(a.ignored())
        rows, trained, to_pad = 0, 0, []
        for lay in a.layouts:
            labels, length = lay.batch.labels, lay.padding.shape[1]
            for r in range(len(labels)):
                real = np.nonzero(~lay.padding[r])[0]
                if not len(real):
                    continue
                q = int(real[-1]) + 1 - a.offset  # the label its logits meet (one shift in all)
                if q >= length:
                    continue  # unshifted and full: nothing after the row is scored
                rows += 1
                label = int(labels[r, q])
                if label in ignored:
                    continue
                trained += 1
                if label == pad and pad != d.eos_id:
                    to_pad.append(_at(lay, r))
        return {"source": a.source, "pad_id": int(pad), "rows": rows, "trained": trained,
                "to_pad": to_pad, "layout": a.layout}

    def conditions(self, th: Any) -> list[Condition]:
        def judge(v):
            where = ("its own label (pre-shifted)" if v["layout"] == "pre-shifted"
                     else "the label after it (unshifted)")
            if v["to_pad"]:
                return Verdict.FAIL, (f"the last real token is trained toward the pad id "
                                      f"{v['pad_id']} in {len(v['to_pad'])} of {v['rows']} rows "
                                      f"({few(v['to_pad'], 3)}; {where}): every row learns to "
                                      f"emit padding after its end; mask that label (or make it "
                                      f"the EOS) in '{v['source']}'"), float(len(v["to_pad"]))
            return Verdict.PASS, (f"no row's last real token is trained toward the pad id "
                                  f"{v['pad_id']} ({where}; {v['trained']} of {v['rows']} rows "
                                  f"train it toward another label)"), 0.0

        return [Condition("OBJ021", "last_token_not_trained_to_padding", judge)]


class PositionsAcrossEos(Check):
    """OBJ022: position_ids reset after an EOS inside a row (a packed row's documents separate)."""

    name = "batch-positions-across-eos"
    stage = "batches"

    def skip_reason(self, ctx: Any) -> str | None:
        if ctx.config.data.eos_id is None:
            return "data.eos_id is not set: no document end to read inside a row"
        if all("position_ids" not in b.columns for b in real_batches(ctx).batches):
            return "the batches have no position_ids column: no positions to read"
        if getattr(ctx.config, "chat", None) is not None:
            return "[chat]: an EOS inside a row closes a turn of one conversation, not a packed document"
        return None

    def measure(self, ctx: Any, th: Any) -> dict[str, Any]:
        a, eos = audit(ctx, th), int(ctx.config.data.eos_id)
        inside = resets = 0
        run_on: list[str] = []
        for lay in a.layouts:
            pos = lay.batch.columns.get("position_ids")
            if pos is None:
                continue
            ids = lay.batch.input_ids
            for r in range(len(ids)):
                real = np.nonzero(~lay.padding[r])[0]
                ends = [int(j) for j in real[:-1] if ids[r, j] == eos and not lay.padding[r, j + 1]]
                inside += len(ends)
                on = [j for j in ends if pos[r, j + 1] == pos[r, j] + 1]
                resets += len(ends) - len(on)
                if on:
                    run_on.append(f"{_at(lay, r)} after position {on[0]}")
        return {"source": a.source, "eos_id": eos, "inside": inside, "resets": resets,
                "run_on": run_on}

    def conditions(self, th: Any) -> list[Condition]:
        def judge(v):
            if not v["inside"]:
                return Verdict.SKIP, (f"no row holds an EOS ({v['eos_id']}) before its last real "
                                      f"token: no packed documents to separate"), None
            if v["run_on"]:
                return Verdict.FAIL, (f"position_ids run on across an EOS ({v['eos_id']}) inside "
                                      f"the row in {len(v['run_on'])} rows ({few(v['run_on'], 3)});"
                                      f" {v['resets']} of {v['inside']} EOS inside rows reset them: "
                                      f"documents are packed without a boundary, each one "
                                      f"positioned after the one before"), float(len(v["run_on"]))
            return Verdict.PASS, (f"position_ids reset after every EOS inside a row ({v['inside']} "
                                  f"in '{v['source']}')"), 0.0

        return [Condition("OBJ022", "positions_reset_after_eos", judge)]
