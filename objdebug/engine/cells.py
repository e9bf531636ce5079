"""The Cells through which objdebug calls the user's objective, in the user's own calling form.

Every graph objdebug compiles starts from one of these, so the three forms (flat, sequence,
end-to-end) are handled in one place:

- `BatchObjective(target)`: (input_ids, labels) -> (total, outputs) on a whole batch, exactly as
  a training step calls it. Wrap it in `ms.value_and_grad(..., has_aux=True)` to differentiate
  the total only.
- `ObjectiveOnLogits(target)`: (logits, labels) -> (total, outputs): the objective alone.
- `PerSampleObjective(target, batch)`: (input_ids, labels) -> float32[B, K]: the objective called
  once per row (a static loop, unrolled in the graph), so each sample's own loss comes from the
  user's masking and reduction.

`outputs` is float32[K]: the total, then the declared components when the objective returns a
tuple. MindSpore is imported at module level: a helper called from a graph-mode `construct`
cannot import.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops


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
    """(input_ids [B, T], labels [B, T]) -> float32[B, K]: the objective called once per row."""

    def __init__(self, target, batch: int):
        super().__init__(auto_prefix=False)
        self.model = target.model
        self.objective = target.objective
        self.batch = batch
        self.split = target.model is not None
        self.flat = target.config.objective.call == "flat"

    def construct(self, input_ids, labels):
        outs = []
        if self.split:
            logits = self.model(input_ids)
        for b in range(self.batch):
            if self.split:
                if self.flat:
                    r = self.objective(logits[b], labels[b])
                else:
                    r = self.objective(logits[b:b + 1], labels[b:b + 1])
            else:
                r = self.objective(input_ids[b:b + 1], labels[b:b + 1])
            outs.append(as_outputs(r)[1])
        return ops.stack(outs)


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
