"""Reference training objectives for objdebug.

:class:`MaskedCrossEntropy` is the objective the bundled demo is trained with and the reference
the diagnostics compare a user's objective against. It differs from ``nn.CrossEntropyLoss`` in
the places where that one is measured to misbehave on MindSpore 2.10 (see
``docs/mindspore-2.10-notes.md`` in the shared docs): an all-masked batch gives 0 instead of NaN,
fp16 logits are computed in fp32, and a negative label other than ``ignore_index`` raises
instead of being scored silently as class ``V - 1``.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

__all__ = ["MaskedCrossEntropy"]

_REDUCTIONS = ("mean", "sum", "none")


class MaskedCrossEntropy(nn.Cell):
    r"""
    Masked cross-entropy for causal language models, computed in float32.

    Given unnormalized logits :math:`x` of shape :math:`(N, V)` and integer targets :math:`y` of
    shape :math:`(N,)`, the per-position loss is

    .. math::
        \log p_{n,c} = x_{n,c} - \max_j x_{n,j}
                       - \log \sum_{j=1}^{V} \exp(x_{n,j} - \max_k x_{n,k})

    .. math::
        \ell_n = m_n \left[ (1 - \epsilon)\,(-\log p_{n,y_n})
                 + \frac{\epsilon}{V} \sum_{c=1}^{V} (-\log p_{n,c}) \right],
        \qquad m_n = \mathbb{1}\{y_n \neq \text{ignore_index}\}

    where :math:`\epsilon` is `label_smoothing`. Masked positions contribute exactly 0 to the loss
    and exactly 0 to the gradient. With `reduction` ``'mean'`` the result is

    .. math::
        \ell = \frac{\sum_n \ell_n}{\max(\sum_n m_n,\ 1)}

    so a batch in which every position is masked gives 0.0 rather than NaN. ``'sum'`` returns
    :math:`\sum_n \ell_n` and ``'none'`` returns :math:`\ell` with 0 at masked positions.

    Args:
        ignore_index (int): Target value whose positions are masked out (prompt and padding
            positions of a causal LM). Default: ``-100``.
        reduction (str): Apply specific reduction method to the output: ``'none'`` , ``'mean'`` ,
            ``'sum'`` . Default: ``'mean'`` .

            - ``'none'``: no reduction will be applied.
            - ``'mean'``: the sum of the output divided by the number of unmasked positions
              (at least 1).
            - ``'sum'``: the output will be summed.

        label_smoothing (float): Label smoothing value :math:`\epsilon`, a regularization tool
            used to prevent the model from overfitting when calculating Loss. The value range
            is [0.0, 1.0]. Default: ``0.0`` .

    Inputs:
        - **logits** (Tensor) - Predicted unnormalized logits, of shape :math:`(N, V)`, or
          :math:`(..., V)` which is flattened to :math:`(N, V)`. Any float dtype; it is cast to
          float32 inside.
        - **labels** (Tensor) - Target class indices of shape :math:`(N,)` (or the leading shape
          of `logits`), int32 or int64. Each value must be in :math:`[0, V)` or equal to
          `ignore_index`.

    Outputs:
        Tensor, float32. A scalar if `reduction` is ``'mean'`` or ``'sum'``; otherwise of the
        same shape as `labels`.

    Raises:
        TypeError: If `ignore_index` is not an int.
        TypeError: If `label_smoothing` is not a float.
        ValueError: If `reduction` is not one of ``'none'``, ``'mean'``, ``'sum'``.
        ValueError: If `label_smoothing` is not in range [0.0, 1.0].
        RuntimeError: If a label is :math:`\geq V`, or negative and not equal to
            `ignore_index` (raised by the GatherD kernel at run time; out-of-range labels are
            never scored).

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import mindspore as ms
        >>> import numpy as np
        >>> from objdebug.losses import MaskedCrossEntropy
        >>> ms.set_context(mode=ms.GRAPH_MODE)
        >>> loss_fn = MaskedCrossEntropy(ignore_index=-100)
        >>> logits = ms.Tensor(np.array([[2.0, 0.5, 0.1], [0.3, 0.2, 3.0]]), ms.float32)
        >>> labels = ms.Tensor(np.array([0, -100]), ms.int32)
        >>> output = loss_fn(logits, labels)
        >>> print(round(float(output), 4))
        0.3168
    """

    def __init__(self, ignore_index=-100, reduction="mean", label_smoothing=0.0):
        super().__init__()
        name = "MaskedCrossEntropy"
        if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
            raise TypeError(f"For '{name}', the type of 'ignore_index' must be int, "
                            f"but got {type(ignore_index).__name__}.")
        if not isinstance(reduction, str) or reduction not in _REDUCTIONS:
            raise ValueError(f"For '{name}', the 'reduction' must be in ['mean', 'sum', 'none'], "
                             f"but got {reduction!r}.")
        if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)):
            raise TypeError(f"For '{name}', the type of 'label_smoothing' must be float, "
                            f"but got {type(label_smoothing).__name__}.")
        if not 0.0 <= float(label_smoothing) <= 1.0:
            raise ValueError(f"For '{name}', the 'label_smoothing' must be in range [0.0, 1.0], "
                             f"but got {label_smoothing}.")
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = float(label_smoothing)
        self.use_smoothing = self.label_smoothing > 0.0

    def construct(self, logits, labels):
        vocab = logits.shape[-1]
        out_shape = labels.shape
        x = logits.astype(ms.float32).reshape((-1, vocab))
        y = labels.astype(ms.int32).reshape((-1,))

        # Stable log-softmax in fp32.
        x_max = ops.stop_gradient(x.max(axis=-1, keepdims=True))
        shifted = x - x_max
        logp = shifted - ops.log(ops.exp(shifted).sum(axis=-1, keepdims=True))

        # Masked positions read index 0 (a harmless valid index); any other negative label is
        # mapped to `vocab`, which GatherD rejects as out of range, as it does labels >= vocab.
        mask = y != self.ignore_index
        zeros = ops.zeros_like(y)
        safe = ops.where(mask, y, zeros)
        safe = ops.where(safe < 0, ops.full_like(y, vocab), safe)
        picked = ops.gather_d(logp, 1, safe.reshape((-1, 1))).reshape((-1,))
        per_pos = -picked
        if self.use_smoothing:
            smooth = -logp.mean(axis=-1)
            per_pos = (1.0 - self.label_smoothing) * per_pos + self.label_smoothing * smooth
        # `where` (not a multiply) so a masked position's inf/NaN can neither leak into the
        # loss nor into the gradient.
        per_pos = ops.where(mask, per_pos, ops.zeros_like(per_pos))

        if self.reduction == "none":
            return per_pos.reshape(out_shape)
        total = per_pos.sum()
        if self.reduction == "sum":
            return total
        count = mask.astype(ms.float32).sum()
        return total / ops.maximum(count, ops.ones_like(count))
