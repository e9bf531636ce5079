"""What the user's `construct` takes, read from its signature (never from objdebug's wrappers).

Library models take many optional parameters in their own order (MindFormers' LlamaForCausalLM:
`(input_ids, labels=None, input_position=None, position_ids=None, attention_mask=None, ...)`, 19
in all; an HF-style port: `(input_ids, attention_mask=None, position_ids=None, ..., labels=None)`),
so objdebug passes everything but `input_ids` by NAME and checks each name against construct's
parameters first: a name construct does not take is an InputError (exit 2) listing the ones it takes.
A construct that ends in `**kwargs` (mindone's ports of HF: `construct(input_ids=None,
attention_mask=None, ..., labels=None, ..., **kwargs)`) still names its parameters before it: those
are read (so `labels` is seen and bound by keyword), and any other name is let through.
"""

from __future__ import annotations

import inspect

from objdebug.core.errors import InputError


def _signature(cell) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(type(cell).construct).parameters.values())[1:]  # without self
    except (TypeError, ValueError):  # a C-implemented or wrapped construct
        return None


def parameters(cell) -> list[str] | None:
    """construct's named parameters in order (without self, *args and **kwargs); None when the
    signature cannot be read."""
    params = _signature(cell)
    if params is None:
        return None
    return [p.name for p in params if p.kind not in (inspect.Parameter.VAR_POSITIONAL,
                                                      inspect.Parameter.VAR_KEYWORD)]


def any_keyword(cell) -> bool:
    """construct takes `**kwargs`: a name it does not list may still be passed."""
    params = _signature(cell)
    return params is not None and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def takes(cell, name: str) -> bool:
    names = parameters(cell)
    return names is not None and name in names


def check_names(cell, names, where: str, source: str | None = None) -> None:
    """Every name but the first (the ids, passed by position) must be a construct parameter."""
    taken = parameters(cell)
    if taken is None or any_keyword(cell):
        return
    unknown = [n for n in list(names)[1:] if n not in taken]
    if unknown:
        raise InputError(f"For '{where}', every name must be a parameter of "
                         f"{type(cell).__name__}.construct, which takes {taken}, but got "
                         f"{unknown[0]!r}.", source=source)
