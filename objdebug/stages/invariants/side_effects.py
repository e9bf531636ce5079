"""OBJ707 inputs unchanged, OBJ708 same result in training and evaluation mode.

OBJ707: the labels and logits Tensors handed to the objective are compared (SHA-1 of their bytes)
before and after a forward call of the configured objective (as an evaluation step calls it; inside
`value_and_grad` MindSpore 2.10 passes the objective copies, and that call is checked too); an
objective that writes into them (for example `ops.assign(labels, where(labels == -100, 0, labels))`
to make a gather safe) corrupts whatever reads the batch afterwards: metrics, the next micro-step,
a second loss (hyper-parallel PR 140).

OBJ708: the configured objective in training mode (`set_train(True)`) on the same logits and labels
must give the same outputs as in evaluation mode. A difference from dropout is by design
(trl 2042: the training loss of a model with dropout is not its evaluation loss) and is reported
as the profile's `dropout` verdict (default "info"), naming the dropout Cells of the model and
the objective; any other difference takes `train_eval` (default "warn").

Graphs: `invariants.forward` (forward only, evaluation mode) for OBJ707 and OBJ708,
`invariants.train_mode` (the same in training mode) for OBJ708, `invariants.model_train` (the model
in training mode; only when it has a dropout Cell), `objective.logit_grad`
(shared) for the autodiff call.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from objdebug.pipeline.context import Context
from objdebug.core.findings import Check, Condition, Verdict, listing
from objdebug.core.settings import Settings
from objdebug.stages.invariants.probe import dropout_cells, model_logits_in_train_mode
from objdebug.stages.invariants._common import base, batch, logits, probe, skip_end_to_end


def digest(a: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(a).tobytes()).hexdigest()[:12]


class SideEffects(Check):
    """Inputs hashed before/after the objective; training vs evaluation mode."""

    name = "side-effects"
    stage = "invariants"

    def skip_reason(self, ctx: Context) -> str | None:
        return skip_end_to_end(ctx, (
            "the objective called on logits Tensors it could write into, in both training and"
            " evaluation mode (the library model holds the mode its loss needs)"))

    def measure(self, ctx: Context, th: Settings) -> dict[str, Any]:
        b, x = batch(ctx), logits(ctx)
        ev = probe(ctx).forward(x, b.labels)
        tr = probe(ctx).forward(x, b.labels, train=True)
        grads = base(ctx)  # the autodiff call: checked too (MindSpore passes it copies)
        y, ly, x0, lx = ev.labels_in, ev.labels_out, ev.logits_in, ev.logits_out
        changed = ly != y
        both = np.concatenate([tr.outputs, ev.outputs])
        diff = float(np.max(np.abs(tr.outputs - ev.outputs))) if np.isfinite(both).all() else \
            (0.0 if np.array_equal(tr.outputs, ev.outputs, equal_nan=True) else float("nan"))
        return {"before": {"labels": digest(y), "logits": digest(ev.logits_in)},
                "after": {"labels": digest(ly), "logits": digest(lx)},
                "labels_changed": int(changed.sum()),
                "logits_changed": int((~((lx == x0) | (np.isnan(lx) & np.isnan(x0)))).sum()),
                "changed_in_autodiff": bool(grads.labels_changed or grads.logits_changed),
                "labels_size": int(y.size), "logits_size": int(x.size),
                "changed_values": sorted({int(v) for v in ly[changed]})[:8],
                "loss_eval": ev.loss, "loss_train": tr.loss, "train_eval_diff": diff,
                "dropout": dropout_cells(ctx.target.objective, ctx.target.model),
                **self._model_in_train_mode(ctx, ev.loss)}

    @staticmethod
    def _model_in_train_mode(ctx: Context, loss_eval: float) -> dict[str, Any]:
        """With dropout in the model: the same objective (evaluation mode) on the logits of the
        model in training mode, the loss a training step reports (graph `invariants.model_train`,
        only compiled when the model has a dropout Cell)."""
        if not dropout_cells(ctx.target.model):
            return {}
        b = batch(ctx)
        try:
            x = model_logits_in_train_mode(ctx.engine, b.input_ids)
        except (TypeError, ValueError, IndexError) as exc:
            # a library model whose training mode returns its own loss, not logits (MindFormers'
            # LlamaForCausalLM): no logits to score; a compile error, so no graph is poisoned
            from objdebug.core.crash import first_line

            return {"model_train_skipped": f"the model in training mode gives no logits "
                                           f"({type(exc).__name__}: {first_line(exc)})"}
        loss = probe(ctx).forward(x, b.labels).loss
        return {"loss_model_train": loss, "model_train_diff": abs(loss - loss_eval)}

    def conditions(self, th: dict[str, Any]) -> list[Condition]:
        mode_verdict = Verdict.from_setting(th["train_eval"], "[invariants] train_eval")
        drop_verdict = Verdict.from_setting(th["dropout"], "[invariants] dropout")

        def inputs(v):
            what = (f"labels sha1 {v['before']['labels']} -> {v['after']['labels']}, logits sha1 "
                    f"{v['before']['logits']} -> {v['after']['logits']}")
            n = v["labels_changed"] + v["logits_changed"] + int(v["changed_in_autodiff"])
            if n:
                return Verdict.FAIL, (f"the objective writes into its inputs: {v['labels_changed']} of "
                                      f"{v['labels_size']} labels (now {v['changed_values']}) and "
                                      f"{v['logits_changed']} of {v['logits_size']} logits changed "
                                      f"({what})"), float(n)
            return Verdict.PASS, f"labels and logits unchanged by the objective ({what})", 0.0

        def mode(v):
            drops = v["dropout"]
            what = (f"objective in training mode {v['loss_train']:.6g} vs evaluation mode "
                    f"{v['loss_eval']:.6g} on the same logits (max |Δ| {v['train_eval_diff']:.3g})")
            if "loss_model_train" in v:
                what += (f"; with the model in training mode the loss is {v['loss_model_train']:.6g} "
                         f"(|Δ| {v['model_train_diff']:.3g})")
            if "model_train_skipped" in v:
                what += f"; {v['model_train_skipped']}"
            note = f"; dropout Cells: {listing(drops, 6)}" if drops else ""
            if v["train_eval_diff"] == 0.0:
                if drops:  # the model's dropout changes the logits, not the objective on fixed logits
                    return drop_verdict, (what + note + ": the training loss depends on dropout and "
                                          "is not comparable with an evaluation loss"), \
                        v.get("model_train_diff", 0.0)
                return Verdict.PASS, what + ": the same; no dropout Cells", 0.0
            if drops:
                return drop_verdict, what + note + ": the difference comes with dropout", \
                    v["train_eval_diff"]
            return mode_verdict, (what + ": the objective computes something else in training mode "
                                  "(no dropout Cell found)"), v["train_eval_diff"]

        return [Condition("OBJ707", "inputs_unchanged", inputs),
                Condition("OBJ708", "same_result_in_train_and_eval_mode", mode)]
