"""Shared measurements of the policy-gradient checks: the probe constants, the on-policy base point
(`_base`, cached per batch) and the tokens that must carry a policy gradient (`_informative`:
scorable tokens of the completions the loss keeps; `_dropped`: truncated ones it drops on purpose).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.stages.policy.session import read_token_gradients


# the KL estimators at delta = log pi - log ref (per token): the loss ratios L(d) / L(1) identify them
ESTIMATORS = {
    "k1": lambda d: d,
    "k2": lambda d: 0.5 * d * d,
    "k3": lambda d: math.exp(-d) + d - 1.0,
    "k3 with policy and reference exchanged": lambda d: math.exp(d) - d - 1.0,
}
DELTAS = (1.0, -1.0, 0.5, -0.5)
RATIO_LOW, RATIO_HIGH = 0.25, 4.0  # the clip probes: far outside any usual clip range
RATIO_DUAL = 2.0  # beyond the clip, below a dual clip's bound (> 1 + epsilon; verl's default 3)
SETTING_RATIOS = (0.6, 1.5, 8.0)  # the settings probe's ratios, token by token


def _base(s, batch) -> dict[str, Any]:
    """The on-policy, policy == reference point at advantages 0 and at the real ones (cached):
    their token gradients, and the policy term's alone (the difference)."""
    key = ("base", batch.start)
    if key not in s.cache:
        logits = s.probe_logits(batch)
        zero = s.point(batch, logits, adv=np.zeros(len(batch.ids)))
        real = s.point(batch, logits)
        gz = read_token_gradients(zero["dlogits"], logits, batch.ids, batch.mask)
        gr = read_token_gradients(real["dlogits"], logits, batch.ids, batch.mask)
        pol = read_token_gradients(real["dlogits"].astype(np.float64) - zero["dlogits"], logits,
                                   batch.ids, batch.mask)
        s.cache[key] = {"logits": logits, "zero": zero, "real": real, "gz": gz, "gr": gr, "pol": pol}
    return s.cache[key]


def _scorable(s, batch, th) -> np.ndarray:
    """bool[B, T]: completion tokens of real rows whose advantage is not ~0 (each must carry a
    policy gradient, unless its completion is dropped on purpose: `_dropped`)."""
    eps = float(th["advantage_epsilon"])
    rows = np.zeros(len(batch.ids), bool)
    rows[:batch.n] = np.abs(batch.advantages[:batch.n]) > eps
    # a token the model is certain of (p(token) = 1 in float32) carries no gradient in any loss
    unsure = 1.0 - np.exp(s.logps(batch, _base(s, batch)["logits"])) >= float(th["certainty_floor"])
    return batch.mask & rows[:, None] & unsure


def _truncated(s, batch) -> np.ndarray:
    """bool[B]: rows whose completion holds no `[data] eos_id` (cut at the sampler's max length);
    none when no EOS is declared."""
    eos = getattr(s.ctx.config.data, "eos_id", None)
    if eos is None:
        return np.zeros(len(batch.ids), bool)
    comps = [s.rows[k].completion for k in batch.filled[:len(batch.ids)]]
    return np.array([eos not in c for c in comps], bool)


def _dropped(s, batch, th) -> np.ndarray:
    """bool[B]: the truncated completions the loss drops on purpose (DAPO's overlong filtering,
    TRL's `mask_truncated_completions`): every truncated row with a scorable token carries no
    policy gradient at all, while the other rows do; then every truncated row is dropped (those
    with a zero advantage too: the filter is the loss's). Otherwise none (a missing gradient is
    OBJ825's)."""
    key = ("dropped", batch.start)
    if key not in s.cache:
        trunc = _truncated(s, batch)
        info = _scorable(s, batch, th)
        g = _base(s, batch)["pol"]["g"]
        scale = float(np.max(np.abs(g[info]))) if info.any() else 0.0
        carries = np.abs(g) > float(th["gradient_floor"]) * max(scale, 1e-30)
        tested = trunc & info.any(1)
        silent = ~(carries & info).any(1)
        kept = ~trunc & info.any(1)
        on = bool(tested.any() and silent[tested].all() and (~silent[kept]).any())
        s.cache[key] = trunc if on else np.zeros(len(batch.ids), bool)
    return s.cache[key]


def _informative(s, batch, th) -> np.ndarray:
    """bool[B, T]: the scorable tokens of the completions the loss keeps (they must carry a policy
    gradient)."""
    return _scorable(s, batch, th) & ~_dropped(s, batch, th)[:, None]
