"""The Cells through which objdebug calls a preference objective (the `preference` stage).

Two calling forms (docs/config.md):

- "preference": the user's loss Cell takes (policy_chosen_logps, policy_rejected_logps,
  reference_chosen_logps, reference_rejected_logps), float[B] each, and returns the loss or
  (loss, chosen_rewards, rejected_rewards). objdebug computes the sequence log-probs from the
  model's logits over the response tokens (labels != label_pad_id), summed or averaged as declared.
- "preference-pairs": the user's Cell owns policy and reference (objdebug passes both to its
  factory) and takes (chosen_ids, chosen_labels, rejected_ids, rejected_labels).

The policy is wrapped in `ProbedPolicy`, which scales its logits by (1 + probe), a zero-valued
Parameter of shape [B, T, 1]: the gradient w.r.t. the probe at position t is sum_v dL/dx_tv * x_tv,
exactly 0 where the objective does not use that position's logits and non-zero (almost surely)
where it does, even inside a Cell that calls the policy itself. So masking is measured in both
forms from one backward pass, at the cost of B x T numbers (an additive [B, T, V] probe would
double the logits' memory). Every graph is built with `engine.cell` and called with `engine.call`.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, nn, ops

from objdebug.engine import cache_proof

PROBE_NAME = "objdebug_logit_probe"


def sequence_logps(logits, labels, label_pad_id):
    """(sum float32[B], count float32[B]) of log p(label) over positions with label != label_pad_id."""
    x = logits.astype(ms.float32)
    logp = x - ops.logsumexp(x, -1, True)
    mask = labels != label_pad_id
    safe = ops.where(mask, labels, ops.zeros_like(labels))
    picked = ops.gather_d(logp, 2, ops.expand_dims(safe, -1)).squeeze(-1)
    picked = ops.where(mask, picked, ops.zeros_like(picked))
    return picked.sum(-1), mask.astype(ms.float32).sum(-1)


def reduce_logps(total, count, mean):
    """The declared reduction; a sequence with no scored token gives 0 (never NaN)."""
    if mean:
        return total / ops.maximum(count, ops.ones_like(count))
    return total


def as_preference_outputs(r):
    """The loss's result -> (loss float32 scalar, chosen_rewards [B], rejected_rewards [B]);
    rewards are NaN when the loss returns only a loss."""
    if isinstance(r, tuple):
        loss = ops.cast(ops.reshape(r[0], ()), ms.float32)
        return loss, ops.cast(ops.reshape(r[1], (-1,)), ms.float32), ops.cast(ops.reshape(r[2], (-1,)), ms.float32)
    loss = ops.cast(ops.reshape(r, ()), ms.float32)
    nan = ops.fill(ms.float32, (1,), float("nan"))
    return loss, nan, nan


class ProbedPolicy(nn.Cell):
    """The policy model with its logits scaled by (1 + a zero probe) (see the module docstring)."""

    def __init__(self, model, batch: int, length: int):
        super().__init__(auto_prefix=False)  # keep the model's parameter names
        self.model = model
        self.batch = batch
        self.length = length
        self.probe = Parameter(ms.Tensor(np.zeros((batch, length, 1), np.float32)), name=PROBE_NAME)

    def construct(self, input_ids):
        logits = self.model(input_ids)
        if logits.shape[1] != self.length:
            return logits  # another length: no probe (masking is then not measured)
        if logits.shape[0] == self.batch:
            return logits * (1.0 + self.probe)
        if logits.shape[0] == 2 * self.batch:
            # chosen and rejected concatenated along the batch: both halves share the probe
            return logits * (1.0 + ops.concat((self.probe, self.probe), 0))
        return logits


class LossOnLogps(nn.Cell):
    """Form "preference": the user's loss alone, (pc, pr, rc, rr) float32[B] -> (loss, cr, rj)."""

    def __init__(self, loss):
        super().__init__(auto_prefix=False)
        self.loss = loss

    def construct(self, pc, pr, rc, rr):
        return as_preference_outputs(self.loss(pc, pr, rc, rr))


class PreferenceLosses(nn.Cell):
    """Form "preference": the user's loss and its setting variants on the same four log-prob
    vectors, in one graph (`preference.objective`): (pc, pr, rc, rr) float32[B] -> (loss, cr, rj,
    dloss/dpc, dloss/dpr, the variants' losses float32[n]).

    The derivative w.r.t. the policy's log-probs is what the policy's parameter gradient needs
    (session.Session.gradient: through the model's VJP); the variants (each numeric setting
    changed, the settings check OBJ811) are tiny graphs of the same [B] inputs, so they ride
    along instead of compiling graphs of their own."""

    def __init__(self, loss, variants=()):
        super().__init__(auto_prefix=False)
        self.loss = LossOnLogps(loss)
        self.variants = nn.CellList([LossOnLogps(v) for v in variants])
        self.n_variants = len(variants)
        self.grad_fn = cache_proof.value_and_grad(self, self.loss, (0, 1), None, has_aux=True)

    def proof_gradients(self, out):
        """Where the output holds the gradient value_and_grad returns (engine/cache_proof.py)."""
        return out[3], out[4]

    def construct(self, pc, pr, rc, rr):
        (loss, cr, rj), (dpc, dpr) = self.grad_fn(pc, pr, rc, rr)
        outs = ()
        for v in self.variants:
            outs = outs + (ops.reshape(v(pc, pr, rc, rr)[0], (1,)),)
        others = ops.concat(outs) if self.n_variants else ops.zeros((1,), ms.float32)
        return loss, cr, rj, dpc, dpr, others


class LogpsObjective(nn.Cell):
    """Form "preference": (c_ids, c_labels, r_ids, r_labels, ref_c, ref_r) -> (loss, cr, rj).

    The policy log-probs are computed here (through the probed policy, so they are differentiated);
    the reference log-probs come in as inputs, computed by a separate graph without gradient.
    """

    def __init__(self, policy, loss, label_pad_id: int, mean: bool):
        super().__init__(auto_prefix=False)
        self.policy = policy
        self.loss = loss
        self.label_pad_id = label_pad_id
        self.mean = mean

    def construct(self, c_ids, c_labels, r_ids, r_labels, ref_c, ref_r):
        cs, cn = sequence_logps(self.policy(c_ids), c_labels, self.label_pad_id)
        rs, rn = sequence_logps(self.policy(r_ids), r_labels, self.label_pad_id)
        pc = reduce_logps(cs, cn, self.mean)
        pr = reduce_logps(rs, rn, self.mean)
        return as_preference_outputs(self.loss(pc, pr, ref_c, ref_r))


class PairsObjective(nn.Cell):
    """Form "preference-pairs": the user's Cell on (c_ids, c_labels, r_ids, r_labels) -> (loss, cr, rj).

    The two reference inputs are accepted (and unused) so both forms share one signature.
    """

    def __init__(self, objective):
        super().__init__(auto_prefix=False)
        self.objective = objective

    def construct(self, c_ids, c_labels, r_ids, r_labels, ref_c, ref_r):
        return as_preference_outputs(self.objective(c_ids, c_labels, r_ids, r_labels))


class PreferenceGradient(nn.Cell):
    """One forward + backward of a preference objective w.r.t. every parameter it holds.

    -> (loss, chosen_rewards, rejected_rewards, gradients...): the gradients are returned whole,
    because the direction check steps the policy along them and the masking check reads the probe's
    ([B, T, 1]).
    """

    def __init__(self, objective, weights):
        super().__init__(auto_prefix=False)
        self.objective = objective
        self.weights = ms.ParameterTuple(weights)
        self.grad_fn = cache_proof.value_and_grad(self, self.objective, None, self.weights, has_aux=True)

    def proof_gradients(self, out):
        """Where the output holds the gradient value_and_grad returns (engine/cache_proof.py)."""
        return tuple(out[3:])

    def construct(self, c_ids, c_labels, r_ids, r_labels, ref_c, ref_r):
        (loss, cr, rj), grads = self.grad_fn(c_ids, c_labels, r_ids, r_labels, ref_c, ref_r)
        return (loss, cr, rj) + tuple(grads)
