"""OBJ010 / OBJ011: the label values the pipeline writes where nothing should be learned — on
padding, and on real tokens whose label is not the paired input token (the prompt) — each
probed on the real objective (`audit.probe`): does it ignore that value?"""

from __future__ import annotations

from collections import Counter
from typing import Any

from objdebug.core.findings import Check, Condition, Verdict
from objdebug.stages.batches.audit import Audit, audit, has_labels, no_label_objective
from objdebug.stages.batches.words import few


def _values(counts: Counter) -> str:
    """The values, most frequent first: '0 and -100', '5, 7, 9 and 130 more'."""
    return few([v for v, _ in counts.most_common()])


def _how(scored: Counter, probes: dict) -> str:
    """What the probes saw on the values trained, said once per kind: the first probed values'
    losses or rejections, then '35 rarer values not probed'."""
    said, rare = [], 0
    for value, _ in scored.most_common():
        p = probes.get(value)
        if p is None:
            rare += 1
        elif len(said) < 2:
            said.append(f"it rejects {value} ({p['rejected'][:80]})" if p["rejected"] else
                        f"a row labelled only {value} gives loss {p['loss']:.4g} instead of 0")
    probed = sum(1 for v in scored if v in probes)
    if probed > len(said):
        said.append(f"{probed - len(said)} more probed values trained")
    if rare:
        said.append(f"{rare} rarer value{'s' if rare > 1 else ''} not probed")
    return "; ".join(said)


class _MaskedLabels(Check):
    stage = "batches"
    where = ""      # "padding" / "prompt"
    code = ""

    def skip_reason(self, ctx: Any) -> str | None:
        if no_label_objective(ctx):
            return no_label_objective(ctx)
        if not has_labels(ctx):
            return ("the batches have no labels column (the model or the objective derives them): "
                    "no label value to check")
        return None

    def counts(self, a: Audit) -> Counter:
        raise NotImplementedError

    def rows(self, a: Audit) -> tuple[int, int]:
        raise NotImplementedError

    def measure(self, ctx: Any, th: Any) -> dict[str, Any]:
        a = audit(ctx, th)
        counts = self.counts(a)
        scored = {v: n for v, n in counts.items() if not (v in a.probes and a.probes[v].ignored)}
        rows_with, rows = self.rows(a)
        return {"source": a.source, "values": dict(counts), "scored": scored,
                "ignores": a.ignored(), "rows_with": rows_with, "rows": rows,
                "probes": {v: {"loss": p.loss, "ignored": p.ignored, "rejected": p.rejected}
                           for v, p in a.probes.items()},
                "label_pad_id": ctx.config.data.label_pad_id}

    def conditions(self, th: Any) -> list[Condition]:
        where = self.where

        def judge(v):
            values = Counter(v["values"])
            if not values:
                return Verdict.SKIP, (f"no {where} position in the {v['rows']} rows read from "
                                      f"'{v['source']}': nothing to check"), None
            n = sum(values.values())
            if not v["scored"]:
                return Verdict.PASS, (f"labels on {where} are {_values(values)} ({n} positions in "
                                      f"{v['rows_with']} of {v['rows']} rows); the objective "
                                      f"ignores {_values(values)}"), 0.0
            scored = Counter(v["scored"])
            probes = {int(x): p for x, p in v["probes"].items()}
            ignores = (few(v["ignores"]) if v["ignores"] else f"none of {few(sorted(probes))}")
            k = sum(scored.values())
            return Verdict.FAIL, (
                f"labels on {where} are {_values(values)}; the objective ignores {ignores}: "
                f"{k} {where} positions in '{v['source']}' are trained toward {_values(scored)} "
                f"({_how(scored, probes)})"), float(k)

        return [Condition(self.code, f"{where}_labels_ignored", judge)]


class PaddingLabels(_MaskedLabels):
    """OBJ010: labels on padding (attention mask 0, or the pad run) must be ignored."""

    name = "batch-padding-labels"
    where, code = "padding", "OBJ010"

    def counts(self, a: Audit) -> Counter:
        return a.on_pad

    def rows(self, a: Audit) -> tuple[int, int]:
        return (sum(int(lay.padding.any(axis=1).sum()) for lay in a.layouts),
                sum(len(lay.padding) for lay in a.layouts))


class PromptLabels(_MaskedLabels):
    """OBJ011: labels on real tokens that do not follow the inputs (the prompt, a masked EOS)
    must be ignored."""

    name = "batch-prompt-labels"
    where, code = "prompt", "OBJ011"

    def counts(self, a: Audit) -> Counter:
        return a.on_real

    def rows(self, a: Audit) -> tuple[int, int]:
        from objdebug.stages.batches.layout import follows

        with_prompt = sum(int((~lay.padding & ~follows(lay, a.offset)).any(axis=1).sum())
                          for lay in a.layouts if lay.batch.labels is not None)
        return with_prompt, sum(len(lay.padding) for lay in a.layouts)
