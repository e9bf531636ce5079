"""Host side of the policy stage: rollouts, batches, the bound objective and its evaluations.

`session(ctx)` (cached per run) builds, once:

- the groups of `[data] rollouts` (rollouts.py), each completion a row prompt + completion, packed
  into `engine.batch_size`-row batches of one length bucket (a short last batch filled with copies
  of its own rows, cycled: a batch of real rollouts, whose copies the reports leave out);
- the advantages of every completion from its group's rewards (`[policy] group_advantages`);
- the user's objective bound by construct's parameter names (cells.BoundLoss), in the objective-only
  graph `policy.objective` (cells.PolicyLossGrad, dynamic batch and length: one compile per logits
  dtype) and its setting variants (`policy.settings`).

The policy's log-probs, the logits and every quantity the checks read come from the model's shared
forward graph (`Engine.logits`, `model.forward`) and are reduced on the host in float64; the
parameter gradient goes through the shared VJP (`model.vjp`). The split form adds no graph that
holds the model. Every call goes through `engine.cell` / `engine.call`, so compiles are counted.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from objdebug.core.errors import InputError
from objdebug.core.policy_config import NAMES
from objdebug.engine import position_limit
from objdebug.engine.data import Sample, pack_for
from objdebug.pipeline.context import Context
from objdebug.pipeline.datasets import encoder
from objdebug.stages.policy.rollouts import Completion, group_advantages, read_rollouts
from objdebug.engine.weights import holding

POLICY_OBJECTIVE = "policy.objective"  # the objective-only graph (dynamic shapes; `.float16` beside)

# kwargs that name the clip range and the KL coefficient (TRL, verl, OpenRLHF, MindRLHF spellings)
EPSILON_KEYS = ("epsilon", "clip_range", "cliprange", "clip_eps", "eps_clip", "clip_ratio")
EPSILON_LOW_KEYS = ("epsilon_low", "clip_ratio_low", "clip_range_low", "clip_eps_low")
EPSILON_HIGH_KEYS = ("epsilon_high", "clip_ratio_high", "clip_range_high", "clip_eps_high")
BETA_KEYS = ("beta", "kl_coef", "kl_beta", "beta_kl", "init_kl_coef", "kl_coeff", "kl_loss_coef")
ORDER = ("logits", "input_ids", "completion_mask", "advantages", "old_per_token_logps",
         "ref_per_token_logps")


# --------------------------------------------------------------------------- host reductions
def log_softmax64(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    top = x.max(-1, keepdims=True)
    return x - (top + np.log(np.exp(x - top).sum(-1, keepdims=True)))


def token_logps(logits: np.ndarray, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """float64[B, T] in the "inputs" layout: entry t = log p(ids[t] | ids[<t]) from logits[t-1]
    where mask[t] (a completion token), 0 elsewhere. objdebug's own reduction, row by row."""
    out = np.zeros(ids.shape, np.float64)
    for b in range(len(ids)):
        lp = log_softmax64(logits[b, :-1])
        picked = np.take_along_axis(lp, ids[b, 1:].astype(np.int64)[:, None], -1)[:, 0]
        out[b, 1:] = np.where(mask[b, 1:], picked, 0.0)
    return out


def read_token_gradients(dlogits: np.ndarray, logits: np.ndarray, ids: np.ndarray,
                         mask: np.ndarray) -> dict[str, np.ndarray]:
    """What d loss / d logits says about each token, in float64:

    - `g` [B, T] ("inputs" layout): the derivative w.r.t. the log-prob of completion token t, read
      off the logits that predict it (position t-1): the projection of dL/dx[t-1] on
      onehot(ids[t]) - softmax(x[t-1]), exact when the loss reads those logits only through that
      token's log-prob;
    - `label` [B, T]: at each position, the vocabulary entry with the largest |dL/dx| (the token the
      loss pairs with these logits: ids[t+1] for a correct pairing), -1 where the gradient is 0;
    - `norm` [B, T]: |dL/dx[p]| at every position."""
    B, T, _ = dlogits.shape
    g = np.zeros((B, T))
    label = np.full((B, T), -1, np.int64)
    norm = np.zeros((B, T))
    for b in range(B):
        d = np.asarray(dlogits[b], np.float64)
        norm[b] = np.sqrt((d * d).sum(-1))
        label[b] = np.where(norm[b] > 0, np.abs(d).argmax(-1), -1)
        p = np.exp(log_softmax64(logits[b, :-1]))
        for t in np.nonzero(mask[b, 1:])[0] + 1:
            u = -p[t - 1]
            u[int(ids[b, t])] += 1.0
            g[b, t] = float(d[t - 1] @ u) / max(float(u @ u), 1e-300)
    return {"g": g, "label": label, "norm": norm}


@dataclass
class RolloutBatch:
    rows: list[Completion]       # the real rollouts (len <= batch size)
    start: int                   # index of its first row in Session.rows
    ids: np.ndarray              # int32[B, T]: what the objective sees (plain ids, pad_id padding)
    model_ids: np.ndarray        # what the model is called on (padding marked if it takes a mask)
    mask: np.ndarray             # bool[B, T] ("inputs" layout): completion tokens
    advantages: np.ndarray       # float64[B]: each row's sequence advantage
    filled: list[int]            # row -> index into Session.rows (copies for the fill rows)

    @property
    def n(self) -> int:
        return len(self.rows)


@dataclass
class Session:
    ctx: Context
    spec: Any                    # the [objective] ObjectiveSpec
    policy: Any                  # PolicySpec
    groups: list[list[Completion]]
    rows: list[Completion]
    advantages: np.ndarray       # float64[N], per completion
    batches: list[RolloutBatch]
    length: int
    picks: tuple[int, ...]       # construct's parameters -> index into ORDER
    bound_names: dict[str, str]  # construct's parameter -> our name
    loss: Any
    reference_model: Any = None
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def form(self) -> str:
        return self.spec.call

    @property
    def targets(self) -> bool:
        return self.policy.layout == "targets"

    def takes(self, name: str) -> bool:
        return ORDER.index(name) in self.picks

    # ------------------------------------------------------------ settings
    def setting(self, keys: tuple[str, ...]) -> tuple[str, float] | None:
        """(kwarg name, value) of the first of `keys` the kwargs declare as a number, else None."""
        for k in keys:
            v = self.spec.kwargs.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                return k, float(v)
        return None

    def epsilons(self) -> tuple[float | None, float | None]:
        """The declared clip range (low, high): epsilon_low / epsilon_high, else epsilon for both."""
        both = self.setting(EPSILON_KEYS)
        low, high = self.setting(EPSILON_LOW_KEYS), self.setting(EPSILON_HIGH_KEYS)
        lo = low[1] if low else (both[1] if both else None)
        hi = high[1] if high else (both[1] if both else None)
        return lo, hi

    def setting_keys(self) -> list[str]:
        named = set(self.ctx.profile.section("policy")["settings"])
        return [k for k, v in self.spec.kwargs.items() if not isinstance(v, bool)
                and (isinstance(v, float) or (k in named and isinstance(v, int)))]

    def changed_kwargs(self, key: str) -> tuple[float, float, dict[str, Any]]:
        value = self.spec.kwargs[key]
        old = float(value)
        new = old * 2.0 if old != 0 else 0.1
        return old, new, dict(self.spec.kwargs, **{key: type(value)(new) if isinstance(value, float) else new})

    # ------------------------------------------------------------ arrays
    def logits(self, batch: RolloutBatch) -> np.ndarray:
        """float32[B, T, V] of the policy as it is now (the shared `model.forward` graph)."""
        return np.asarray(self.ctx.engine.logits(batch.model_ids))

    def probe_logits(self, batch: RolloutBatch) -> np.ndarray:
        """The model's logits at the profile's `probe_temperature` (divided by it): the point at which
        the objective-level checks read token weights. A model is nearly certain of the tokens it
        sampled (p = 0.9999 on the demo), where d log p / d logits = onehot - softmax is 1e-4 and
        float32 leaves the weight with a 1% error, or none at all at p = 1; a sampler's temperature
        (GRPO trainers score at the sampling temperature) keeps every token readable. The objective
        sees consistent inputs: old and reference log-probs are computed from the same logits."""
        temperature = float(self.ctx.profile.section("policy")["probe_temperature"])
        return self.logits(batch) / np.float32(temperature)

    def logps(self, batch: RolloutBatch, logits: np.ndarray | None = None) -> np.ndarray:
        return token_logps(self.logits(batch) if logits is None else logits, batch.ids, batch.mask)

    def layout(self, x: np.ndarray) -> np.ndarray:
        """A per-token array in the "inputs" layout -> the declared layout ("targets": [B, T-1])."""
        return x[:, 1:] if self.targets else x

    def token_advantages(self, batch: RolloutBatch, adv: np.ndarray) -> np.ndarray:
        """[B] sequence advantages -> what the objective takes ([B], or per token in the layout)."""
        if self.policy.advantages == "sequence":
            return adv
        return self.layout(np.where(batch.mask, adv[:, None], 0.0))

    def arrays(self, batch: RolloutBatch, logits: np.ndarray, adv: np.ndarray, old: np.ndarray,
               ref: np.ndarray, mask: np.ndarray | None = None, ids: np.ndarray | None = None) -> list:
        """The six Tensors the bound objective takes: `adv` [B] (sequence advantages; per token
        under "token"), `old` / `ref` [B, T] in the "inputs" layout (converted to the declared one)."""
        import mindspore as ms

        mask = batch.mask if mask is None else mask
        if self.form == "policy-model":  # the Cell computes its own logits from the ids
            logits = np.zeros((1,), np.float32)
        ids = batch.ids if ids is None else ids
        logits = logits if logits.dtype == np.float16 else logits.astype(np.float32)
        arrays = (logits, ids.astype(np.int32),
                  self.layout(mask).astype(np.float32), self.token_advantages(batch, adv).astype(np.float32),
                  self.layout(old).astype(np.float32), self.layout(ref).astype(np.float32))
        return [ms.Tensor(a) for a in arrays]

    def evaluate(self, batch: RolloutBatch, logits: np.ndarray, adv: np.ndarray, old: np.ndarray,
                 ref: np.ndarray, mask: np.ndarray | None = None, ids: np.ndarray | None = None
                 ) -> dict[str, Any]:
        """The objective on one batch (`arrays`) -> {loss, dlogits float32[B, T, V]}.

        Form "policy-model": the user's Cell runs the policy itself (`policy.model_objective`, the
        form's one graph that holds the model); d loss / d logits is its probe's gradient, at the
        probe temperature (the logits the host log-probs are computed from: `probe_logits`)."""
        if self.form == "policy-model":
            from objdebug.stages.policy.cells import PolicyModelGrad

            cell = self.ctx.engine.cell("policy.model_objective",
                                        lambda: PolicyModelGrad(self.bound_loss(), self.cache["probe"].probe))
            loss, dlogits = self.ctx.engine.call("policy.model_objective", cell,
                                                 *self.arrays(batch, logits, adv, old, ref, mask, ids)[1:])
            dlogits = dlogits[:len(batch.ids)]  # a smaller batch (micro-batches) uses the probe's first rows
        else:
            loss, dlogits = self.objective_call(self.arrays(batch, logits, adv, old, ref, mask, ids))
        return {"loss": float(loss.asnumpy()), "dlogits": dlogits.asnumpy().astype(np.float32, copy=False)}

    def variants(self, batch: RolloutBatch, logits: np.ndarray, adv: np.ndarray, old: np.ndarray,
                 ref: np.ndarray) -> tuple[float, np.ndarray]:
        """(the loss, float64[n]: its setting variants' losses) on one batch (`policy.settings`)."""
        loss, others = self.ctx.engine.call("policy.settings", self.variants_cell(),
                                            *self.arrays(batch, logits, adv, old, ref))
        return float(loss.asnumpy()), others.asnumpy().astype(np.float64)[:len(self.cache["variant_keys"])]

    def bound_loss(self) -> Any:
        from objdebug.stages.policy.cells import BoundLoss

        if "bound" not in self.cache:
            self.cache["bound"] = BoundLoss(self.loss, self.picks)
        return self.cache["bound"]

    def objective_call(self, arrays: list) -> tuple:
        """(loss, d loss / d logits) of the bound loss on the six Tensors, through the one
        dynamic-shape graph `policy.objective` (one per logits dtype: `.float16`), so the batch, its
        micro-batches and any other batch size or length share one compile; a loss that cannot
        compile with dynamic shapes falls back to one static graph per shape (engine/dynamic_graph.py).
        Every input is batch-first, so a compile-cache hit is proved on the first row."""
        import mindspore as ms

        from objdebug.engine import dynamic_graph
        from objdebug.stages.policy.cells import PolicyLossGrad

        dtype = arrays[0].dtype
        name = POLICY_OBJECTIVE + ("" if dtype == ms.float32 else f".{str(dtype).lower()}")
        specs = tuple(ms.Tensor(shape=[None] * len(a.shape), dtype=a.dtype) for a in arrays)
        return dynamic_graph.call(self.ctx.engine, name, lambda: PolicyLossGrad(self.bound_loss()),
                                  specs, *arrays, rows=True)

    def variants_cell(self) -> Any:
        """`policy.settings`: the bound loss and every setting variant, forward only."""
        from objdebug.engine.target import _call_factory
        from objdebug.stages.policy.cells import BoundLoss, PolicyLossVariants

        def build():
            variants, keys, errors = [], [], {}
            for key in self.setting_keys():
                try:  # a variant the factory refuses fails the settings check only
                    v = _call_factory(self.spec.factory, self.changed_kwargs(key)[2], "objective",
                                      self.ctx.config.base_dir)
                except Exception as exc:  # noqa: BLE001
                    errors[key] = exc
                    continue
                v.set_train(False)
                variants.append(BoundLoss(v, self.picks))
                keys.append(key)
            self.cache["variant_keys"], self.cache["variant_errors"] = keys, errors
            return PolicyLossVariants(self.bound_loss(), variants)
        return self.ctx.engine.cell("policy.settings", build)

    def point(self, batch: RolloutBatch, logits: np.ndarray | None = None, *, adv: np.ndarray | None = None,
              delta: float = 0.0, ratio: np.ndarray | float = 1.0, outside: float | None = None
              ) -> dict[str, Any]:
        """The objective at a probe point built from the policy's own log-probs `lp`:
        old = lp - log(ratio) (ratio 1: on-policy), ref = lp - delta (0: policy == reference) on
        completion tokens and 0 elsewhere (the layout's convention; `outside`: that value instead,
        in old and ref alike), advantages `adv` (default: the real ones)."""
        logits = self.logits(batch) if logits is None else logits
        lp = self.logps(batch, logits)
        m = batch.mask
        fill = 0.0 if outside is None else outside
        old = np.where(m, lp - np.log(ratio), fill)
        ref = np.where(m, lp - delta, fill)
        adv = batch.advantages if adv is None else adv
        out = self.evaluate(batch, logits, adv, old, ref)
        out["logits"], out["lp"] = logits, lp
        return out

    # ------------------------------------------------------------ the rollouts' own old log-probs
    def stored_old(self, batch: RolloutBatch) -> np.ndarray | None:
        """float64[B, T] ("inputs" layout): the rollouts' stored `old_logps` at each completion
        token, 0 elsewhere; None unless every row of the batch (fill copies included) carries them."""
        if any(self.rows[i].old_logps is None for i in batch.filled):
            return None
        out = np.zeros(batch.ids.shape, np.float64)
        for b, i in enumerate(batch.filled):
            c = self.rows[i]
            out[b, len(c.prompt):c.length] = c.old_logps
        return out

    def scoring_logits(self, batch: RolloutBatch) -> np.ndarray:
        """The policy's logits as the trainer scores the completions: the shared `model.forward`'s,
        divided by `[policy] temperature`."""
        return self.logits(batch) / np.float32(self.policy.temperature)

    def rollout_inputs(self, batch: RolloutBatch) -> dict[str, Any]:
        """The objective's inputs as the user's rollouts give them: where every row of the batch
        carries stored `old_logps`, the policy's scoring logits with those as the old log-probs
        (the buffer's real ratios) and the reference at the policy; else the on-policy probe point
        (the probe logits, old = reference = the policy's own), the fallback."""
        stored = self.stored_old(batch)
        if stored is None:
            logits = self.probe_logits(batch)
            lp = self.logps(batch, logits)
            old, source = np.where(batch.mask, lp, 0.0), "on-policy (the rollouts carry no old_logps)"
        else:
            logits = self.scoring_logits(batch)
            lp = self.logps(batch, logits)
            old, source = np.where(batch.mask, stored, 0.0), "the rollouts' stored old_logps"
        return {"logits": logits, "lp": lp, "old": old, "ref": np.where(batch.mask, lp, 0.0),
                "source": source, "stored": stored is not None}

    def reference_logps(self, batch: RolloutBatch) -> np.ndarray:
        """float64[B, T]: the reference model's token log-probs (its weights loaded into the model
        for the shared forward graph; none configured: the policy's own)."""
        if self.reference_model is None:
            return self.logps(batch, self.probe_logits(batch))
        with holding(list(self.ctx.target.model.get_parameters()), list(self.reference_model.get_parameters())):
            return self.logps(batch, self.probe_logits(batch))



# --------------------------------------------------------------------------- building
def no_policy_reason(ctx: Context) -> str | None:
    cfg = ctx.config
    if cfg.policy_objective is None:
        return "the target has no policy-gradient objective ([objective] call = \"policy\" or \"policy-model\")"
    if not cfg.data.rollouts:
        return "no rollouts: set [data] rollouts = \"rollouts.jsonl\""
    return None


def session(ctx: Context) -> Session:
    return ctx.provide(session, lambda: _build(ctx))


def bind(cell: Any, form: str, renames: dict[str, str], source: str | None = None
         ) -> tuple[tuple[int, ...], dict[str, str]]:
    """construct's parameters -> (index into ORDER of each, in construct's order; param -> our
    name). A parameter that nothing binds is an InputError naming it (one with a default value
    after every bound one is left to its default)."""
    try:
        params = list(inspect.signature(type(cell).construct).parameters.values())[1:]
    except (TypeError, ValueError):
        raise InputError(f"For 'objective.call' = '{form}', objdebug binds construct's parameters "
                         f"by name, but the signature of {type(cell).__name__}.construct cannot be "
                         "read", source=source) from None
    theirs = {v: k for k, v in renames.items()}
    ours = [n for n in ORDER if form == "policy" or n != "logits"]
    picks, names, skipped = [], {}, None
    for p in params:
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        name = theirs.get(p.name) or next((n for n in ours if p.name in NAMES[n]), None)
        # a parameter nothing binds: an error, unless it has a default and none bound follows it
        if name is None or name not in ours:
            if p.default is inspect.Parameter.empty:
                skipped = p
                break
            skipped = skipped or p
            continue
        if skipped is not None:
            break
        picks.append(ORDER.index(name))
        names[p.name] = name
    else:
        skipped = None
    if skipped is not None:
        known = sorted({a for n in ours for a in NAMES[n]})
        raise InputError(f"For 'objective.call' = '{form}', every parameter of "
                         f"{type(cell).__name__}.construct must bind to one of {known} (or be "
                         f"renamed in [policy] inputs), but got '{skipped.name}'.", source=source)
    if form == "policy" and "logits" not in names.values():
        raise InputError(f"For 'objective.call' = 'policy', {type(cell).__name__}.construct must take "
                         "the logits (a parameter named 'logits', or renamed in [policy] inputs)",
                         source=source)
    return tuple(picks), names


def _advantages(ctx: Context, groups: list[list[Completion]]) -> np.ndarray:
    """float64[N]: each completion's advantage, per group, by `[policy] group_advantages`."""
    from objdebug.engine.target import import_factory

    how = ctx.config.policy.group_advantages
    fn = import_factory(how, "policy.group_advantages", ctx.config.base_dir) if ":" in how else None
    sizes = {len(g) for g in groups}
    if len(sizes) == 1:
        adv = group_advantages(np.array([[c.reward for c in g] for g in groups]), how, fn)
        return adv.reshape(-1)
    return np.concatenate([group_advantages(np.array([[c.reward for c in g]]), how, fn).reshape(-1)
                           for g in groups])


def _build(ctx: Context) -> Session:
    from objdebug.engine.target import _call_factory, load_checkpoint_strict

    cfg = ctx.config
    spec = cfg.policy_objective
    enc = encoder(ctx)
    limit = position_limit.limit(ctx)
    groups = read_rollouts(cfg.data.rollouts, enc, cfg.data.eos_id, limit, position_limit.source(ctx))
    rows = [c for g in groups for c in g]
    advantages = _advantages(ctx, groups)
    bsz = ctx.engine.batch_size
    length = ctx.engine.bucket(max(max(c.length for c in rows), 2))
    batches = []
    for start in range(0, len(rows), bsz):
        real = rows[start:start + bsz]
        filled = [start + (k % len(real)) for k in range(bsz)]
        items = [rows[i] for i in filled]
        ids = np.full((bsz, length), cfg.data.pad_id, np.int32)
        mask = np.zeros((bsz, length), bool)
        for b, c in enumerate(items):
            seq = c.prompt + c.completion
            ids[b, :len(seq)] = seq
            mask[b, len(c.prompt):len(seq)] = True
        model_ids, _ = pack_for(cfg, [Sample(id=str(i), prompt=list(c.prompt), response=list(c.completion))
                                      for i, c in enumerate(items)], length, side="right")
        batches.append(RolloutBatch(real, start, ids, model_ids, mask,
                                    advantages[filled].astype(np.float64), filled))
    if spec.call == "policy":
        loss = _call_factory(spec.factory, spec.kwargs, "objective", cfg.base_dir)
        loss.set_train(False)
    else:  # "policy-model": the Cell owns the policy (a copy: its attribute renames parameters)
        from objdebug.stages.policy.cells import ProbedLogits

        temperature = float(ctx.profile.section("policy")["probe_temperature"])
        probed = ProbedLogits(_copy_model(ctx, ctx.target.model), bsz, length, int(ctx.engine.vocab_size()),
                              temperature)
        loss = build_policy_model(ctx, probed)
    picks, names = bind(loss, spec.call, cfg.policy.inputs, cfg.source)
    reference = None
    ref_ckpt = cfg.reference.checkpoint if cfg.reference is not None else None
    if ref_ckpt and ref_ckpt != cfg.model.checkpoint:
        reference = _call_factory(cfg.model.factory, cfg.model.kwargs, "model", cfg.base_dir)
        load_checkpoint_strict(reference, ref_ckpt, "reference")
    cache = {"reference_checkpoint": ref_ckpt}
    if spec.call == "policy-model":
        cache["probe"] = probed
    return Session(ctx=ctx, spec=spec, policy=cfg.policy, groups=groups, rows=rows, advantages=advantages,
                   batches=batches, length=length, picks=picks, bound_names=names, loss=loss,
                   reference_model=reference, cache=cache)


def _copy_model(ctx: Context, model: Any) -> Any:
    """A second instance of the model with the same parameter values, called as the target's is."""
    import mindspore as ms

    from objdebug.engine import precision
    from objdebug.engine.cells import wrap_like
    from objdebug.engine.target import _call_factory

    cfg = ctx.config
    copy = _call_factory(cfg.model.factory, cfg.model.kwargs, "model", cfg.base_dir)
    for d, src in zip(copy.get_parameters(), model.get_parameters()):
        d.set_data(ms.Tensor(src.data.asnumpy()))
    copy.set_train(False)
    return precision.as_trained(wrap_like(ctx.target, copy), cfg, "model")


def build_policy_model(ctx: Context, model: Any) -> Any:
    """The "policy-model" factory called with policy= (the model) and the declared kwargs."""
    from objdebug.engine.target import import_factory

    spec = ctx.config.policy_objective
    factory = import_factory(spec.factory, "objective", ctx.config.base_dir)
    try:
        cell = factory(policy=model, **spec.kwargs)
    except Exception as exc:
        raise InputError(f"For 'objective.factory', calling '{spec.factory}' with policy= and kwargs "
                         f"{spec.kwargs} failed: {type(exc).__name__}: {exc}") from None
    cell.set_train(False)
    return cell
