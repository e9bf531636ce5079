"""Inspect what a model returns without compiling a graph: one call in PyNative mode.

Used where objdebug only needs the structure of a result (a tuple of 3, a mapping with "loss" and
"logits"), never for a number it judges. It saves a compile, and a graph whose output is a Python
mapping or object is a JIT-fallback (PyExecute) node that MindSpore's compile cache cannot export
("Cannot export a PyExecute CNode in MindIR"): such a graph would make a cached run fail.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def pynative() -> Iterator[None]:
    import mindspore as ms

    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        yield
    finally:
        ms.set_context(mode=mode)
