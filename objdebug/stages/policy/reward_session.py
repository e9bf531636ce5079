"""Host side of the reward checks (`[objective] call = "reward"`): rows, rewards, the loss graph.

`session(ctx)` (cached per run) builds, once:

- the loss's form from construct's parameter names: "pairwise" (chosen_rewards, rejected_rewards)
  or "regression" (rewards, scores), in either order; anything else is an InputError (exit 2);
- the sequences: the pairs of `[data] preference` (chosen and rejected answers, the pairwise
  form) and the scored rows of `[data] scores` (the regression form, and the agreement with
  human scores for both), packed as every batch is (`data.pack_for`: padding side, mask marks);
- the rewards: the model's output through the run's one forward graph, `model.forward`; a model
  that returns [B] is used as it is, one that returns [B, T] is read at each row's last real token
  (`[reward] position = "last"`) or its first (`"first"`);
- the loss graph `reward.objective` (reward_cells.RewardLosses): the loss, its derivative w.r.t.
  the rewards and the setting variants, on [B] vectors. The parameter gradient is that derivative
  placed where the reward was read, through the model's shared VJP (`model.vjp`): the reward
  checks compile no graph that holds the model.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from objdebug.core.errors import InputError
from objdebug.engine.data import Sample, pack_for
from objdebug.engine.signature import parameters
from objdebug.pipeline.context import Context
from objdebug.pipeline.datasets import preference_rows, score_rows

PAIRWISE, REGRESSION = "pairwise", "regression"


def loss_form(loss: Any, factory: str, source: str | None = None) -> tuple[str, bool]:
    """(form, swap) from construct's two parameter names: swap when construct takes objdebug's
    (a, b) = (chosen, rejected) / (rewards, scores) as (b, a)."""
    names = parameters(loss)
    if names is None or len(names) != 2:
        raise InputError(f"For 'objective.factory' = '{factory}' with call = \"reward\", the loss's "
                         "construct must take two parameters, (chosen_rewards, rejected_rewards) or "
                         f"(rewards, scores), but got {names if names is not None else 'an unreadable signature'}.",
                         source=source)
    kinds = [_kind(n) for n in names]
    if sorted(k or "" for k in kinds) == ["chosen", "rejected"]:
        return PAIRWISE, kinds[0] == "rejected"
    if sorted(k or "" for k in kinds) == ["rewards", "scores"]:
        return REGRESSION, kinds[0] == "scores"
    raise InputError(f"For 'objective.factory' = '{factory}' with call = \"reward\", construct's "
                     "parameters must name a pairwise loss (chosen_rewards, rejected_rewards) or a "
                     f"regression loss (rewards, scores), but got ({', '.join(names)}): rename them.",
                     source=source)


# construct's parameter names, word by word (split at "_" and case): what each word binds
_WORDS = (("chosen", {"chosen", "win", "winner", "winning", "preferred", "pos", "positive", "good"}),
          ("rejected", {"rejected", "reject", "lose", "loser", "losing", "dispreferred", "neg", "negative", "bad"}),
          ("scores", {"score", "scores", "target", "targets", "label", "labels"}),
          ("rewards", {"reward", "rewards", "pred", "preds", "prediction", "predictions", "value", "values"}))


def _kind(name: str) -> str | None:
    words = {w.lower() for w in re.split(r"_+|(?<=[a-z])(?=[A-Z])", name) if w}
    for kind, known in _WORDS:  # chosen / rejected first: "chosen_rewards" is a chosen reward
        if words & known:
            return kind
    return None


@dataclass
class Seqs:
    """Sequences whose reward the checks read: a Sample each (prompt + answer, framed)."""

    samples: list[Sample]

    def __len__(self) -> int:
        return len(self.samples)


@dataclass
class Session:
    ctx: Context
    form: str
    swap: bool
    loss: Any
    pairs: list[dict[str, Any]]
    scored: list[dict[str, Any]]
    length: int
    cache: dict[str, Any] = field(default_factory=dict)
    # the loss's graph; a second session on the same engine (a test's loss-only twin) names its own
    graph: str = "reward.objective"

    @property
    def position(self) -> str:
        return self.ctx.config.reward.position

    @property
    def batch_size(self) -> int:
        return self.ctx.engine.batch_size

    # ------------------------------------------------------------------ sequences and rewards
    def chosen(self) -> Seqs:
        return Seqs([Sample(p["id"], list(p["prompt"]), list(p["chosen"])) for p in self.pairs])

    def rejected(self) -> Seqs:
        return Seqs([Sample(p["id"], list(p["prompt"]), list(p["rejected"])) for p in self.pairs])

    def scored_seqs(self) -> Seqs:
        return Seqs([r["sample"] for r in self.scored])

    def sequences(self) -> Seqs:
        """What the reading checks measure: the form's own rows (both answers of each pair, or
        the scored rows)."""
        if self.form == PAIRWISE:
            return Seqs(self.chosen().samples + self.rejected().samples)
        return self.scored_seqs()

    def chunks(self, n: int) -> list[tuple[int, int]]:
        return [(s, min(s + self.batch_size, n)) for s in range(0, n, self.batch_size)]

    def pack(self, samples: list[Sample], length: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids int32[B, T], each row's real length) of a batch, filled with copies of its first row."""
        filled = samples + [samples[0]] * (self.batch_size - len(samples))
        ids, _ = pack_for(self.ctx.config, filled, length)
        return ids, np.array([s.length for s in filled], np.int64)

    def read_index(self, n: np.ndarray, length: int) -> np.ndarray:
        """The position each row's reward is read at, for a model that returns [B, T]."""
        left = getattr(self.ctx.config.data, "padding_side", "right") == "left"
        if self.position == "last":
            return np.full_like(n, length - 1) if left else n - 1
        return length - n if left else np.zeros_like(n)

    def output(self, ids: np.ndarray) -> np.ndarray:
        import mindspore as ms

        out = self.ctx.engine.forward(ms.Tensor(ids, ms.int32))
        if out.dtype == ms.bfloat16:  # numpy has no bfloat16
            out = out.astype(ms.float32)
        return out.asnumpy()

    def read(self, out: np.ndarray, n: np.ndarray, length: int) -> np.ndarray:
        """float64[B] rewards from the model's output [B] or [B, T]."""
        out = np.asarray(out, np.float64)
        if out.ndim == 1:
            return out
        return out[np.arange(len(out)), self.read_index(n, length)]

    def rewards(self, seqs: Seqs, extra: int = 0, drop_last: bool = False) -> np.ndarray:
        """float64[N]: the reward of every sequence, padded to the session's length + `extra`;
        `drop_last`: each sequence without its last token."""
        samples = [_without_last(s) for s in seqs.samples] if drop_last else seqs.samples
        length = self.length + extra
        out = []
        for s, e in self.chunks(len(samples)):
            ids, n = self.pack(samples[s:e], length)
            out.append(self.read(self.output(ids), n, length)[:e - s])
        return np.concatenate(out) if out else np.zeros(0)

    def real_inputs(self) -> tuple[np.ndarray, np.ndarray]:
        """(a, b) float64[N]: (chosen, rejected) rewards of every pair, or (rewards, scores)."""
        if "real" not in self.cache:
            if self.form == PAIRWISE:
                self.cache["real"] = (self.rewards(self.chosen()), self.rewards(self.rejected()))
            else:
                self.cache["real"] = (self.rewards(self.scored_seqs()),
                                      np.array([r["score"] for r in self.scored], np.float64))
        return self.cache["real"]

    def score_rewards(self) -> np.ndarray:
        if "scored" not in self.cache:
            self.cache["scored"] = (self.real_inputs()[0] if self.form == REGRESSION
                                    else self.rewards(self.scored_seqs()))
        return self.cache["scored"]

    # ------------------------------------------------------------------ the loss
    def setting_keys(self) -> list[str]:
        """Float kwargs, and the profile's named settings even when written as integers."""
        named = set(self.ctx.profile.section("reward")["settings"])
        return [k for k, v in self.ctx.config.objective.kwargs.items() if not isinstance(v, bool)
                and (isinstance(v, float) or (k in named and isinstance(v, int)))]

    def setting(self, name: str, default: float = 0.0) -> float:
        value = self.ctx.config.objective.kwargs.get(name, getattr(self.loss, name, default))
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default

    def changed_kwargs(self, key: str) -> tuple[float, float, dict[str, Any]]:
        """(old, new, the kwargs with `key` doubled, or 0.1 from 0)."""
        kwargs = self.ctx.config.objective.kwargs
        value = kwargs[key]
        old = float(value)
        new = old * 2.0 if old != 0 else 0.1
        return old, new, dict(kwargs, **{key: type(value)(new) if isinstance(value, float) else new})

    def losses_cell(self) -> Any:
        from objdebug.engine.target import _call_factory
        from objdebug.stages.policy.reward_cells import RewardLosses

        def build():
            variants, keys, errors = [], [], {}
            spec = self.ctx.config.objective
            for key in self.setting_keys():
                try:  # a variant the factory refuses fails the settings check only (ERROR there)
                    v = _call_factory(spec.factory, self.changed_kwargs(key)[2], "objective",
                                      self.ctx.config.base_dir)
                except Exception as exc:  # noqa: BLE001
                    errors[key] = exc
                    continue
                v.set_train(False)
                variants.append(v)
                keys.append(key)
            self.cache["variant_keys"], self.cache["variant_errors"] = keys, errors
            return RewardLosses(self.loss, variants, self.swap)
        return self.ctx.engine.cell(self.graph, build)

    def evaluate(self, a: np.ndarray, b: np.ndarray, setting: str | None = None) -> dict[str, Any]:
        """The user's loss on (a, b) [N], batch by batch (fill rows copy the batch's first) ->
        {losses [batches], da [N], db [N]}; `setting`: the losses of that setting's variant."""
        import mindspore as ms

        cell = self.losses_cell()
        variant = None
        if setting is not None:
            if setting in self.cache["variant_errors"]:
                raise self.cache["variant_errors"][setting]
            variant = self.cache["variant_keys"].index(setting)
        losses, das, dbs = [], [], []
        for s, e in self.chunks(len(a)):
            rows = list(range(s, e)) + [s] * (self.batch_size - (e - s))
            args = [ms.Tensor(np.asarray(x)[rows].astype(np.float32)) for x in (a, b)]
            loss, da, db, others = self.ctx.engine.call(self.graph, cell, *args)
            losses.append(float((others.asnumpy()[variant] if variant is not None else loss.asnumpy())))
            das.append(da.asnumpy().astype(np.float64)[:e - s])
            dbs.append(db.asnumpy().astype(np.float64)[:e - s])
        return {"losses": np.array(losses), "da": np.concatenate(das), "db": np.concatenate(dbs)}

    # ------------------------------------------------------------------ gradient and step
    def step_batch(self) -> dict[str, Any]:
        """The first batch of the form's rows: the sequences whose rewards the loss takes."""
        e = min(self.batch_size, len(self.pairs) if self.form == PAIRWISE else len(self.scored))
        if self.form == PAIRWISE:
            return {"n": e, "sides": [self.chosen().samples[:e], self.rejected().samples[:e]]}
        return {"n": e, "sides": [self.scored_seqs().samples[:e]],
                "scores": np.array([r["score"] for r in self.scored[:e]], np.float64)}

    def batch_rewards(self, batch: dict[str, Any]) -> list[np.ndarray]:
        out = []
        for side in batch["sides"]:
            ids, n = self.pack(side, self.length)
            out.append(self.read(self.output(ids), n, self.length))
        return out

    def gradient(self, batch: dict[str, Any]) -> dict[str, Any]:
        """dloss/dparams on the batch: the loss's derivative w.r.t. the rewards (its own graph),
        placed where each reward was read, through the model's VJP (`model.vjp`)."""
        import mindspore as ms

        from objdebug.engine.gradients import model_vjp

        engine, target = self.ctx.engine, self.ctx.target
        rewards = self.batch_rewards(batch)
        second = rewards[1] if self.form == PAIRWISE else _filled(batch["scores"], self.batch_size)
        loss, da, db, _ = engine.call(self.graph, self.losses_cell(),
                                      ms.Tensor(rewards[0].astype(np.float32)),
                                      ms.Tensor(second.astype(np.float32)))
        cots = [da.asnumpy().astype(np.float64), db.asnumpy().astype(np.float64)]
        params = list(target.model.trainable_params())
        total = [np.zeros(p.shape, np.float64) for p in params]
        for side, d in zip(batch["sides"], cots):
            ids, n = self.pack(side, self.length)
            out = self.output(ids)
            if out.ndim == 1:
                cot = d.astype(out.dtype)
            else:
                cot = np.zeros(out.shape, out.dtype)
                cot[np.arange(len(cot)), self.read_index(n, self.length)] = d
            _, grads = model_vjp(engine, target, ms.Tensor(ids, ms.int32), ms.Tensor(cot))
            for k, g in enumerate(grads):
                total[k] += g.asnumpy().astype(np.float64)
        return {"loss": float(loss.asnumpy()), "params": params, "grads": total, "rewards": rewards,
                "d_rewards": cots[:len(batch["sides"])]}

    @contextmanager
    def stepped(self, params: list, grads: list[np.ndarray], lr: float):
        """The model's parameters moved by -lr * grads inside the block, restored exactly after."""
        import mindspore as ms

        saved = [p.data.asnumpy().copy() for p in params]
        try:
            for p, x, g in zip(params, saved, grads):
                p.set_data(ms.Tensor((x.astype(np.float64) - lr * g).astype(x.dtype)))
            yield
        finally:
            for p, x in zip(params, saved):
                p.set_data(ms.Tensor(x))


def _filled(values: np.ndarray, batch: int) -> np.ndarray:
    values = np.asarray(values)
    return np.concatenate([values, np.repeat(values[:1], batch - len(values))])


def _without_last(s: Sample) -> Sample:
    """The sequence without its last token (the answer's, else the prompt's)."""
    if s.response:
        return replace(s, response=list(s.response[:-1]))
    return replace(s, prompt=list(s.prompt[:-1]))


# --------------------------------------------------------------------------- building
def session(ctx: Context) -> Session:
    return ctx.provide(session, lambda: _build(ctx))


def _build(ctx: Context) -> Session:
    cfg = ctx.config
    loss = ctx.target.objective
    form, swap = loss_form(loss, cfg.objective.factory, cfg.source)
    pairs = preference_rows(ctx) if cfg.data.preference else []
    scored = score_rows(ctx) if cfg.data.scores else []
    if form == PAIRWISE and not pairs:
        raise InputError("For 'data.preference', a pairwise reward loss (chosen_rewards, "
                         "rejected_rewards) needs preference pairs, but none is set.", source=cfg.source)
    if form == REGRESSION and not scored:
        raise InputError("For 'data.scores', a regression reward loss (rewards, scores) needs scored "
                         "rows, but none is set.", source=cfg.source)
    lengths = [len(p["prompt"]) + max(len(p["chosen"]), len(p["rejected"])) for p in pairs]
    lengths += [r["sample"].length for r in scored]
    empty = [p["id"] for p in pairs if not p["prompt"] and not (p["chosen"] and p["rejected"])]
    if empty:
        raise InputError(f"For 'data.preference', every answer of a reward pair needs a token, but "
                         f"pair '{empty[0]}' has an empty answer and no prompt.", source=cfg.data.preference)
    return Session(ctx=ctx, form=form, swap=swap, loss=loss, pairs=pairs, scored=scored,
                   length=ctx.engine.bucket(max(lengths)))
