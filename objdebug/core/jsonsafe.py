"""The one NaN/Infinity codec of objdebug's JSON (reports, monitor logs, baselines).

JSON has no NaN or Infinity: a measurement that is not finite is written as the string "NaN",
"Infinity" or "-Infinity", and read back into a float by `number`. Everything that writes JSON
goes through `encode`; everything that reads a number back goes through `number`.
"""

from __future__ import annotations

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
