"""The one NaN/Infinity codec of objdebug's JSON (reports, monitor logs, baselines), and the one
reader of the JSON objdebug is given.

JSON has no NaN or Infinity: a measurement that is not finite is written as the string "NaN",
"Infinity" or "-Infinity", and read back into a float by `number`. Everything that writes JSON
goes through `encode`; everything that reads a number back goes through `number`.

Every JSON text objdebug reads (a report for `render` / `--baseline`, a monitor log, data rows,
`init --data`) is parsed by `loads` / `load`: too deep a nesting (100 000 `[`) makes Python's
parser raise RecursionError, which is not a ValueError and escaped every caller as exit 3; here it
is a `json.JSONDecodeError` like any other malformed text, so each caller's existing message
(exit 2, naming the file and line) covers it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from enum import Enum
from typing import Any

import numpy as np

NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def encode(obj: Any) -> Any:
    """JSON-safe: numpy scalars and arrays to Python, NaN/Inf to strings, enums to their values."""
    if isinstance(obj, Mapping):
        return {str(k): encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return encode(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        if math.isnan(obj):
            return "NaN"
        if math.isinf(obj):
            return "Infinity" if obj > 0 else "-Infinity"
        return obj
    if isinstance(obj, Enum):
        return obj.value
    return obj


def number(x: Any) -> float | None:
    """A number as `encode` wrote it, back to float ("NaN" -> nan); None for anything else (a bool too)."""
    if isinstance(x, bool) or x is None:
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str):
        return NONFINITE.get(x)
    return None


def loads(text: str | bytes, **kwargs: Any) -> Any:
    """`json.loads`, with a nesting too deep for the parser a `json.JSONDecodeError` (a ValueError)."""
    try:
        return json.loads(text, **kwargs)
    except RecursionError:
        doc = text if isinstance(text, str) else text.decode("utf-8", "replace")
        raise json.JSONDecodeError("nested too deeply (objects and arrays inside each other beyond "
                                   "Python's recursion limit)", doc, 0) from None


def load(fh: Any, **kwargs: Any) -> Any:
    """`json.load` through `loads`."""
    return loads(fh.read(), **kwargs)
