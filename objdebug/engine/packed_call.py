"""The Cell that calls the user's model on packed rows: the ids first, the boundary inputs of
`[packing] inputs` BY NAME (block mask, reset positions, cumulative lengths, all built on the host
by `objdebug.engine.packing.row_arrays`), the logits picked as `[model] output` says (the same
choice as `cells.ModelCall`, which it extends). By name as `[model] inputs` are, and checked against
construct's parameters when the target loads (`check_names`): an HF-style
`construct(input_ids, attention_mask=None, position_ids=None)` given `["input_ids", "position_ids"]`
by position got the positions as its mask (a false OBJ901/OBJ902 alarm)."""

from __future__ import annotations

import mindspore as ms
import numpy as np

from objdebug.core.config import packed_inputs
from objdebug.engine.cells import ModelCall
from objdebug.engine.model_inputs import FIRST, unwrap
from objdebug.engine.signature import check_names


def check_names_of(model, cfg) -> None:
    """Each packed input past the ids must be a parameter of the model's construct (exit 2 naming
    the key that chose it: `packing.inputs`, or `packing.boundary` when the inputs are derived)."""
    where = "packing.inputs" if cfg.packing.inputs else "packing.boundary"
    names = ("input_ids",) + tuple(n for n in packed_inputs(cfg) if n != "input_ids")
    check_names(unwrap(model), names, where, source=cfg.source)


class PackedModelCall(ModelCall):
    """(input_ids, attention_mask, position_ids, actual_seq_len) -> logits [B, T, V]; the ids by
    position, and only the boundary inputs named in `inputs`, by name."""

    def __init__(self, model, inputs, mask_dtype: str, output=FIRST):
        super().__init__(model, ("input_ids",), mask_dtype, output)
        self.packed_inputs = tuple(inputs)

        self.mask = "attention_mask" in self.packed_inputs
        self.positions = "position_ids" in self.packed_inputs
        self.lengths = "actual_seq_len" in self.packed_inputs

    def construct(self, input_ids, attention_mask, position_ids, actual_seq_len):
        mask = ms.ops.cast(attention_mask, self.mask_dtype)
        return self._logits(self._call(input_ids, mask, position_ids, actual_seq_len))

    def _call(self, ids, mask, pos, lengths):
        # literal keyword calls, one per combination of constants (folded when the graph
        # compiles): a **dict built in the graph is a PyExecute node the compile cache cannot export
        if self.mask and self.positions and self.lengths:
            return self.model(ids, attention_mask=mask, position_ids=pos, actual_seq_len=lengths)
        if self.mask and self.positions:
            return self.model(ids, attention_mask=mask, position_ids=pos)
        if self.mask and self.lengths:
            return self.model(ids, attention_mask=mask, actual_seq_len=lengths)
        if self.positions and self.lengths:
            return self.model(ids, position_ids=pos, actual_seq_len=lengths)
        if self.mask:
            return self.model(ids, attention_mask=mask)
        if self.positions:
            return self.model(ids, position_ids=pos)
        if self.lengths:
            return self.model(ids, actual_seq_len=lengths)
        return self.model(ids)


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
