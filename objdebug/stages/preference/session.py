"""Host side of the preference stage: pairs, the reference model, and the compiled evaluations.

`session(ctx)` (cached per run) builds, once:

- the pairs of `[data] preference`, truncated to the profile's `max_length` the way a training
  pipeline cuts them (prompt kept, response cut), packed into `engine.batch_size`-row batches of
  one length bucket (short batches filled with copies of their first row, results dropped);
- the reference model: the model factory with `[reference] checkpoint` (default: the policy's);
- the probed policy (cells.py) and the user's preference objective, in its form.

Every graph goes through `engine.cell` / `engine.call`, so compiles are counted per stage.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from objdebug.engine import precision
from objdebug.pipeline.context import Context
from objdebug.engine.data import Sample
from objdebug.engine.data import pack_for
from objdebug.engine.cells import wrap_like
from objdebug.pipeline.datasets import encoder, preference_rows
from objdebug.pipeline.preference_batches import real_pairs
from objdebug.core.errors import InputError
from objdebug.engine.weights import holding as _holding

# the closed-form loss at a zero margin (policy == reference; SimPO: chosen == rejected)
ZERO_POINT = {
    "sigmoid": ("ln 2", lambda beta, gamma: math.log(2.0)),
    "ipo": ("1/(4 beta^2)", lambda beta, gamma: 1.0 / (4.0 * beta * beta)),
    "simpo": ("log(1 + e^gamma)", lambda beta, gamma: math.log1p(math.exp(gamma))),
    "hinge": ("1", lambda beta, gamma: 1.0),
}
# the log-prob reduction each loss type is derived for
EXPECTED_LOGPS = {"sigmoid": "sum", "hinge": "sum", "ipo": "mean", "simpo": "mean"}


def sequence_logps_host(logits: np.ndarray, labels: np.ndarray, label_pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(sum float64[B], count float64[B]) of log p(label) over the positions whose label is not
    `label_pad_id`, from the model's logits [B, T, V], in float64, row by row (no float64 copy of
    the whole batch). The same quantity as `cells.sequence_logps`, which the gradient graph
    computes in the graph for the policy it differentiates."""
    sums, counts = np.zeros(len(logits)), np.zeros(len(logits))
    for i, (x, y) in enumerate(zip(logits, labels)):
        mask = y != label_pad_id
        x = x.astype(np.float64)
        top = x.max(-1, keepdims=True)
        logp = x - (top + np.log(np.exp(x - top).sum(-1, keepdims=True)))
        picked = np.take_along_axis(logp, np.where(mask, y, 0).astype(np.int64)[:, None], -1)[:, 0]
        sums[i], counts[i] = float(picked[mask].sum()), float(mask.sum())
    return sums, counts


def logp_cotangent(logits: np.ndarray, labels: np.ndarray, label_pad_id: int,
                   weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float32[B, T, V]: weight[b] * d(sum_t log p(label_t)) / d logits, over the positions whose
    label is not `label_pad_id`: (onehot(label) - softmax(logits)) there, 0 elsewhere; float64[B, T]:
    sum_v of that times the logits, the policy probe's gradient). The derivative of
    `sequence_logps_host`, objdebug's own reduction (not the user's loss); computed in float64 one
    row at a time, so the host holds one float32 copy of the batch's logits more, never a float64 one."""
    out = np.zeros(logits.shape, np.float32)
    probe = np.zeros(logits.shape[:2], np.float64)
    for i, (x, y) in enumerate(zip(logits, labels)):
        mask = y != label_pad_id
        x = x.astype(np.float64)
        p = np.exp(x - x.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        g = -p
        rows = np.nonzero(mask)[0]
        g[rows, y[rows].astype(np.int64)] += 1.0
        g = np.where(mask[:, None], g, 0.0) * weight[i]
        probe[i] = (g * x).sum(-1)
        out[i] = g
    return out, probe


@dataclass
class PairBatch:
    """One batch of pairs: chosen and rejected packed to the same length."""

    rows: list[dict[str, Any]]          # the real pairs (len <= batch size)
    start: int                          # index of the first pair
    c_ids: np.ndarray
    c_labels: np.ndarray
    r_ids: np.ndarray
    r_labels: np.ndarray

    @property
    def n(self) -> int:
        return len(self.rows)

    def arrays(self, swap: bool = False) -> tuple[np.ndarray, ...]:
        if swap:
            return self.r_ids, self.r_labels, self.c_ids, self.c_labels
        return self.c_ids, self.c_labels, self.r_ids, self.r_labels


@dataclass
class Logps:
    """Sequence log-probs of every pair under one model: sums and scored-token counts."""

    c_sum: np.ndarray
    c_count: np.ndarray
    r_sum: np.ndarray
    r_count: np.ndarray

    def reduced(self, mean: bool) -> tuple[np.ndarray, np.ndarray]:
        if not mean:
            return self.c_sum, self.r_sum
        return self.c_sum / np.maximum(self.c_count, 1), self.r_sum / np.maximum(self.r_count, 1)


@dataclass
class Session:
    ctx: Context
    spec: Any                            # the preference ObjectiveSpec
    pairs: list[dict[str, Any]]
    batches: list[PairBatch]
    length: int
    vocab: int
    reference_model: Any
    policy: Any                          # ProbedPolicy
    objective: Any                       # LogpsObjective or PairsObjective
    loss: Any = None                     # form "preference": the user's loss Cell
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def form(self) -> str:
        return self.spec.call

    @property
    def mean(self) -> bool:
        return self.spec.logps == "mean"

    @property
    def label_pad_id(self) -> int:
        return self.ctx.config.data.label_pad_id

    @property
    def label_offset(self) -> int:
        """d of the batches' labels (labels[t] is the token at t + d; `label_offset(cfg)`)."""
        return label_offset(self.ctx.config)

    def scored_logits(self, labels: np.ndarray) -> np.ndarray:
        """bool [B, T]: the logit positions whose next token is scored (logits[u] predicts the
        token at u + 1, whose label sits at u + 1 - d): where a correct objective reads the logits."""
        scored = labels != self.label_pad_id
        if self.label_offset == 1:
            return scored
        out = np.zeros_like(scored)
        out[:, :-1] = scored[:, 1:]
        return out

    def setting(self, name: str, default: float | None = None) -> float | None:
        """A declared setting (beta, gamma): from the kwargs, else the objective's attribute."""
        value = self.spec.kwargs.get(name)
        if value is None:
            holder = self.loss if self.loss is not None else getattr(self.objective, "objective", None)
            value = getattr(holder, name, None)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return default
        return float(value)

    # ------------------------------------------------------------------ compiled evaluations
    def logps(self, which: str) -> Logps:
        """Log-probs of every pair under 'policy' or 'reference' (one graph per model), cached."""
        if which not in self.cache:
            self.cache[which] = self.logps_of(which, self.batches)
        return self.cache[which]

    def logps_of(self, which: str, batches: list[PairBatch]) -> Logps:
        """Log-probs of the pairs of `batches` under the model as it is now (not cached).

        The logits come from the run's one forward graph, `model.forward` (`Engine.forward`),
        and the log-probs are summed on the host in float64 (`sequence_logps_host`). The
        reference (and the policy copy a "preference-pairs" Cell holds) is data, not a graph:
        its parameters are loaded into the target's model for these calls and the model's own
        restored after (`weights_of`), so a second model never compiles a graph of its own."""
        model = self.policy.model if which == "policy" else self.reference_model
        out: list[list[np.ndarray]] = [[], [], [], []]
        with self.weights_of(model):
            for b in batches:
                for k, (ids, labels) in enumerate(((b.c_ids, b.c_labels), (b.r_ids, b.r_labels))):
                    total, count = sequence_logps_host(self.ctx.engine.logits(ids), labels, self.label_pad_id)
                    out[2 * k].append(total[:b.n])
                    out[2 * k + 1].append(count[:b.n])
        return Logps(*(np.concatenate(x) for x in out))

    @contextmanager
    def weights_of(self, model: Any) -> Iterator[None]:
        """The target's model holds `model`'s parameter values inside the block (the very same
        model: nothing to do); its own values are restored exactly on exit. Both come from the
        same factory, so their parameters pair up in order."""
        own = list(self.ctx.target.model.get_parameters())
        other = list(model.get_parameters())
        if model is self.ctx.target.model:
            yield
            return
        if len(own) != len(other) or any(tuple(a.shape) != tuple(b.shape) for a, b in zip(own, other)):
            raise ValueError("For 'preference', the reference model must have the policy's parameters "
                             f"(the same factory), but got {len(other)} parameters for {len(own)}.")
        with _holding(own, other):
            yield

    def fill(self, values: np.ndarray, batch: PairBatch) -> np.ndarray:
        """float32[B]: a batch's slice of per-pair values, fill rows copying its first pair."""
        rows = list(range(batch.start, batch.start + batch.n))
        rows += [batch.start] * (self.ctx.engine.batch_size - batch.n)
        return np.asarray(values)[rows].astype(np.float32)

    def real_inputs(self) -> tuple[np.ndarray, ...]:
        """(pc, pr, rc, rr) [N]: the declared reduction of policy and reference log-probs."""
        pc, pr = self.logps("policy").reduced(self.mean)
        rc, rr = self.logps("reference").reduced(self.mean)
        return pc, pr, rc, rr

    def setting_keys(self) -> list[str]:
        """The numeric settings the settings check (OBJ811) changes: float kwargs, and the
        profile's named settings even when written as integers (beta = 1); other integers
        (ignore_index, pad ids) are not scale settings."""
        named = set(self.ctx.profile.section("preference")["settings"])
        return [k for k, v in self.spec.kwargs.items() if not isinstance(v, bool)
                and (isinstance(v, float) or (k in named and isinstance(v, int)))]

    def changed_kwargs(self, key: str) -> tuple[float, float, dict[str, Any]]:
        """(old, new, the kwargs with `key` changed): doubled, or 0.1 from 0."""
        value = self.spec.kwargs[key]
        old = float(value)
        new = old * 2.0 if old != 0 else 0.1
        return old, new, dict(self.spec.kwargs, **{key: type(value)(new) if isinstance(value, float) else new})

    def losses_cell(self) -> Any:
        """Form "preference": the `preference.objective` graph (cells.PreferenceLosses), the
        loss with its derivative and every setting variant."""
        from objdebug.engine.target import _call_factory
        from objdebug.stages.preference.cells import PreferenceLosses

        def build():
            where = "preference" if self.ctx.config.preference is not None else "objective"
            variants, keys, errors = [], [], {}
            for key in self.setting_keys():
                try:  # a variant the factory refuses fails the settings check only (ERROR there)
                    v = _call_factory(self.spec.factory, self.changed_kwargs(key)[2], where,
                                      self.ctx.config.base_dir)
                except Exception as exc:  # noqa: BLE001  (InputError or the factory's own)
                    errors[key] = exc
                    continue
                v.set_train(False)
                variants.append(v)
                keys.append(key)
            self.cache["variant_keys"], self.cache["variant_errors"] = keys, errors
            return PreferenceLosses(self.loss, variants)
        return self.ctx.engine.cell("preference.objective", build)

    def evaluate(self, inputs: tuple[np.ndarray, ...] | None = None, *, swap: bool = False,
                 same: bool = False, cell: Any = None, name: str = "preference.objective",
                 setting: str | None = None) -> dict[str, Any]:
        """The objective on every batch -> {losses [batches], cr [N], rj [N]} (rewards NaN if not returned).

        Form "preference": `inputs` = (pc, pr, rc, rr) [N] (default: the real ones) go to the loss
        alone; `setting`: the losses of the variant with that setting changed (`changed_kwargs`),
        from the same graph. Form "preference-pairs": the token batches go to the user's Cell
        (or `cell`, graph `name`); `swap` exchanges chosen and rejected, `same` passes the chosen
        answer as the rejected one too.
        """
        import mindspore as ms

        engine = self.ctx.engine
        if self.form == "preference":
            cell, name = self.losses_cell(), "preference.objective"
            if inputs is None:
                inputs = self.real_inputs()
        elif cell is None:
            cell = engine.cell(name, lambda: self.objective)
        variant = None
        if setting is not None:
            if setting in self.cache.get("variant_errors", {}):
                raise self.cache["variant_errors"][setting]
            variant = self.cache["variant_keys"].index(setting)
        losses, crs, rjs = [], [], []
        for b in self.batches:
            if self.form == "preference":
                args = [ms.Tensor(self.fill(x, b)) for x in inputs]
            else:
                c_ids, c_labels, r_ids, r_labels = b.arrays(swap)
                if same:
                    r_ids, r_labels = c_ids, c_labels
                zero = np.zeros(self.ctx.engine.batch_size, np.float32)
                args = [ms.Tensor(a) for a in (c_ids, c_labels, r_ids, r_labels)] + [ms.Tensor(zero)] * 2
            out = engine.call(name, cell, *args)
            loss, cr, rj = out[:3]
            if variant is not None:
                loss = out[5][variant]
            cr, rj = cr.asnumpy().astype(np.float64), rj.asnumpy().astype(np.float64)
            losses.append(float(loss.asnumpy()))
            crs.append(cr[:b.n] if cr.size > 1 else np.full(b.n, np.nan))
            rjs.append(rj[:b.n] if rj.size > 1 else np.full(b.n, np.nan))
        return {"losses": np.array(losses), "cr": np.concatenate(crs), "rj": np.concatenate(rjs)}

    def implicit_margins(self, inputs: tuple[np.ndarray, ...] | None = None) -> np.ndarray:
        """objdebug's own margin per pair (what the loss type prefers; not the user's code):
        SimPO beta * (pc - pr); the others beta * ((pc - rc) - (pr - rr))."""
        pc, pr, rc, rr = inputs if inputs is not None else self.real_inputs()
        beta = self.setting("beta", 1.0)
        if self.spec.loss_type == "simpo":
            return beta * (np.asarray(pc) - np.asarray(pr))
        return beta * ((np.asarray(pc) - np.asarray(rc)) - (np.asarray(pr) - np.asarray(rr)))

    def gradient(self, batch: PairBatch) -> dict[str, Any]:
        """One forward + backward on a batch: loss, rewards and every parameter's gradient.

        Form "preference" (a loss without parameters of its own): dloss/dlogits from the loss's
        derivative w.r.t. the policy's log-probs (`preference.objective`) times the log-probs'
        derivative w.r.t. the logits (objdebug's own reduction: on the host, float64), then the
        model's VJP (`model.vjp`, the graph every objective's parameter gradient shares); the
        probe's gradient, sum_v dL/dx_tv * x_tv, on the host from the same numbers. Otherwise
        (the "preference-pairs" Cell owns its models) its own graph `preference.gradient`."""
        if self.form == "preference" and not list(self.loss.trainable_params()):
            return self._gradient_through_vjp(batch)
        import mindspore as ms

        from objdebug.stages.preference.cells import PreferenceGradient

        engine = self.ctx.engine
        params = self.gradient_params()
        cell = engine.cell("preference.gradient", lambda: PreferenceGradient(self.objective, params))
        rc = rr = np.zeros(self.ctx.engine.batch_size, np.float32)  # the pairs Cell computes its own
        args = [ms.Tensor(a) for a in batch.arrays()] + [ms.Tensor(rc), ms.Tensor(rr)]
        out = engine.call("preference.gradient", cell, *args)
        grads = [g.asnumpy() for g in out[3:]]
        return {"loss": float(out[0].asnumpy()), "params": params, "grads": grads}

    def _gradient_through_vjp(self, batch: PairBatch) -> dict[str, Any]:
        import mindspore as ms

        from objdebug.engine.gradients import model_vjp

        engine = self.ctx.engine
        model = self.ctx.target.model
        c_ids, c_labels, r_ids, r_labels = batch.arrays()
        logits = [engine.logits(c_ids), engine.logits(r_ids)]
        (cs, cn), (rs, rn) = (sequence_logps_host(x, y, self.label_pad_id)
                              for x, y in zip(logits, (c_labels, r_labels)))
        pc, pr = (cs / np.maximum(cn, 1), rs / np.maximum(rn, 1)) if self.mean else (cs, rs)
        _, _, rc, rr = self.real_inputs()
        args = [ms.Tensor(a.astype(np.float32)) for a in (pc, pr, self.fill(rc, batch), self.fill(rr, batch))]
        loss, _, _, dpc, dpr, _ = engine.call("preference.objective", self.losses_cell(), *args)
        by_id: dict[int, np.ndarray] = {}
        probe = np.zeros(self.policy.probe.shape, np.float64)
        for ids, x, y, d, n in ((c_ids, logits[0], c_labels, dpc, cn), (r_ids, logits[1], r_labels, dpr, rn)):
            weight = d.asnumpy().astype(np.float64) / (np.maximum(n, 1) if self.mean else 1.0)
            g, g_probe = logp_cotangent(x, y, self.label_pad_id, weight)
            probe[..., 0] += g_probe
            _, grads = model_vjp(engine, self.ctx.target, ms.Tensor(ids, ms.int32),
                                 ms.Tensor(g.astype(x.dtype, copy=False)))
            for p, gr in zip(model.trainable_params(), grads):
                by_id[id(p)] = by_id.get(id(p), 0.0) + gr.asnumpy().astype(np.float64)
        by_id[id(self.policy.probe)] = probe
        params = self.gradient_params()
        grads = [by_id.get(id(p), np.zeros(p.shape)).astype(np.float32) for p in params]
        return {"loss": float(loss.asnumpy()), "params": params, "grads": grads}

    def gradient_params(self) -> list:
        """Every trainable parameter the objective holds: policy, probe, its own, and the reference's
        unless the user froze them (requires_grad=False, which an optimizer skips too)."""
        return list(self.objective.trainable_params())

    def reference_param_ids(self) -> set[int]:
        return {id(p) for p in self.reference_model.get_parameters()}

    def policy_params(self) -> list:
        return list(self.policy.model.trainable_params())

    @contextmanager
    def reference_as_policy(self) -> Iterator[None]:
        """The reference model's parameters temporarily set to the policy's (restored exactly).

        Both come from the same factory, so their parameters pair up in order (names may differ:
        a "preference-pairs" Cell prefixes them with its attribute names)."""
        with _holding(list(self.reference_model.get_parameters()), list(self.policy.model.get_parameters())):
            yield



# --------------------------------------------------------------------------- building
def no_preference_reason(ctx: Context) -> str | None:
    """SKIP reason for the whole stage, or None."""
    cfg = ctx.config
    if cfg.preference_objective is None:
        return ("the target has no preference objective ([objective] call = \"preference\" or "
                "\"preference-pairs\", or a [preference] section)")
    if not cfg.data.preference and real_pairs(ctx) is None:
        return "no preference pairs: set [data] preference = \"pairs.jsonl\""
    return None


def preflight(ctx: Context, settings: Any) -> None:
    """A `[preference] max_length` that cuts every pair to its prompt (at or below the shortest
    prompt: no pair keeps an answer token) contradicts the data: exit 2 before any stage, naming
    both values, where the stage would otherwise judge empty pairs (OBJ805 FAIL "no usable
    gradient") after the work (issue 46)."""
    max_length = int(settings["max_length"])
    rows = preference_rows(ctx) if max_length > 0 else []
    if not rows:
        return
    shortest = min(rows, key=lambda r: len(r["prompt"]))
    if max_length <= len(shortest["prompt"]):
        raise InputError(
            f"For '[preference] max_length' = {max_length} and the shortest prompt of [data] "
            f"preference = {len(shortest['prompt'])} tokens (row '{shortest['id']}'), max_length must be "
            f"above the shortest prompt (pairs are cut to max_length tokens, the prompt kept), but "
            f"it leaves no pair an answer token.", source=str(ctx.config.data.preference),
            line=shortest.get("line"))


def session(ctx: Context) -> Session:
    return ctx.provide(session, lambda: _build(ctx))


def _truncate(row: dict[str, Any], max_length: int) -> dict[str, Any]:
    """Cut the answers (never the prompt) so prompt + answer <= max_length tokens."""
    out = dict(row)
    if max_length > 0:
        room = max(max_length - len(row["prompt"]), 0)
        out["chosen"], out["rejected"] = row["chosen"][:room], row["rejected"][:room]
        out["truncated"] = len(out["chosen"]) < len(row["chosen"]) or len(out["rejected"]) < len(row["rejected"])
    else:
        out["truncated"] = False
    return out


def label_offset(cfg: Any) -> int:
    """d of the session's labels (labels[t] is the token at t + d): what their reader pairs.
    Form "preference": objdebug's own reduction (`sequence_logps_host`, `cells.sequence_logps`)
    reads them, and it pairs logits[t] with labels[t], so they always carry the next token
    (d = 1), whatever the pipeline's layout: the user's loss sees log-probs, never these labels.
    Form "preference-pairs": the user's Cell reads them, so they are in the pipeline's layout,
    `[data] shift` (after the batches stage: the batches' measured offset, `adopt_conventions`),
    as the batches stage's OBJ013 / OBJ019 read it (a Cell that shifts itself takes d = 0)."""
    return 1 if cfg.preference_objective.call == "preference" or cfg.data.shift else 0


def _pack_answers(rows: list[dict[str, Any]], key: str, length: int, cfg) -> tuple[np.ndarray, np.ndarray]:
    """prompt + answer `key` of each row, padded as every batch is (`[data] padding_side`, the
    model's mask marks: objdebug/engine/model_inputs.py), labelled in `label_offset`'s layout."""
    samples = [Sample(id=str(i), prompt=list(r["prompt"]), response=list(r[key])) for i, r in enumerate(rows)]
    shift = label_offset(cfg) == 1
    if shift != cfg.data.shift:
        cfg = replace(cfg, data=replace(cfg.data, shift=shift))
    return pack_for(cfg, samples, length)


def _build(ctx: Context) -> Session:
    from objdebug.stages.preference.cells import LogpsObjective, PairsObjective, ProbedPolicy
    from objdebug.engine.target import _call_factory, load_checkpoint_strict

    cfg = ctx.config
    spec = cfg.preference_objective
    settings = ctx.profile.section("preference")
    batch = ctx.engine.batch_size
    max_length = int(settings["max_length"])
    real = real_pairs(ctx)  # [data] batches with chosen / rejected columns: the pipeline's own pairs
    pairs = [_truncate(r, max_length) for r in (real if real is not None else preference_rows(ctx))]
    length = ctx.engine.bucket(max(len(p["prompt"]) + max(len(p["chosen"]), len(p["rejected"]), 1)
                                   for p in pairs))
    batches = []
    for start in range(0, len(pairs), batch):
        rows = pairs[start:start + batch]
        filled = rows + [rows[0]] * (batch - len(rows))
        c_ids, c_labels = _pack_answers(filled, "chosen", length, cfg)
        r_ids, r_labels = _pack_answers(filled, "rejected", length, cfg)
        batches.append(PairBatch(rows, start, c_ids, c_labels, r_ids, r_labels))

    policy_model = ctx.target.model
    if spec.call == "preference-pairs":
        # the user's Cell takes the policy as an attribute, which renames its parameters: give it
        # a copy, so the other stages keep the target's model as it was
        policy_model = _copy_model(ctx, policy_model)
    reference = _call_factory(cfg.model.factory, cfg.model.kwargs, "model", cfg.base_dir)
    ref_ckpt = (cfg.reference.checkpoint if cfg.reference is not None and cfg.reference.checkpoint
                else cfg.model.checkpoint)
    if ref_ckpt:
        load_checkpoint_strict(reference, ref_ckpt, "reference")
    else:  # no checkpoint at all: the reference starts as a copy of the policy
        _copy_parameters(policy_model, reference)
    reference.set_train(False)
    reference = wrap_like(ctx.target, reference)  # called as the policy is ([model] inputs/output)
    reference = precision.as_trained(reference, cfg, "reference model")  # [run] amp_level, as the policy
    vocab = encoder(ctx).vocab_size
    policy = ProbedPolicy(policy_model, batch, length)
    where = "preference" if cfg.preference is not None else "objective"
    loss = None
    if spec.call == "preference":
        loss = _call_factory(spec.factory, spec.kwargs, where, cfg.base_dir)
        loss.set_train(False)
        objective = LogpsObjective(policy, loss, cfg.data.label_pad_id, spec.logps == "mean")
    else:
        user = build_pairs_objective(ctx, spec.kwargs, policy, reference)
        objective = PairsObjective(user)
    return Session(ctx=ctx, spec=spec, pairs=pairs, batches=batches, length=length, vocab=vocab,
                   reference_model=reference, policy=policy, objective=objective, loss=loss,
                   cache={"reference_checkpoint": ref_ckpt})


def build_pairs_objective(ctx: Context, kwargs: dict[str, Any], policy: Any, reference: Any) -> Any:
    """The "preference-pairs" factory called with policy=, reference= and the declared kwargs."""
    from objdebug.engine.target import import_factory

    cfg = ctx.config
    spec = cfg.preference_objective
    where = "preference" if cfg.preference is not None else "objective"
    factory = import_factory(spec.factory, where, cfg.base_dir)
    try:
        cell = factory(policy=policy, reference=reference, **kwargs)
    except Exception as exc:
        raise InputError(f"For '{where}.factory', calling '{spec.factory}' with policy=, reference= "
                         f"and kwargs {kwargs} failed: {type(exc).__name__}: {exc}") from None
    cell.set_train(False)
    return cell


def _copy_parameters(source: Any, dest: Any) -> None:
    import mindspore as ms

    for d, s in zip(dest.get_parameters(), source.get_parameters()):
        d.set_data(ms.Tensor(s.data.asnumpy()))


def _copy_model(ctx: Context, model: Any) -> Any:
    from objdebug.engine.target import _call_factory

    cfg = ctx.config
    copy = _call_factory(cfg.model.factory, cfg.model.kwargs, "model", cfg.base_dir)
    _copy_parameters(model, copy)
    copy.set_train(False)
    return precision.as_trained(wrap_like(ctx.target, copy), cfg, "model")  # [model] inputs, [run] amp_level: as the policy
