"""Grad for `[task] kind = "tagging"` with a CRF objective (issue 47): an objective with
trainable parameters of its own (transitions) on emissions [B, T, K] and tags [B, T].

- OBJ222 every parameter of the objective (transitions, start / end transitions) receives gradient
  on the gradient batch (the model's emissions of real rows): `task.objective.param_grad`.
- OBJ223 the loss is a normalised negative log-likelihood: on sequences short enough to enumerate
  (T <= `[grad] crf_enum_length`, at most `crf_enum_paths` tag paths), seeded random emissions,
  the user's objective on every tag path y (a batch of one) gives L(y), and a true NLL has
  sum_y exp(-L(y)) = 1, i.e. L(y) equals the brute-force NLL L(y) + log sum_y' exp(-L(y')) to
  `crf_nll_tolerance` (a loss per scored position, pytorch-crf's token_mean, is T L(y): the
  closer of the two normalisations is judged). A partition function that misses the start / end transitions (or a
  transition) the path score has breaks it. Measured on the user's Cell alone: no re-implementation.
- OBJ224 the loss is never negative (over the enumeration and the real rows).
- OBJ225 a Cell with `decode(emissions)` (Viterbi) returns the path of least loss among all paths.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from objdebug.core.findings import Check, Condition, Verdict, listing
from objdebug.core.settings import Settings
from objdebug.pipeline import task_kind
from objdebug.engine import kinds as task_kinds


def _param_grad_cell(objective):
    import mindspore as ms
    from mindspore import nn, ops

    from objdebug.engine.cells import as_outputs

    params = ms.ParameterTuple(objective.trainable_params())

    class ObjectiveParamGrad(nn.Cell):
        """(emissions, tags) -> (total, d total / d the objective's own parameters)."""

        def __init__(self):
            super().__init__(auto_prefix=False)
            self.objective = objective
            self.grad = ops.GradOperation(get_by_list=True)

        def _total(self, e, y):
            return as_outputs(self.objective(e, y))[0]

        def construct(self, e, y):
            return self._total(e, y), self.grad(self._total, params)(e, y)

    return ObjectiveParamGrad()


class CRFChecks(Check):
    """Transitions trained, loss = brute-force NLL, never negative, Viterbi = argmax path."""

    name = "crf"
    stage = "grad"
    kinds = task_kinds.per_token()

    def skip_reason(self, ctx) -> str | None:
        if not list(ctx.target.objective.trainable_params()):
            return ("the objective has no parameters of its own (no CRF transitions): a token "
                    "cross-entropy, checked by OBJ220 / OBJ221")
        return None

    def measure(self, ctx, th: Settings) -> dict[str, Any]:
        import mindspore as ms

        from objdebug.engine import dynamic_graph, tasks

        engine, objective = ctx.engine, ctx.target.objective
        k = task_kind.classes(ctx)
        # OBJ222: the objective's own parameters' gradient on the model's emissions of real rows
        rows = task_kind.grad_rows(ctx)
        pid = engine.padding.label_pad_id
        length = tasks.bucket(max(len(r.ids) for r in rows))
        ids = tasks.pad([r.ids for r in rows], engine.padding.pad_id, length)
        emissions = tasks.forward(engine, ids)
        tags = ms.Tensor(tasks.pad([r.target for r in rows], pid, length, fill=pid))
        spec = (ms.Tensor(shape=[None, None, k], dtype=emissions.dtype),
                ms.Tensor(shape=[None, None], dtype=ms.int32))
        total, grads = dynamic_graph.call(engine, "task.objective.param_grad",
                                          lambda: _param_grad_cell(objective), spec, emissions, tags)
        names = [p.name for p in objective.trainable_params()]
        norms = [float(np.linalg.norm(g.asnumpy().astype(np.float64))) for g in grads]
        real_losses = tasks.per_row(engine, emissions, tags)
        # OBJ223-OBJ225: every tag path of short random sequences
        decodes, no_decode = tasks.decode_inputs(objective)
        decodes = decodes is not None
        rng = np.random.default_rng(int(th["seed"]))
        enum = []
        max_t = int(th["crf_enum_length"])
        for t in range(1, max_t + 1):
            if k ** t > int(th["crf_enum_paths"]):
                break
            e = rng.normal(0.0, 1.0, (1, t, k)).astype(np.float32)
            paths = list(itertools.product(range(k), repeat=t))
            ex = ms.Tensor(e)
            losses = np.array([float(tasks.objective(engine, ex, ms.Tensor(np.array([p], np.int32)))
                                     .asnumpy()[0]) for p in paths])
            # log sum_y exp(-k L(y)): k = 1 for a loss per sequence (mean over rows, sum), k = T
            # for one per scored position (token_mean): a batch of one row of T positions
            mass = {}
            for unit, k_scale in (("sequence", 1.0), ("token", float(t))):
                m = -losses * k_scale
                mass[unit] = float(m.max() + np.log(np.exp(m - m.max()).sum()))
            best = list(paths[int(losses.argmin())])
            decoded = None
            if decodes:  # decode(emissions[, mask]) as its signature takes it (tasks.decode_inputs)
                out = tasks.call_decode(objective, ex)
                decoded = [int(v) for v in np.asarray(out.asnumpy() if hasattr(out, "asnumpy") else out).reshape(-1)]
            enum.append({"length": t, "paths": len(paths), "mass": mass,
                         "min_loss": float(losses.min()), "best": best, "decoded": decoded})
        # the normalisation the loss follows: per sequence or per scored position (whichever fits)
        unit = min(("sequence", "token"), key=lambda u: max([abs(r["mass"][u]) for r in enum] or [0.0]))
        for r in enum:
            r["log_mass"] = r["mass"][unit]
        return {"params": names, "grad_norms": norms, "loss": float(total.asnumpy()), "unit": unit,
                "real_min_loss": float(real_losses.min()), "enumerated": enum,
                "has_decode": decodes, "no_decode": no_decode}

    def conditions(self, th: Settings) -> list[Condition]:
        tol = float(th["crf_nll_tolerance"])

        def trained(v):
            dead = [n for n, g in zip(v["params"], v["grad_norms"]) if not g > 0]
            if dead:
                return Verdict.FAIL, (f"{len(dead)} of the objective's {len(v['params'])} parameters "
                                      f"get no gradient: {listing(dead)} (stop_gradient, or unused by "
                                      f"the loss): they never learn"), float(len(dead))
            return Verdict.PASS, (f"all {len(v['params'])} parameters of the objective receive "
                                  f"gradient ({', '.join(f'{n} {g:.3g}' for n, g in zip(v['params'], v['grad_norms']))})"), 0.0

        def normalised(v):
            if not v["enumerated"]:
                return Verdict.SKIP, "no sequence short enough to enumerate (crf_enum_paths)", None
            worst = max(v["enumerated"], key=lambda r: abs(r["log_mass"]))
            x = abs(worst["log_mass"])
            text = "; ".join(f"T={r['length']}: {r['log_mass']:+.3g}" for r in v["enumerated"])
            if not math.isfinite(x) or x > tol:
                return Verdict.FAIL, (
                    f"the loss is not the negative log-likelihood: log sum_y exp(-loss(y)) over every "
                    f"tag path should be 0 but is {text} (per {v['unit']}, the closer of per sequence "
                    f"and per token; tolerance {tol:g}); the loss is "
                    f"{'below' if worst['log_mass'] > 0 else 'above'} the brute-force NLL by "
                    f"{x:.4g}: the partition function and the path score disagree (start / end "
                    f"transitions?)"), x
            return Verdict.PASS, (f"the loss equals the brute-force NLL per {v['unit']} by "
                                  f"enumeration (log sum_y exp(-loss(y)): {text}; tolerance {tol:g})"), x

        def nonnegative(v):
            lo = min([v["real_min_loss"]] + [r["min_loss"] for r in v["enumerated"]])
            if not math.isfinite(lo) or lo < -tol:
                return Verdict.FAIL, (f"the loss is negative: {lo:.4g} (a negative log-likelihood "
                                      f"is >= 0: the partition function misses paths or terms)"), lo
            return Verdict.PASS, f"the loss is never negative (min {lo:.4g})", lo

        def viterbi(v):
            if not v["has_decode"]:
                return Verdict.SKIP, v.get("no_decode") or "the objective has no decode(emissions): no Viterbi to check", None
            bad = [r for r in v["enumerated"] if r["decoded"] != r["best"]]
            if bad:
                r = bad[0]
                return Verdict.FAIL, (f"decode() returns {r['decoded']} at T={r['length']}, but the "
                                      f"path of least loss among all {r['paths']} is {r['best']}"), float(len(bad))
            return Verdict.PASS, (f"decode() returns the path of least loss at every enumerated "
                                  f"length ({len(v['enumerated'])})"), 0.0

        return [Condition("OBJ222", "crf_parameters_trained", trained),
                Condition("OBJ223", "crf_loss_is_nll", normalised),
                Condition("OBJ224", "crf_loss_nonnegative", nonnegative),
                Condition("OBJ225", "crf_viterbi_argmax", viterbi)]
