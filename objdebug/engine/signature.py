"""What the user's `construct` takes, read from its signature (never from objdebug's wrappers).

Library models take many optional parameters in their own order (MindFormers' LlamaForCausalLM:
`(input_ids, labels=None, input_position=None, position_ids=None, attention_mask=None, ...)`, 19
in all; an HF-style port: `(input_ids, attention_mask=None, position_ids=None, ..., labels=None)`),
so objdebug passes everything but `input_ids` by NAME and checks each name against construct's
parameters first: a name construct does not take is an InputError (exit 2) listing the ones it takes.
"""

from __future__ import annotations

import inspect

from objdebug.core.errors import InputError


def parameters(cell) -> list[str] | None:
    """construct's parameter names in order (without self); None when it cannot be read or takes
    **kwargs (any name goes)."""
    try:
        sig = inspect.signature(type(cell).construct)
    except (TypeError, ValueError):  # a C-implemented or wrapped construct
        return None
    names = []
    for p in list(sig.parameters.values())[1:]:
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            return None
        if p.kind is not inspect.Parameter.VAR_POSITIONAL:
            names.append(p.name)
    return names


def takes(cell, name: str) -> bool:
    names = parameters(cell)
    return names is not None and name in names


def check_names(cell, names, where: str, source: str | None = None) -> None:
    """Every name but the first (the ids, passed by position) must be a construct parameter."""
    taken = parameters(cell)
    if taken is None:
        return
    unknown = [n for n in list(names)[1:] if n not in taken]
    if unknown:
        raise InputError(f"For '{where}', every name must be a parameter of "
                         f"{type(cell).__name__}.construct, which takes {taken}, but got "
                         f"{unknown[0]!r}.", source=source)
