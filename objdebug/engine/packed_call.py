"""The Cell that calls the user's model on packed rows: construct's arguments in `[packing] inputs`
order (ids, block mask, reset positions, cumulative lengths, all built on the host by
`objdebug.engine.packing.row_arrays`), the logits picked as `[model] output` says (the same
choice as `cells.ModelCall`, which it extends)."""

from __future__ import annotations

import mindspore as ms
import numpy as np

from objdebug.engine.cells import ModelCall
from objdebug.engine.model_inputs import FIRST, unwrap


class PackedModelCall(ModelCall):
    """(input_ids, attention_mask, position_ids, actual_seq_len) -> logits [B, T, V]; only the
    arguments in `inputs` reach the model, in that order (a tuple of constants: unrolled)."""

    def __init__(self, model, inputs, mask_dtype: str, output=FIRST):
        super().__init__(model, ("input_ids",), mask_dtype, output)
        self.packed_inputs = tuple(inputs)

    def construct(self, input_ids, attention_mask, position_ids, actual_seq_len):
        args = ()
        for name in self.packed_inputs:
            if name == "input_ids":
                args = args + (input_ids,)
            elif name == "attention_mask":
                args = args + (ms.ops.cast(attention_mask, self.mask_dtype),)
            elif name == "position_ids":
                args = args + (position_ids,)
            else:
                args = args + (actual_seq_len,)
        return self._logits(self.model(*args))  # ModelCall's output selection


def packed_model(target, inputs) -> PackedModelCall:
    """The target's own model (unwrapped) behind a PackedModelCall with its configured output."""
    current = target.model
    output = getattr(current, "output", None)
    spec = target.config.model
    if output is None:
        output = spec.output if spec.output is not None else FIRST
    return PackedModelCall(unwrap(current), inputs, spec.mask_dtype, output)


def packed_logits(engine, inputs, arrays: dict) -> np.ndarray:
    """The model's logits float32[B, T, V] on a packed batch (`row_arrays`), one graph per shape."""
    cell = engine.cell("packing.model", lambda: packed_model(engine.target, inputs))
    mask = arrays["attention_mask"]
    if not any(n == "attention_mask" for n in inputs):
        mask = np.zeros((1, 1), np.int32)  # not passed to the model: a placeholder keeps the signature
    out = engine.call("packing.model", cell, ms.Tensor(arrays["input_ids"], ms.int32),
                      ms.Tensor(mask, ms.int32), ms.Tensor(arrays["position_ids"], ms.int32),
                      ms.Tensor(arrays["actual_seq_len"], ms.int32))
    return out.asnumpy()
