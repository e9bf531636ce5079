"""TinyCausalLM: a small byte-level causal transformer, the model of the bundled demo target.

Plain MindSpore ops only (matmul, softmax, layer norm); compiles in GRAPH_MODE on CPU.
Positions are sinusoidal and computed in-graph from the runtime sequence length, and the causal
mask is built from the runtime length too, so no parameter is tied to a maximum length: the model
accepts any T (tested at 16, 300 and larger). Padding is expected at the END of a sequence, so the
causal mask alone keeps real tokens from seeing padding and no padding mask is needed.

Parameter names (for a 2-layer model)::

    embed.weight
    blocks.0.norm1.gamma / .beta
    blocks.0.attn.qkv.weight / .bias,  blocks.0.attn.proj.weight / .bias
    blocks.0.norm2.gamma / .beta
    blocks.0.mlp.fc1.weight / .bias,   blocks.0.mlp.fc2.weight / .bias
    blocks.1.…
    norm_f.gamma / .beta
    lm_head.weight
"""
from __future__ import annotations

import math

import numpy as np
import mindspore as ms
from mindspore import nn, ops, Parameter, Tensor
from mindspore.common.initializer import initializer, Normal

__all__ = ["TinyCausalLM", "build_model"]


class TokenEmbedding(nn.Cell):
    """Embedding table with a parameter named ``weight`` (``nn.Embedding`` calls it
    ``embedding_table``)."""

    def __init__(self, vocab_size, d_model, init_std=0.02):
        super().__init__()
        self.weight = Parameter(initializer(Normal(init_std), (vocab_size, d_model), ms.float32),
                                name="weight")

    def construct(self, ids):
        # Gather wraps a negative id silently (-1 reads the last row); map negatives to the
        # vocabulary size, which Gather rejects as out of range, like ids >= vocab.
        vocab = self.weight.shape[0]
        ids = ops.where(ids < 0, ops.full_like(ids, vocab), ids)
        return ops.gather(self.weight, ids, 0)


class CausalSelfAttention(nn.Cell):
    """Multi-head causal self-attention with a fused ``qkv`` projection."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"For 'CausalSelfAttention', 'd_model' ({d_model}) must be divisible "
                             f"by 'n_heads' ({n_heads}).")
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.d_model = d_model
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.qkv = nn.Dense(d_model, 3 * d_model, weight_init=Normal(0.02))
        self.proj = nn.Dense(d_model, d_model, weight_init=Normal(0.02))

    def construct(self, x):
        b, t, _ = x.shape
        qkv = self.qkv(x).reshape((b, t, 3, self.n_heads, self.head_dim))
        qkv = qkv.transpose((2, 0, 3, 1, 4))          # [3, B, H, T, Dh]
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = ops.matmul(q, k.transpose((0, 1, 3, 2))) * self.scale   # [B, H, T, T]
        pos = ops.arange(t, dtype=ms.int32)
        future = pos.reshape((1, t)) > pos.reshape((t, 1))                # j > i is masked
        scores = ops.where(future, ops.full_like(scores, -1e9), scores)
        attn = ops.softmax(scores, axis=-1)
        out = ops.matmul(attn, v)                                          # [B, H, T, Dh]
        out = out.transpose((0, 2, 1, 3)).reshape((b, t, self.d_model))
        return self.proj(out)


class MLP(nn.Cell):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.fc1 = nn.Dense(d_model, d_ff, weight_init=Normal(0.02))
        self.fc2 = nn.Dense(d_ff, d_model, weight_init=Normal(0.02))
        self.act = nn.GELU(approximate=False)

    def construct(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Cell):
    """Pre-norm transformer block."""

    def __init__(self, d_model, n_heads, d_ff):
        super().__init__()
        self.norm1 = nn.LayerNorm((d_model,), epsilon=1e-5)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.norm2 = nn.LayerNorm((d_model,), epsilon=1e-5)
        self.mlp = MLP(d_model, d_ff)

    def construct(self, x):
        x = x + self.attn(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        return x


class TinyCausalLM(nn.Cell):
    """Byte-level causal LM: ``construct(input_ids int32[B, T]) -> logits float32[B, T, V]``."""

    def __init__(self, vocab_size=256, d_model=64, n_layers=2, n_heads=4, d_ff=None):
        super().__init__()
        d_ff = 4 * d_model if d_ff is None else d_ff
        if d_model % 2 != 0:
            raise ValueError(f"For 'TinyCausalLM', 'd_model' must be even, but got {d_model}.")
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.embed = TokenEmbedding(vocab_size, d_model)
        self.blocks = nn.CellList([Block(d_model, n_heads, d_ff) for _ in range(n_layers)])
        self.norm_f = nn.LayerNorm((d_model,), epsilon=1e-5)
        self.lm_head = nn.Dense(d_model, vocab_size, has_bias=False, weight_init=Normal(0.02))
        half = d_model // 2
        inv_freq = np.exp(-math.log(10000.0) * np.arange(half, dtype=np.float64) / half)
        # A constant, not a Parameter: not saved in checkpoints, not trained.
        self.inv_freq = Tensor(inv_freq.astype(np.float32).reshape((1, half)))

    def positions(self, t):
        """Sinusoidal position encodings [T, d_model] for the runtime length ``t``."""
        pos = ops.arange(t, dtype=ms.float32).reshape((t, 1))
        angles = pos * self.inv_freq
        return ops.concat((ops.sin(angles), ops.cos(angles)), axis=-1)

    def construct(self, input_ids):
        t = input_ids.shape[1]
        x = self.embed(input_ids) + self.positions(t)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm_f(x))


def build_model(vocab_size=256, d_model=64, n_layers=2, n_heads=4, d_ff=None):
    """Factory used by ``objdebug.toml``: returns an untrained :class:`TinyCausalLM`."""
    return TinyCausalLM(vocab_size=vocab_size, d_model=d_model, n_layers=n_layers,
                        n_heads=n_heads, d_ff=d_ff)
