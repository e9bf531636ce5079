"""The Cells through which objdebug calls the user's objective, in the user's own calling form.

Every graph objdebug compiles starts from one of these, so the three forms (flat, sequence,
end-to-end) are handled in one place:

- `BatchObjective(target)`: (input_ids, labels) -> (total, outputs) on a whole batch, exactly as
  a training step calls it. Wrap it in `ms.value_and_grad(..., has_aux=True)` to differentiate
  the total only.
- `ObjectiveOnLogits(target)`: (logits, labels) -> (total, outputs): the objective alone.
- `ModelCall(model, inputs, mask_dtype, output)`: input_ids -> logits: the user's model called
  with the arguments `[model] inputs` names (mask and positions built in-graph from the padding
  marks of `objdebug.engine.model_inputs`) and its `[model] output` picked; `target.model` is
  one when such a key is set, so every Cell below calls the model through it.
- `PerSampleObjective(target, batch, on_logits)`: (input_ids or logits, labels) -> float32[B, K]:
  the objective called once per row (a static loop, unrolled in the graph), so each sample's own
  loss comes from the user's masking and reduction; on_logits (split form) on the logits of the
  shared `model.forward` graph.

`outputs` is float32[K]: the total, then the declared components when the objective returns a
tuple. MindSpore is imported at module level: a helper called from a graph-mode `construct`
cannot import.
"""

from __future__ import annotations

from typing import Any

import mindspore as ms
from mindspore import nn, ops

from objdebug.engine import model_inputs as mi
from objdebug.engine.model_inputs import FIRST, PAD_BELOW, PAD_OFFSET, RAW


def as_outputs(r):
    """The objective's result -> (total float32 scalar, float32[K] of every output)."""
    if isinstance(r, tuple):
        parts = [ops.cast(ops.reshape(x, ()), ms.float32) for x in r]
        return parts[0], ops.stack(parts)
    total = ops.cast(ops.reshape(r, ()), ms.float32)
    return total, ops.reshape(total, (1,))


def call_on_logits(objective, flat, logits, labels):
    """The objective on logits [B, T, V] / labels [B, T] in the configured calling form."""
    if flat:
        return objective(logits.reshape((-1, logits.shape[-1])), labels.reshape((-1,)))
    return objective(logits, labels)


class ObjectiveOnLogits(nn.Cell):
    """(logits [B, T, V], labels [B, T]) -> (total, outputs): the objective alone."""

    def __init__(self, target):
        super().__init__(auto_prefix=False)  # keep the user's parameter names
        self.objective = target.objective
        self.flat = target.config.objective.call == "flat"

    def construct(self, logits, labels):
        return as_outputs(call_on_logits(self.objective, self.flat, logits, labels))


class BatchObjective(nn.Cell):
    """(input_ids [B, T], labels [B, T]) -> (total, outputs): model + objective on the batch."""

    def __init__(self, target):
        super().__init__(auto_prefix=False)  # keep the user's parameter names
        self.model = target.model
        self.objective = target.objective
        self.split = target.model is not None
        self.flat = target.config.objective.call == "flat"

    def construct(self, input_ids, labels):
        if self.split:
            r = call_on_logits(self.objective, self.flat, self.model(input_ids), labels)
        else:
            r = self.objective(input_ids, labels)
        return as_outputs(r)


class PerSampleObjective(nn.Cell):
    """(input_ids [B, T], labels [B, T]) -> float32[B, K]: the objective called once per row.

    on_logits (split form): (logits [B, T, V], labels [B, T]) instead, the logits from the shared
    `model.forward` graph, so the per-sample graph holds the objective alone: every stage that
    scores rows reuses the model graph the contract probe, the model state and the logit checks
    compile anyway, and this graph compiles in about a third of the time of model + objective.
    """

    def __init__(self, target, batch: int, on_logits: bool = False):
        super().__init__(auto_prefix=False)
        self.split = target.model is not None
        self.on_logits = on_logits and self.split
        self.model = None if self.on_logits else target.model
        self.objective = target.objective
        self.batch = batch
        self.flat = target.config.objective.call == "flat"

    def construct(self, x, labels):
        outs = []
        logits = x
        if self.split and not self.on_logits:
            logits = self.model(x)
        for b in range(self.batch):
            if self.split:
                if self.flat:
                    r = self.objective(logits[b], labels[b])
                else:
                    r = self.objective(logits[b:b + 1], labels[b:b + 1])
            else:
                r = self.objective(x[b:b + 1], labels[b:b + 1])
            outs.append(as_outputs(r)[1])
        return ops.stack(outs)


class ObjectiveForward(nn.Cell):
    """(logits, labels) -> outputs float32[K]: the objective alone, forward only, called on its
    inputs as they come (already flat for the flat form: a reshape inside the graph would hand
    the objective a copy, and a write into it would go unseen). The engine's `objective.forward`
    graph (`Engine.objective_forward`): each sample's own loss, the invariants' forward."""

    def __init__(self, objective):
        super().__init__(auto_prefix=False)
        self.objective = objective

    def construct(self, logits, labels):
        return as_outputs(self.objective(logits, labels))[1]


class ModelForward(nn.Cell):
    """input_ids -> the model's output, through a Cell of objdebug's own: the engine's shared
    dynamic-shape forward (`Engine.forward`) sets its input shapes here, never on the user's
    model, and the model can run in training mode in a copy of this Cell without touching the
    evaluation-mode one."""

    def __init__(self, model):
        super().__init__(auto_prefix=False)  # keep the user's parameter names
        self.model = model

    def construct(self, input_ids):
        return self.model(input_ids)


class ModelVJP(nn.Cell):
    """(input_ids [B, T], cotangent [B, T, V]) -> (the model's output, the gradient of
    <model(input_ids), cotangent> w.r.t. `params`): the vector-Jacobian product of the model's
    forward, and the forward it runs anyway (a probe whose input the model rejects, or whose
    forward must be the one of this graph, reads it: stress/garbage_ids.py).

    With the cotangent dL/dlogits of any objective L (computed by that objective's own graph on
    the logits), this is dL/dparams: one graph that holds the model serves every objective's
    parameter gradient (the configured one, the decomposition's components, a preference loss),
    and only the cheap objective-only graphs differ.

    The product is taken as the gradient of the scalar sum(model(input_ids) * cotangent), not
    with `GradOperation(sens_param=True)`: MindSpore 2.10 refuses a sensitivity of dynamic shape
    ("The shape of sense must not be dynamic shape"), and the backward of a sum of products hands
    the model's output exactly the cotangent, so the gradients are the same.
    """

    proof_vjp = True  # a compile-cache hit is proved on the model's forward (cache_proof.vjp_answer)

    def __init__(self, model, params):
        super().__init__(auto_prefix=False)  # keep the user's parameter names
        self.model = model
        self.weights = ms.ParameterTuple(params)
        self.grad = ops.GradOperation(get_by_list=True)

    def _inner(self, input_ids, cotangent):
        out = self.model(input_ids)
        return (out * ops.stop_gradient(ops.cast(cotangent, out.dtype))).sum()

    def construct(self, input_ids, cotangent):
        return self.model(input_ids), self.grad(self._inner, self.weights)(input_ids, cotangent)


class RawObjective(nn.Cell):
    """The objective's own result, unchanged (a Tensor, a tuple, a dict): what the contract probe
    inspects. `on_logits`: (logits, labels) in the configured calling form; else end-to-end
    (input_ids, labels)."""

    def __init__(self, target, on_logits: bool):
        super().__init__(auto_prefix=False)
        self.objective = target.objective
        self.on_logits = on_logits
        self.flat = target.config.objective.call == "flat"

    def construct(self, x, labels):
        if self.on_logits:
            return call_on_logits(self.objective, self.flat, x, labels)
        return self.objective(x, labels)


class ModelCall(nn.Cell):
    """input_ids int32[B, T] (padding marked, see the module docstring) -> the model's logits.

    Builds the configured inputs in-graph and picks the configured output; every Cell objdebug
    compiles calls the model through this one when a `[model]` input/output key is set."""

    def __init__(self, model, inputs=("input_ids",), mask_dtype: str = "int32", output: Any = FIRST):
        super().__init__(auto_prefix=False)  # keep the user's parameter names
        self.model = model
        self.inputs = tuple(inputs)
        self.marked = self.inputs != ("input_ids",)
        self.mask_dtype = ms.bool_ if mask_dtype == "bool" else getattr(ms, mask_dtype)
        self.output = output
        self.by_index = isinstance(output, int) and not isinstance(output, bool)
        self.by_name = isinstance(output, str) and output not in (FIRST, RAW)
        self.first = output == FIRST  # RAW: neither, the model's result as it is
        # inputs past input_ids go by NAME (checked against construct's parameters when the
        # model is wrapped): a library model's mask is rarely its second parameter
        self.named = self.inputs[1:] if self.inputs[:1] == ("input_ids",) else ()
        self.offset = PAD_OFFSET
        self.below = PAD_BELOW

    def _positions(self, real):
        count = ops.cumsum(ops.cast(real, ms.int32), 1)
        return ops.where(real, count - 1, ops.zeros_like(count))

    def _call_by_name(self, ids, real):
        # literal keyword calls: a **dict built in the graph is a PyExecute node (JIT fallback),
        # which the compile cache cannot export
        mask = ops.cast(real, self.mask_dtype)
        if "attention_mask" in self.named and "position_ids" in self.named:
            return self.model(ids, attention_mask=mask, position_ids=self._positions(real))
        if "attention_mask" in self.named:
            return self.model(ids, attention_mask=mask)
        return self.model(ids, position_ids=self._positions(real))

    def construct(self, input_ids):
        ids = input_ids
        real = input_ids >= self.below
        if self.marked:
            ids = ops.where(real, input_ids, input_ids + self.offset)
        if self.named:
            out = self._call_by_name(ids, real)
        else:
            args = ()
            for name in self.inputs:  # a tuple of constants: unrolled when the graph compiles
                if name == "input_ids":
                    args = args + (ids,)
                elif name == "attention_mask":
                    args = args + (ops.cast(real, self.mask_dtype),)
                else:
                    args = args + (self._positions(real),)
            out = self.model(*args)
        return self._logits(out)

    def _logits(self, out):
        """The logits in what the model returned: `[model] output` (an index, or a key / attribute
        name), else the tensor itself or a tuple's first element."""
        if self.by_index:
            return out[self.output]
        if self.by_name:
            if isinstance(out, dict):
                return out[self.output]
            return getattr(out, self.output)
        if self.first and isinstance(out, (tuple, list)):
            return out[0]
        return out


# --------------------------------------------------------------------------- the model behind ModelCall
def wrap(model, cfg, output: Any = None):
    """The user's model behind ModelCall when a key asks for it (or `output` is given), else
    the model itself: the default path compiles exactly the graphs it always did."""
    if model is None or mi.is_wrapped(model) or (output is None and not mi.configured(cfg)):
        return model
    from objdebug.engine.signature import check_names

    spec = cfg.model
    check_names(model, mi.model_inputs(cfg), "model.inputs")  # bound by name: each must be construct's
    chosen = output if output is not None else (spec.output if spec.output is not None else mi.FIRST)
    return ModelCall(model, mi.model_inputs(cfg), spec.mask_dtype, chosen)


def wrap_like(target, model):
    """`model` (a fresh copy from the factory) called the way the target's model is."""
    current = target.model
    if not mi.is_wrapped(current):
        return model
    return ModelCall(model, current.inputs, target.config.model.mask_dtype, current.output)
