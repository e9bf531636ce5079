"""Parameter names, MindSpore-free: shared by the grad stage (`objdebug.engine.gradients`) and the
training monitor (`objdebug.monitor`), so a layer means the same thing in both."""

from __future__ import annotations


def layer_of(name: str) -> str:
    """Group a parameter by name prefix: up to the first numeric part ('blocks.0'), else the first.

    'blocks.0.attn.qkv.weight' -> 'blocks.0'; 'model.layers.11.mlp.w' -> 'model.layers.11';
    'lm_head.weight' -> 'lm_head'; 'route' -> 'route'.
    """
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.isdigit():
            return ".".join(parts[:i + 1])
    return parts[0] if len(parts) > 1 else name
