"""Small models of the non-causal-LM demo targets (`objdebug demo --task ...`, issue 47).

Byte-level, plain MindSpore ops, any length T; padding is token 0 (`[data] pad_id`) and is left
out of every pooled mean, so a row's result does not depend on how far it was padded:

- `BagClassifier`: input_ids [B, T] -> class logits [B, C] (mean of the byte embeddings, one
  tanh layer, a linear head): the text classifier of `objdebug demo --task classification`.
- `ContextTagger`: input_ids [B, T] -> emissions [B, T, K]: each byte with its neighbours
  (-1 .. +3) through one tanh layer and a linear head (token classification, with or without
  a CRF on top).
- `BagEncoder`: input_ids [B, T] -> embeddings [B, D] (the pooled, projected bytes).

Parameter names: embed.weight, hidden.weight / .bias, head.weight / .bias.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops, Parameter
from mindspore.common.initializer import initializer, Normal

__all__ = ["BagClassifier", "ContextTagger", "BagEncoder"]


class _Embed(nn.Cell):
    def __init__(self, vocab_size, dim):
        super().__init__()
        self.weight = Parameter(initializer(Normal(0.1), (vocab_size, dim), ms.float32), name="weight")

    def construct(self, ids):
        vocab = self.weight.shape[0]
        ids = ops.where(ids < 0, ops.full_like(ids, vocab), ids)  # a negative id is out of range
        return ops.gather(self.weight, ids, 0)


class _Pooled(nn.Cell):
    """input_ids [B, T] -> tanh(W mean(embeddings of the real bytes)) [B, H]."""

    def __init__(self, vocab_size, dim, hidden, pad_id):
        super().__init__()
        self.embed = _Embed(vocab_size, dim)
        self.hidden = nn.Dense(dim, hidden, weight_init=Normal(0.2))
        self.pad_id = pad_id

    def pooled(self, ids):
        e = self.embed(ids)
        real = ops.cast(ids != self.pad_id, ms.float32).expand_dims(-1)
        count = ops.maximum(real.sum(1), ops.ones_like(real.sum(1)))
        return ops.tanh(self.hidden((e * real).sum(1) / count))


class BagClassifier(_Pooled):
    def __init__(self, vocab_size=256, dim=32, hidden=32, classes=4, pad_id=0):
        super().__init__(vocab_size, dim, hidden, pad_id)
        self.head = nn.Dense(hidden, classes, weight_init=Normal(0.2))

    def construct(self, input_ids):
        return self.head(self.pooled(input_ids))


class BagEncoder(_Pooled):
    def __init__(self, vocab_size=256, dim=32, hidden=32, out=16, pad_id=0):
        super().__init__(vocab_size, dim, hidden, pad_id)
        self.head = nn.Dense(hidden, out, weight_init=Normal(0.2))

    def construct(self, input_ids):
        return self.head(self.pooled(input_ids))


class ContextTagger(nn.Cell):
    """Each position sees bytes t-1 .. t+3 (zeros beyond the row): emissions [B, T, K]."""

    def __init__(self, vocab_size=256, dim=16, hidden=48, tags=5, pad_id=0):
        super().__init__()
        self.embed = _Embed(vocab_size, dim)
        self.hidden = nn.Dense(5 * dim, hidden, weight_init=Normal(0.2))
        self.head = nn.Dense(hidden, tags, weight_init=Normal(0.2))
        self.pad_id = pad_id

    def construct(self, input_ids):
        e = self.embed(input_ids) * ops.cast(input_ids != self.pad_id, ms.float32).expand_dims(-1)
        b, t, d = e.shape
        z = ops.zeros((b, 3, d), ms.float32)
        padded = ops.concat((z[:, :1], e, z), 1)  # [B, T + 4, D]
        window = ops.concat([padded[:, k:k + t] for k in range(5)], -1)
        return self.head(ops.tanh(self.hidden(window)))
