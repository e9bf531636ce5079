"""`objdebug init`: the user's model's inputs and output, read from the model itself.

Not from objdebug's wrapper (`cells.ModelCall`, which takes only `input_ids`): construct's
parameter names give `[model] inputs` (`input_ids` plus whichever of `attention_mask` /
`position_ids` it takes, bound by name), one PyNative call on a [1, 8] batch gives `[model]
output` (a mapping's "logits" key, a tuple's first [B, T, V] element, an object's `logits`), and a
`labels` parameter means the model computes its own loss: init then offers the end-to-end form.

A parameter with the right name is not yet an input that runs: MindFormers 2.0's Llama takes
`attention_mask` but builds its own [B, 1, T, T] mask and fails on a 2-D one; mindone's mask path
has no CPU kernel (`Clone`). `runnable` calls the model with each candidate added, as objdebug
would build it (one PyNative call on a padded [2, 8] batch through `cells.ModelCall`, no compile),
and keeps only the ones that run; init writes why it left the others out.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.core.config import INPUTS


def read(model, vocab_hint: int | None = None) -> dict[str, Any]:
    """{"inputs": [...] or None, "output": int | str | None, "described": str, "labels": bool,
    "parameters": [...]} for the user's model Cell."""
    from objdebug.engine.signature import parameters

    names = parameters(model) or []
    inputs = ["input_ids"] + [n for n in INPUTS[1:] if n in names]
    out: dict[str, Any] = {"parameters": names, "labels": "labels" in names,
                           "inputs": inputs if len(inputs) > 1 else None}
    out.update(_output(model, vocab_hint))
    return out


def _output(model, vocab_hint: int | None) -> dict[str, Any]:
    import mindspore as ms

    from objdebug.engine.pynative import pynative

    ids = ms.Tensor(np.ones((1, 8), np.int32))
    try:
        with pynative():
            raw = model(ids)
    except Exception as exc:  # the contract probe reports the model's own error
        from objdebug.core.crash import summary

        return {"output": None, "described": f"not read ({summary(exc)})"}

    def logits_like(x) -> bool:
        return isinstance(x, ms.Tensor) and x.ndim == 3 and tuple(x.shape[:2]) == (1, 8)

    if isinstance(raw, ms.Tensor):
        return {"output": None, "described": f"a tensor {tuple(raw.shape)}"}
    if isinstance(raw, dict):
        key = "logits" if logits_like(raw.get("logits")) else next(
            (k for k, v in raw.items() if logits_like(v)), None)
        return {"output": key, "described": f"a mapping with keys {sorted(raw)}"}
    if isinstance(raw, (tuple, list)):
        index = next((i for i, v in enumerate(raw) if logits_like(v)), None)
        parts = [tuple(v.shape) if isinstance(v, ms.Tensor) else type(v).__name__ for v in raw]
        return {"output": index, "described": f"a tuple of {len(raw)}: {parts}"}
    if logits_like(getattr(raw, "logits", None)):
        return {"output": "logits", "described": f"a {type(raw).__name__} with .logits"}
    return {"output": None, "described": f"a {type(raw).__name__}"}


def end_to_end_offer(model_factory: str, checkpoint: str | None) -> list[str]:
    """Comment lines offering the end-to-end form for a model that takes `labels`."""
    lines = ["the model's construct takes `labels`: it can be the end-to-end target itself (its own",
             "loss, called with labels by keyword; see docs/config.md, Models from MindFormers and",
             "HF-style ports). Replace [model] and [objective] with:",
             "  [objective]", f"  factory = \"{model_factory}\""]
    if checkpoint:
        lines.append(f"  checkpoint = \"{checkpoint}\"")
    lines += ["and set [data] shift = false if the model shifts the labels itself (objdebug measures",
              "it and stops with exit 2 when shift is wrong)."]
    return lines


def runnable(model, inputs: list[str], output: Any) -> tuple[list[str], list[str]]:
    """(the inputs that run, one line per candidate left out and why): each candidate past
    `input_ids` added in turn to the ones kept, the model called through ModelCall on a [2, 8]
    batch whose second row ends in 3 padding tokens (so a mask carries zeros)."""
    import mindspore as ms

    from objdebug.core.crash import summary
    from objdebug.engine.cells import ModelCall
    from objdebug.engine.model_inputs import FIRST, mark_padding
    from objdebug.engine.pynative import pynative

    real = np.ones((2, 8), bool)
    real[1, 5:] = False
    ids = ms.Tensor(mark_padding(np.ones((2, 8), np.int32), real))
    kept, left = ["input_ids"], []
    for name in inputs[1:]:
        call = ModelCall(model, tuple(kept + [name]), "int32", FIRST if output is None else output)
        try:
            with pynative():
                logits = call(ids)
            shape = tuple(logits.shape) if isinstance(logits, ms.Tensor) else None
            if shape is None or len(shape) != 3 or shape[0] != 2:
                raise ValueError(f"the output is {type(logits).__name__} {shape}, not logits [2, T, V]")
        except Exception as exc:  # the model refuses the input as objdebug builds it
            left.append(f"{name} left out: the model fails with it on a [2, 8] batch "
                        f"({summary(exc)[:200]})")
            continue
        kept.append(name)
    return kept, left
