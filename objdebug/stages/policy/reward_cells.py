"""The Cell through which objdebug calls a reward model's loss (`[objective] call = "reward"`).

The user's loss takes two float32[B] vectors, (chosen_rewards, rejected_rewards) (pairwise) or
(rewards, scores) (regression), in the order its construct names them (`order`: objdebug's
(a, b) mapped onto construct's positions), and returns the loss or a tuple whose first element
is the loss. `RewardLosses` is the one small graph of the reward checks (`reward.objective`): the
loss, its derivative w.r.t. both inputs (the rewards' cotangent for the model's shared VJP) and
the loss of every setting variant (each numeric kwarg changed, OBJ856) on the same inputs. It
holds no model: the rewards come from the run's `model.forward` graph.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops


class LossOnRewards(nn.Cell):
    """(a, b) float32[B] -> the user's loss, a float32 scalar; `swap`: construct takes (b, a)."""

    def __init__(self, loss, swap: bool = False):
        super().__init__(auto_prefix=False)
        self.loss = loss
        self.swap = swap

    def construct(self, a, b):
        if self.swap:
            out = self.loss(b, a)
        else:
            out = self.loss(a, b)
        if isinstance(out, tuple):
            out = out[0]
        return ops.cast(ops.reshape(out, ()), ms.float32)


class RewardLosses(nn.Cell):
    """(a, b) float32[B] -> (loss, dloss/da, dloss/db, the variants' losses float32[n or 1])."""

    def __init__(self, loss, variants=(), swap: bool = False):
        super().__init__(auto_prefix=False)
        self.loss = LossOnRewards(loss, swap)
        self.variants = nn.CellList([LossOnRewards(v, swap) for v in variants])
        self.n_variants = len(variants)
        self.grad_fn = ms.value_and_grad(self.loss, (0, 1))

    def construct(self, a, b):
        loss, (da, db) = self.grad_fn(a, b)
        outs = ()
        for v in self.variants:
            outs = outs + (ops.reshape(v(a, b), (1,)),)
        others = ops.concat(outs) if self.n_variants else ops.zeros((1,), ms.float32)
        return loss, da, db, others
