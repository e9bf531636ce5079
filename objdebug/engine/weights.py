"""Parameters that hold another model's values for a while: a second model (a preference
reference, a KL reference) is data, its weights loaded into the model for a shared graph's call.
One helper for every stage that needs it (the preference and policy stages)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def holding(params: list, values: list) -> Iterator[None]:
    """`params` hold the values of `values` (parameters paired in order) inside the block; their
    own values are restored exactly on exit."""
    import mindspore as ms

    saved = [p.data.asnumpy().copy() for p in params]
    try:
        for p, q in zip(params, values):
            p.set_data(ms.Tensor(q.data.asnumpy()))
        yield
    finally:
        for p, theta in zip(params, saved):
            p.set_data(ms.Tensor(theta))
