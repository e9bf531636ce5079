"""OBJ106, synthesized sanity: clean text against the same text shuffled and against uniformly
random tokens, on a model that has trained (a note at step 0)."""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.core.findings import Check, Condition, Verdict, band, listing
from objdebug.core.settings import Settings
from objdebug.pipeline.context import Context
from objdebug.pipeline.datasets import _synthesize, encoder, text_samples


class SynthesizedSanity(Check):
    """Clean text vs the same text shuffled and vs uniformly random tokens (OBJ106).

    Needs no labelled answers: any text of the target (a plain corpus is enough). Once a model has
    seen a few hundred steps, the objective must already give clean text a lower loss than its
    shuffled and random counterparts. At step 0 nothing can tell them apart, so on a model measured
    untrained the check is a note and is not evaluated at all.
    """

    name = "synthesized-sanity"
    stage = "align"
    needs_trained = ("OBJ106",)

    def enabled(self, th: dict[str, Any]) -> bool:
        return bool(th["sanity"])

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        from objdebug.pipeline import model_state
        from objdebug.engine.data import Sample

        reason = model_state.untrained_reason(ctx)
        if reason:  # step 0: skip the evaluation, say why
            return {"untrained": reason}
        samples = text_samples(ctx, int(th["sanity_samples"]))
        rng = np.random.default_rng(int(th["seed"]))
        vocab, pad = encoder(ctx).id_range, ctx.config.data.pad_id
        kinds = {"clean": None, "shuffled": "shuffled", "random": "random"}
        flat = []
        for s in samples:
            for kind, how in kinds.items():
                resp = s.response if how is None else _synthesize(s.response, how, rng, vocab, pad)
                flat.append(Sample(id=s.id, prompt=s.prompt, response=resp, kind=kind))
        values = ctx.engine.evaluate(flat, label="align: clean vs synthesized text")[:, 0]
        loss = {k: values[i::len(kinds)].astype(np.float64) for i, k in enumerate(kinds)}
        ok = (loss["clean"] < loss["shuffled"]) & (loss["clean"] < loss["random"])
        with np.errstate(invalid="ignore"):
            return {"n": len(samples), "mean_loss": {k: float(np.mean(v)) for k, v in loss.items()},
                    "gap_random": float(np.mean(loss["random"] - loss["clean"])),
                    "gap_shuffled": float(np.mean(loss["shuffled"] - loss["clean"])),
                    "order_accuracy": float(ok.mean()),
                    "out_of_order": [s.id for s, good in zip(samples, ok) if not good]}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        gap_pass, gap_fail = th["sanity_gap_pass"], th["sanity_gap_fail"]
        ord_pass, ord_fail = th["sanity_order_pass"], th["sanity_order_fail"]

        def judge(v):
            if "untrained" in v:
                return Verdict.INFO, (f"{v['untrained']}: not evaluated — at step 0 no model tells "
                                      f"clean text from shuffled or random tokens; rerun after a few "
                                      f"hundred steps"), None
            g, acc = v["gap_random"], v["order_accuracy"]
            gap_v = band(g, pass_if=lambda a: a >= gap_pass, fail_if=lambda a: a < gap_fail)
            ord_v = band(acc, pass_if=lambda a: a >= ord_pass, fail_if=lambda a: a < ord_fail)
            verdict = max(gap_v, ord_v, key=lambda x: x.rank)
            ml = v["mean_loss"]
            return verdict, (
                f"loss clean {ml['clean']:.3f} < shuffled {ml['shuffled']:.3f} and < random "
                f"{ml['random']:.3f} in {acc:.0%} of {v['n']} texts (gap random-clean {g:.3f}, "
                f"shuffled-clean {v['gap_shuffled']:.3f} nats)"
                + (f"; out of order: {listing(v['out_of_order'])}" if v["out_of_order"] else "")
                + f"; pass: gap >= {gap_pass} and >= {ord_pass:.0%} ordered, fail: gap < {gap_fail} "
                  f"or < {ord_fail:.0%}"), g

        return [Condition("OBJ106", f"clean_text_beats_synthesized_{gap_pass}", judge)]
