"""The Cells through which objdebug calls a policy-gradient objective (the `policy` stage).

Form "policy" (split): the user's loss Cell takes the logits and the rollout arrays, bound by
construct's parameter NAMES (core/policy_config.py NAMES: our names and their aliases). objdebug
calls `PolicyLossGrad`, an objective-only graph (`policy.objective`: it holds no model): the loss and
its derivative w.r.t. the logits (from which the stage reads each token's weight, and which the
model's shared VJP turns into the parameter gradient); `PolicyLossVariants` (`policy.settings`)
the loss with its setting variants, forward only, for the settings check.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from objdebug.engine import cache_proof

PROBE_NAME = "objdebug_policy_logit_probe"

# the order in which objdebug hands the arrays to BoundLoss (our names)
ORDER = ("logits", "input_ids", "completion_mask", "advantages", "old_per_token_logps",
         "ref_per_token_logps")


def as_loss(r):
    """The objective's result (a loss, or a tuple whose first element is the loss) -> float32 scalar."""
    if isinstance(r, (tuple, list)):
        r = r[0]
    return ops.cast(ops.reshape(r, ()), ms.float32)


class BoundLoss(nn.Cell):
    """The user's loss with its parameters bound by name: (the six arrays in ORDER) -> loss.

    `picks`: for each of construct's parameters, in its order, the index into ORDER of the array
    it takes (read from its signature by the session)."""

    def __init__(self, loss, picks):
        super().__init__(auto_prefix=False)
        self.loss = loss
        self.picks = tuple(int(i) for i in picks)

    def construct(self, logits, input_ids, completion_mask, advantages, old, ref):
        pool = (logits, input_ids, completion_mask, advantages, old, ref)
        args = ()
        for i in self.picks:
            args = args + (pool[i],)
        return as_loss(self.loss(*args))


class PolicyLossGrad(nn.Cell):
    """`policy.objective`: (the six arrays) -> (loss, d loss / d logits)."""

    def __init__(self, bound):
        super().__init__(auto_prefix=False)
        self.bound = bound
        self.grad_fn = cache_proof.value_and_grad(self, self.bound, 0, None)

    def proof_gradients(self, out):
        """Where the output holds the gradient value_and_grad returns (engine/cache_proof.py)."""
        return out[1]

    def construct(self, logits, input_ids, completion_mask, advantages, old, ref):
        return self.grad_fn(logits, input_ids, completion_mask, advantages, old, ref)


class PolicyLossVariants(nn.Cell):
    """`policy.settings`: the loss and its setting variants (the objective rebuilt with one setting
    changed) on the same arrays, forward only -> (loss, the variants' losses [n]). Its own small
    graph, compiled only when the settings check (OBJ831) runs."""

    def __init__(self, bound, variants=()):
        super().__init__(auto_prefix=False)
        self.bound = bound
        self.variants = nn.CellList(list(variants))
        self.n_variants = len(variants)

    def construct(self, logits, input_ids, completion_mask, advantages, old, ref):
        loss = self.bound(logits, input_ids, completion_mask, advantages, old, ref)
        outs = ()
        for v in self.variants:
            outs = outs + (ops.reshape(v(logits, input_ids, completion_mask, advantages, old, ref), (1,)),)
        others = ops.concat(outs) if self.n_variants else ops.zeros((1,), ms.float32)
        return loss, others


class ProbedLogits(nn.Cell):
    """Form "policy-model": the policy the user's Cell owns, its logits at the probe temperature
    plus a zero Parameter `probe` [B, T, V]: the gradient w.r.t. the probe is d loss / d logits
    exactly, read from the Cell's one graph (the Cell may call the policy on input_ids[:, :-1], as
    MindRLHF's GRPOModel does: the probe is cut to the logits' rows and length)."""

    def __init__(self, model, batch: int, length: int, vocab: int, temperature: float):
        super().__init__(auto_prefix=False)  # keep the model's parameter names
        self.model = model
        self.inv_temperature = 1.0 / float(temperature)
        self.probe = ms.Parameter(ms.Tensor(np.zeros((batch, length, vocab), np.float32)), name=PROBE_NAME)

    def construct(self, input_ids, *args):
        logits = self.model(input_ids).astype(ms.float32) * self.inv_temperature
        return logits + self.probe[:logits.shape[0], :logits.shape[1]]


class PolicyModelGrad(nn.Cell):
    """`policy.model_objective`: the user's Cell (which owns the probed policy) bound by name ->
    (loss, d loss / d probe = d loss / d logits [B, T, V]). The one graph of this form that holds
    the model."""

    def __init__(self, bound, probe):
        super().__init__(auto_prefix=False)
        self.bound = bound
        self.grad_fn = cache_proof.value_and_grad(self, self.bound, None, ms.ParameterTuple([probe]))

    def proof_gradients(self, out):
        """Where the output holds the gradient value_and_grad returns (engine/cache_proof.py)."""
        return (out[1],)

    def construct(self, input_ids, completion_mask, advantages, old, ref):
        loss, grads = self.grad_fn(input_ids, input_ids, completion_mask, advantages, old, ref)
        return loss, grads[0]
