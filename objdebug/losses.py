"""Reference training objectives for objdebug.

The preference losses (:class:`SigmoidDPOLoss`, :class:`IPOLoss`, :class:`SimPOLoss`,
:class:`HingeDPOLoss`) take the four sequence log-prob vectors of a batch of preference pairs, as
`[objective] call = "preference"` does, and return ``(loss, chosen_rewards, rejected_rewards)``.
:class:`GRPOLoss` is GRPO's clipped policy-gradient loss with its k3 KL term in the split form of
`call = "policy"` (the policy stage; the demo checks it on rollouts the demo model sampled).

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

__all__ = ["MaskedCrossEntropy", "SigmoidDPOLoss", "IPOLoss", "SimPOLoss", "HingeDPOLoss", "GRPOLoss",
           "WeightedCrossEntropy", "CRFLoss", "InfoNCELoss", "TripletLoss"]

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


def _log_sigmoid(x):
    """log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)), finite for any x.

    `ops.logsigmoid` in MindSpore 2.10 returns -inf below about x = -88 (float32 sigmoid underflows
    to 0 before the log), measured: -logsigmoid(-125.8) gives inf instead of 125.8. Summed
    log-probs of long answers reach such margins.
    """
    return ops.minimum(x, ops.zeros_like(x)) - ops.log1p(ops.exp(-ops.abs(x)))


def _check_float(name, key, value, positive=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"For '{name}', the type of '{key}' must be float, but got {type(value).__name__}.")
    if positive and not float(value) > 0.0:
        raise ValueError(f"For '{name}', the '{key}' must be > 0, but got {value}.")
    return float(value)


class _PreferenceLoss(nn.Cell):
    """Shared plumbing: argument checks and the reduction of the per-pair losses."""

    def __init__(self, name, beta, reduction):
        super().__init__()
        self.beta = _check_float(name, "beta", beta, positive=True)
        if not isinstance(reduction, str) or reduction not in _REDUCTIONS:
            raise ValueError(f"For '{name}', the 'reduction' must be in ['mean', 'sum', 'none'], "
                             f"but got {reduction!r}.")
        self.reduction = reduction

    def reduce(self, losses):
        if self.reduction == "none":
            return losses
        if self.reduction == "sum":
            return losses.sum()
        return losses.mean()

    @staticmethod
    def log_ratios(policy_chosen_logps, policy_rejected_logps, reference_chosen_logps,
                   reference_rejected_logps):
        chosen = policy_chosen_logps.astype(ms.float32) - reference_chosen_logps.astype(ms.float32)
        rejected = policy_rejected_logps.astype(ms.float32) - reference_rejected_logps.astype(ms.float32)
        return chosen, rejected





class SigmoidDPOLoss(_PreferenceLoss):
    r"""
    Direct Preference Optimization loss (Rafailov et al., 2023, eq. 7), the sigmoid form.

    With :math:`h = [\log\pi(y_w|x) - \log\pi_{ref}(y_w|x)] - [\log\pi(y_l|x) - \log\pi_{ref}(y_l|x)]`
    (sequence log-probs summed over the response tokens), the per-pair loss is

    .. math::
        \ell = -(1 - \epsilon)\log\sigma(\beta h) - \epsilon\log\sigma(-\beta h)

    where :math:`\epsilon` is `label_smoothing` (conservative DPO; 0 gives the paper's loss). When
    the policy equals the reference, :math:`h = 0` and :math:`\ell = \ln 2`. The implicit rewards are
    :math:`\beta[\log\pi(y|x) - \log\pi_{ref}(y|x)]`.

    Args:
        beta (float): Inverse temperature :math:`\beta` of the implicit reward; > 0. Default: ``0.1``.
        label_smoothing (float): Assumed share of flipped preference labels, in [0, 0.5).
            Default: ``0.0``.
        reduction (str): ``'none'``, ``'mean'`` or ``'sum'`` over the pairs. Default: ``'mean'``.
    Inputs:
        - **policy_chosen_logps** (Tensor) - Sequence log-probabilities of the chosen responses
          under the policy, of shape :math:`(B,)`. Any float dtype; computed in float32.
        - **policy_rejected_logps** (Tensor) - The same for the rejected responses, :math:`(B,)`.
        - **reference_chosen_logps** (Tensor) - Chosen responses under the frozen reference
          model, :math:`(B,)`.
        - **reference_rejected_logps** (Tensor) - Rejected responses under the reference, :math:`(B,)`.

    Outputs:
        Tuple of 3 Tensors, float32: the loss (a scalar for `reduction` ``'mean'`` / ``'sum'``,
        of shape :math:`(B,)` for ``'none'``), the chosen rewards and the rejected rewards, each
        of shape :math:`(B,)` and detached from the graph (``stop_gradient``).
    Raises:
        TypeError: If `beta` or `label_smoothing` is not a float.
        ValueError: If `beta` <= 0, `label_smoothing` is not in [0, 0.5), or `reduction` is not one
            of ``'none'``, ``'mean'``, ``'sum'``.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import mindspore as ms
        >>> import numpy as np
        >>> from objdebug.losses import SigmoidDPOLoss
        >>> loss_fn = SigmoidDPOLoss(beta=0.1)
        >>> x = ms.Tensor(np.array([-12.0, -30.0]), ms.float32)
        >>> y = ms.Tensor(np.array([-15.0, -28.0]), ms.float32)
        >>> loss, chosen_rewards, rejected_rewards = loss_fn(x, y, x, y)
        >>> print(round(float(loss), 4))
        0.6931
    """

    def __init__(self, beta=0.1, label_smoothing=0.0, reduction="mean"):
        super().__init__("SigmoidDPOLoss", beta, reduction)
        eps = _check_float("SigmoidDPOLoss", "label_smoothing", label_smoothing)
        if not 0.0 <= eps < 0.5:
            raise ValueError(f"For 'SigmoidDPOLoss', the 'label_smoothing' must be in range [0.0, 0.5), "
                             f"but got {label_smoothing}.")
        self.label_smoothing = eps

    def construct(self, policy_chosen_logps, policy_rejected_logps, reference_chosen_logps,
                  reference_rejected_logps):
        chosen, rejected = self.log_ratios(policy_chosen_logps, policy_rejected_logps,
                                           reference_chosen_logps, reference_rejected_logps)
        z = self.beta * (chosen - rejected)
        losses = -(1.0 - self.label_smoothing) * _log_sigmoid(z) - self.label_smoothing * _log_sigmoid(-z)
        return (self.reduce(losses), ops.stop_gradient(self.beta * chosen),
                ops.stop_gradient(self.beta * rejected))


class IPOLoss(_PreferenceLoss):
    r"""
    Identity Preference Optimization loss (Azar et al., 2023, eq. 17, "IPO").

    With :math:`h` the difference of the policy/reference log-ratios of the chosen and the rejected
    response — from log-probs **averaged** over the response tokens, as the IPO derivation and its
    reference implementation assume — the per-pair loss is

    .. math::
        \ell = \left(h - \frac{1}{2\tau}\right)^2

    with :math:`\tau` = `beta`. When the policy equals the reference, :math:`\ell = 1/(4\tau^2)`.

    Args:
        beta (float): The regularization :math:`\tau`; > 0. Default: ``0.1``.
        reduction (str): ``'none'``, ``'mean'`` or ``'sum'`` over the pairs. Default: ``'mean'``.
    Inputs:
        - **policy_chosen_logps** (Tensor) - Sequence log-probabilities of the chosen responses
          under the policy, of shape :math:`(B,)`. Any float dtype; computed in float32.
        - **policy_rejected_logps** (Tensor) - The same for the rejected responses, :math:`(B,)`.
        - **reference_chosen_logps** (Tensor) - Chosen responses under the frozen reference
          model, :math:`(B,)`.
        - **reference_rejected_logps** (Tensor) - Rejected responses under the reference, :math:`(B,)`.

    Outputs:
        Tuple of 3 Tensors, float32: the loss (a scalar for `reduction` ``'mean'`` / ``'sum'``,
        of shape :math:`(B,)` for ``'none'``), the chosen rewards and the rejected rewards, each
        of shape :math:`(B,)` and detached from the graph (``stop_gradient``).
    Raises:
        TypeError: If `beta` is not a float.
        ValueError: If `beta` <= 0 or `reduction` is not one of ``'none'``, ``'mean'``, ``'sum'``.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import mindspore as ms
        >>> import numpy as np
        >>> from objdebug.losses import IPOLoss
        >>> x = ms.Tensor(np.array([-1.2, -0.9]), ms.float32)
        >>> loss, _, _ = IPOLoss(beta=0.5)(x, x, x, x)
        >>> print(round(float(loss), 4))
        1.0
    """

    def __init__(self, beta=0.1, reduction="mean"):
        super().__init__("IPOLoss", beta, reduction)

    def construct(self, policy_chosen_logps, policy_rejected_logps, reference_chosen_logps,
                  reference_rejected_logps):
        chosen, rejected = self.log_ratios(policy_chosen_logps, policy_rejected_logps,
                                           reference_chosen_logps, reference_rejected_logps)
        losses = ops.square(chosen - rejected - 1.0 / (2.0 * self.beta))
        return (self.reduce(losses), ops.stop_gradient(self.beta * chosen),
                ops.stop_gradient(self.beta * rejected))


class SimPOLoss(_PreferenceLoss):
    r"""
    Simple Preference Optimization loss (Meng et al., 2024, eq. 6): reference-free, length-normalized.

    With :math:`\bar{p}_w, \bar{p}_l` the policy log-probs of the chosen and rejected responses
    **averaged** over their response tokens, the per-pair loss is

    .. math::
        \ell = -\log\sigma\left(\beta\,\bar{p}_w - \beta\,\bar{p}_l - \gamma\right)

    The reference inputs are accepted (for the common signature) and ignored. When the two policy
    log-probs are equal, :math:`\ell = \log(1 + e^{\gamma})`. The rewards are :math:`\beta\bar{p}`.

    Args:
        beta (float): Reward scale :math:`\beta`; > 0. Default: ``2.0``.
        gamma (float): Target reward margin :math:`\gamma` >= 0. Default: ``1.0``.
        reduction (str): ``'none'``, ``'mean'`` or ``'sum'`` over the pairs. Default: ``'mean'``.
    Inputs:
        - **policy_chosen_logps** (Tensor) - Sequence log-probabilities of the chosen responses
          under the policy, of shape :math:`(B,)`. Any float dtype; computed in float32.
        - **policy_rejected_logps** (Tensor) - The same for the rejected responses, :math:`(B,)`.
        - **reference_chosen_logps** (Tensor) - Chosen responses under the frozen reference
          model, :math:`(B,)`.
        - **reference_rejected_logps** (Tensor) - Rejected responses under the reference, :math:`(B,)`.

    Outputs:
        Tuple of 3 Tensors, float32: the loss (a scalar for `reduction` ``'mean'`` / ``'sum'``,
        of shape :math:`(B,)` for ``'none'``), the chosen rewards and the rejected rewards, each
        of shape :math:`(B,)` and detached from the graph (``stop_gradient``).
    Raises:
        TypeError: If `beta` or `gamma` is not a float.
        ValueError: If `beta` <= 0, `gamma` < 0 or `reduction` is not one of ``'none'``,
            ``'mean'``, ``'sum'``.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import mindspore as ms
        >>> import numpy as np
        >>> from objdebug.losses import SimPOLoss
        >>> x = ms.Tensor(np.array([-1.2, -0.9]), ms.float32)
        >>> loss, _, _ = SimPOLoss(beta=2.0, gamma=1.0)(x, x, x, x)
        >>> print(round(float(loss), 4))
        1.3133
    """

    def __init__(self, beta=2.0, gamma=1.0, reduction="mean"):
        super().__init__("SimPOLoss", beta, reduction)
        self.gamma = _check_float("SimPOLoss", "gamma", gamma)
        if self.gamma < 0.0:
            raise ValueError(f"For 'SimPOLoss', the 'gamma' must be >= 0, but got {gamma}.")

    def construct(self, policy_chosen_logps, policy_rejected_logps, reference_chosen_logps,
                  reference_rejected_logps):
        chosen = self.beta * policy_chosen_logps.astype(ms.float32)
        rejected = self.beta * policy_rejected_logps.astype(ms.float32)
        losses = -_log_sigmoid(chosen - rejected - self.gamma)
        return self.reduce(losses), ops.stop_gradient(chosen), ops.stop_gradient(rejected)


class HingeDPOLoss(_PreferenceLoss):
    r"""
    Hinge preference loss (SLiC-HF, Zhao et al., 2023, eq. 1, with the DPO log-ratios).

    With :math:`h` the difference of the policy/reference log-ratios (summed log-probs), the
    per-pair loss is

    .. math::
        \ell = \max(0,\ 1 - \beta h)

    When the policy equals the reference, :math:`\ell = 1`.

    Args:
        beta (float): Scale :math:`\beta` of the log-ratio margin (the hinge sits at
            :math:`h = 1/\beta`); > 0. Default: ``0.1``.
        reduction (str): ``'none'``, ``'mean'`` or ``'sum'`` over the pairs. Default: ``'mean'``.
    Inputs:
        - **policy_chosen_logps** (Tensor) - Sequence log-probabilities of the chosen responses
          under the policy, of shape :math:`(B,)`. Any float dtype; computed in float32.
        - **policy_rejected_logps** (Tensor) - The same for the rejected responses, :math:`(B,)`.
        - **reference_chosen_logps** (Tensor) - Chosen responses under the frozen reference
          model, :math:`(B,)`.
        - **reference_rejected_logps** (Tensor) - Rejected responses under the reference, :math:`(B,)`.

    Outputs:
        Tuple of 3 Tensors, float32: the loss (a scalar for `reduction` ``'mean'`` / ``'sum'``,
        of shape :math:`(B,)` for ``'none'``), the chosen rewards and the rejected rewards, each
        of shape :math:`(B,)` and detached from the graph (``stop_gradient``).
    Raises:
        TypeError: If `beta` is not a float.
        ValueError: If `beta` <= 0 or `reduction` is not one of ``'none'``, ``'mean'``, ``'sum'``.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> import mindspore as ms
        >>> import numpy as np
        >>> from objdebug.losses import HingeDPOLoss
        >>> x = ms.Tensor(np.array([-12.0, -30.0]), ms.float32)
        >>> loss, _, _ = HingeDPOLoss(beta=0.1)(x, x, x, x)
        >>> print(round(float(loss), 4))
        1.0
    """

    def __init__(self, beta=0.1, reduction="mean"):
        super().__init__("HingeDPOLoss", beta, reduction)

    def construct(self, policy_chosen_logps, policy_rejected_logps, reference_chosen_logps,
                  reference_rejected_logps):
        chosen, rejected = self.log_ratios(policy_chosen_logps, policy_rejected_logps,
                                           reference_chosen_logps, reference_rejected_logps)
        losses = ops.relu(1.0 - self.beta * (chosen - rejected))
        return (self.reduce(losses), ops.stop_gradient(self.beta * chosen),
                ops.stop_gradient(self.beta * rejected))


class GRPOLoss(nn.Cell):
    r"""
    GRPO's loss (TRL's GRPOTrainer): per completion token
    :math:`-\min(r A, \mathrm{clip}(r, 1 - \epsilon, 1 + \epsilon) A) + \beta\,k_3`, with
    :math:`r = e^{\log\pi - \log\pi_{old}}` and :math:`k_3 = e^{d} - d - 1`,
    :math:`d = \log\pi_{ref} - \log\pi`, averaged over each completion's tokens and then over
    the completions ("sequence-mean").

    Args:
        beta (float): the KL coefficient. Default: ``0.04``.
        epsilon (float): the clip range. Default: ``0.2``.

    Inputs ("inputs" layout: per-token arrays aligned with ``input_ids``, entry t for token t):
        - **logits** (Tensor) - ``[B, T, V]``, logits[t] predicts input_ids[t + 1].
        - **input_ids** (Tensor) - ``[B, T]`` int.
        - **completion_mask** (Tensor) - ``[B, T]`` float, 1 at completion tokens.
        - **advantages** (Tensor) - ``[B]``.
        - **old_per_token_logps**, **ref_per_token_logps** (Tensor) - ``[B, T]``.

    Outputs:
        Tensor, the scalar loss (float32).
    """

    def __init__(self, beta=0.04, epsilon=0.2):
        super().__init__()
        _check_float("GRPOLoss", "beta", beta)
        _check_float("GRPOLoss", "epsilon", epsilon, positive=True)
        self.beta = float(beta)
        self.epsilon = float(epsilon)

    def construct(self, logits, input_ids, completion_mask, advantages, old_per_token_logps,
                  ref_per_token_logps):
        logp = ops.log_softmax(logits[:, :-1].astype(ms.float32), -1)
        lp = ops.gather_d(logp, 2, ops.expand_dims(input_ids[:, 1:], -1)).squeeze(-1)
        m = completion_mask[:, 1:].astype(ms.float32)
        ratio = ops.exp(lp - old_per_token_logps[:, 1:])
        a = ops.expand_dims(advantages.astype(ms.float32), 1)
        pg = -ops.minimum(ratio * a, ops.clip_by_value(ratio, 1.0 - self.epsilon, 1.0 + self.epsilon) * a)
        d = ref_per_token_logps[:, 1:] - lp
        tokens = (pg + self.beta * (ops.exp(d) - d - 1.0)) * m
        return (tokens.sum(-1) / ops.maximum(m.sum(-1), 1.0)).mean()


class WeightedCrossEntropy(nn.Cell):
    r"""
    Class-weighted cross-entropy for classification and token classification (tagging), in
    float32: the reference objective of `[task] kind = "classification"` / `"tagging"`.

    .. math::
        \ell = \frac{\sum_n m_n w_{y_n} (-\log p_{n,y_n})}{\max(\sum_n m_n w_{y_n},\ \epsilon)},
        \qquad m_n = \mathbb{1}\{y_n \neq \text{ignore_index}\}

    (``'mean'``; the weighted mean of ``torch.nn.CrossEntropyLoss(weight=...)``), ``'sum'`` the
    numerator alone. A row whose label is `ignore_index` contributes exactly 0 to the loss and
    its gradient; an all-ignored batch gives 0.

    Args:
        weight (list[float]): One positive weight per class, in label-index order. Default:
            ``None`` (every class 1).
        ignore_index (int): The label of rows (or tag positions) that are not scored. Default: ``-100``.
        reduction (str): ``'mean'`` (weighted mean) or ``'sum'``. Default: ``'mean'``.

    Inputs:
        - **logits** (Tensor) - :math:`(N, C)` or :math:`(..., C)`, any float dtype.
        - **labels** (Tensor) - :math:`(N,)` or the leading shape of `logits`, int32.

    Outputs:
        Tensor, a float32 scalar.

    Raises:
        ValueError: If `weight` holds a value that is not a positive number, or `reduction` is
            not ``'mean'`` / ``'sum'``.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``
    """

    def __init__(self, weight=None, ignore_index=-100, reduction="mean"):
        super().__init__()
        name = "WeightedCrossEntropy"
        if weight is not None and (not isinstance(weight, (list, tuple)) or not weight or not all(
                isinstance(w, (int, float)) and not isinstance(w, bool) and w > 0 for w in weight)):
            raise ValueError(f"For '{name}', the 'weight' must be a list of positive numbers, "
                             f"but got {weight!r}.")
        if reduction not in ("mean", "sum"):
            raise ValueError(f"For '{name}', the 'reduction' must be in ['mean', 'sum'], but got "
                             f"{reduction!r}.")
        self.weight = None if weight is None else ms.Tensor([float(w) for w in weight], ms.float32)
        self.ignore_index = ignore_index
        self.reduction = reduction

    def construct(self, logits, labels):
        classes = logits.shape[-1]
        x = logits.astype(ms.float32).reshape((-1, classes))
        y = labels.astype(ms.int32).reshape((-1,))
        logp = x - ops.stop_gradient(x.max(axis=-1, keepdims=True))
        logp = logp - ops.log(ops.exp(logp).sum(axis=-1, keepdims=True))
        mask = y != self.ignore_index
        safe = ops.where(mask, y, ops.zeros_like(y))
        safe = ops.where(safe < 0, ops.full_like(y, classes), safe)  # out of range: GatherD raises
        nll = -ops.gather_d(logp, 1, safe.reshape((-1, 1))).reshape((-1,))
        if self.weight is None:
            w = ops.ones_like(nll)
        else:
            w = ops.gather(self.weight, safe, 0)
        w = ops.where(mask, w, ops.zeros_like(w))
        total = (ops.where(mask, nll, ops.zeros_like(nll)) * w).sum()
        if self.reduction == "sum":
            return total
        norm = w.sum()
        return total / ops.maximum(norm, ops.full_like(norm, 1e-12))


class CRFLoss(nn.Cell):
    r"""
    Linear-chain CRF negative log-likelihood for sequence labelling, in float32: the reference
    objective of `[task] kind = "tagging"` with a CRF.

    For emissions :math:`e_{t,k}` and the tags :math:`y` of the scored positions
    :math:`t_1 < \dots < t_n` (those whose tag is not `ignore_index`),

    .. math::
        s(y) = a_{y_{t_1}} + \sum_i e_{t_i, y_{t_i}} + \sum_{i>1} A_{y_{t_{i-1}}, y_{t_i}} + b_{y_{t_n}},
        \qquad \ell = \log \sum_{y'} \exp s(y') - s(y)

    with start transitions :math:`a`, transitions :math:`A` and end transitions :math:`b`, the
    partition function by the forward algorithm over the same positions. So
    :math:`\sum_y \exp(-\ell(y)) = 1` and :math:`\ell \geq 0` for every tag sequence.

    Args:
        num_tags (int): K, the number of tags.
        ignore_index (int): The tag of positions that are not scored (padding, later word pieces).
            Default: ``-100``.
        reduction (str): ``'mean'`` over rows, ``'sum'``, or ``'token_mean'`` (the sum over
            the scored positions of the batch, pytorch-crf's name). Default: ``'mean'``.
        seed (int): Seeds the initial transitions (normal, std 0.1). Default: ``0``.

    Inputs:
        - **emissions** (Tensor) - :math:`(B, T, K)` float.
        - **tags** (Tensor) - :math:`(B, T)` int32; a row with no scored position costs 0.

    Outputs:
        Tensor, a float32 scalar.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``
    """

    def __init__(self, num_tags, ignore_index=-100, reduction="mean", seed=0):
        super().__init__()
        import numpy as np

        if isinstance(num_tags, bool) or not isinstance(num_tags, int) or num_tags < 1:
            raise ValueError(f"For 'CRFLoss', the 'num_tags' must be a positive int, but got {num_tags!r}.")
        if reduction not in ("mean", "sum", "token_mean"):
            raise ValueError(f"For 'CRFLoss', the 'reduction' must be in ['mean', 'sum', 'token_mean'], "
                             f"but got {reduction!r}.")
        rng = np.random.default_rng(seed)
        k = num_tags
        self.start_transitions = ms.Parameter(ms.Tensor(rng.normal(0, 0.1, k).astype(np.float32)),
                                              name="start_transitions")
        self.end_transitions = ms.Parameter(ms.Tensor(rng.normal(0, 0.1, k).astype(np.float32)),
                                            name="end_transitions")
        self.transitions = ms.Parameter(ms.Tensor(rng.normal(0, 0.1, (k, k)).astype(np.float32)),
                                        name="transitions")
        self.ignore_index = ignore_index
        self.reduction = reduction

    def _parts(self):
        return self.start_transitions, self.transitions, self.end_transitions

    def _mask(self, tags):
        return tags != self.ignore_index

    def _score(self, e, y, mask):
        """s(y) per row: start, emissions and transitions along the scored positions, end; 0 for
        a row with no scored position (the start transition goes on its first scored one)."""
        start, trans, end = self._parts()
        started = mask[:, 0]
        first = y[:, 0]
        step0 = ops.gather(start, first, 0) + ops.gather_d(e[:, 0], 1, first.reshape((-1, 1))).reshape((-1,))
        score = ops.where(started, step0, ops.zeros_like(step0))
        prev = first
        for t in range(1, e.shape[1]):
            m = mask[:, t]
            yt = y[:, t]
            emit = ops.gather_d(e[:, t], 1, yt.reshape((-1, 1))).reshape((-1,))
            step = ops.where(started, trans[prev, yt], ops.gather(start, yt, 0)) + emit
            score = score + ops.where(m, step, ops.zeros_like(step))
            prev = ops.where(m, yt, prev)
            started = ops.logical_or(started, m)
        last = ops.gather(end, prev, 0)
        return score + ops.where(started, last, ops.zeros_like(last))

    def _log_partition(self, e, mask):
        """log sum_y exp s(y) per row: the forward algorithm over the scored positions (0 for a row
        with none, whose only path is the empty one)."""
        start, trans, end = self._parts()
        started = mask[:, 0]
        alpha = start.reshape((1, -1)) + e[:, 0]
        for t in range(1, e.shape[1]):
            m = mask[:, t].expand_dims(1)
            nxt = ops.logsumexp(alpha.expand_dims(2) + trans.expand_dims(0) + e[:, t].expand_dims(1), 1)
            first = start.reshape((1, -1)) + e[:, t]  # a row whose first scored position is t
            nxt = ops.where(started.expand_dims(1), nxt, first)
            alpha = ops.where(m, nxt, alpha)
            started = ops.logical_or(started, mask[:, t])
        log_z = ops.logsumexp(alpha + end.reshape((1, -1)), 1)
        return ops.where(started, log_z, ops.zeros_like(log_z))

    def construct(self, emissions, tags):
        e = emissions.astype(ms.float32)
        mask = self._mask(tags)
        y = ops.where(mask, tags, ops.zeros_like(tags)).astype(ms.int32)
        nll = self._log_partition(e, mask) - self._score(e, y, mask)
        if self.reduction == "token_mean":
            count = mask.astype(ms.float32).sum()
            return nll.sum() / ops.maximum(count, ops.ones_like(count))
        return nll.sum() if self.reduction == "sum" else nll.mean()

    def decode(self, emissions):
        """Viterbi: the highest-scoring tag path of each row of emissions [B, T, K] (every
        position real) -> int32 [B, T]."""
        import numpy as np

        start, trans, end = (p.asnumpy().astype(np.float64) for p in self._parts())
        e = emissions.asnumpy().astype(np.float64)
        b, steps, _ = e.shape
        out = np.zeros((b, steps), np.int32)
        for r in range(b):
            delta = start + e[r, 0]
            back = []
            for t in range(1, steps):
                cand = delta[:, None] + trans
                back.append(cand.argmax(0))
                delta = cand.max(0) + e[r, t]
            k = int((delta + end).argmax())
            path = [k]
            for bp in reversed(back):
                k = int(bp[k])
                path.append(k)
            out[r] = path[::-1]
        return ms.Tensor(out)


def _similarity(a, b, similarity):
    """[B, D] x [B, D] -> [B, B] similarities: cosine (rows normalised) or dot."""
    a = a.astype(ms.float32)
    b = b.astype(ms.float32)
    if similarity == "cosine":
        a = a / ops.maximum(ops.norm(a, dim=-1, keepdim=True), ops.full((1, 1), 1e-12, dtype=ms.float32))
        b = b / ops.maximum(ops.norm(b, dim=-1, keepdim=True), ops.full((1, 1), 1e-12, dtype=ms.float32))
    return ops.matmul(a, b.T)


class InfoNCELoss(nn.Cell):
    r"""
    In-batch InfoNCE for sentence embeddings: the reference objective of `[task] kind =
    "embedding"` on (anchor, positive) pairs.

    .. math::
        \ell = -\frac{1}{B} \sum_i \log \frac{\exp(s(a_i, p_i) / \tau)}{\sum_j \exp(s(a_i, p_j) / \tau)}

    with :math:`s` the cosine (or dot) similarity: every other row's positive is a negative, the
    positive itself is in the denominator, the anchor is never compared with itself.

    Args:
        temperature (float): :math:`\tau > 0`. Default: ``0.05``.
        similarity (str): ``'cosine'`` or ``'dot'``. Default: ``'cosine'``.

    Inputs:
        - **anchor** (Tensor) - :math:`(B, D)` float.
        - **positive** (Tensor) - :math:`(B, D)` float.

    Outputs:
        Tensor, a float32 scalar.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``
    """

    def __init__(self, temperature=0.05, similarity="cosine"):
        super().__init__()
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature <= 0:
            raise ValueError(f"For 'InfoNCELoss', the 'temperature' must be a positive number, but got {temperature!r}.")
        if similarity not in ("cosine", "dot"):
            raise ValueError(f"For 'InfoNCELoss', the 'similarity' must be in ['cosine', 'dot'], but got {similarity!r}.")
        self.temperature = float(temperature)
        self.similarity = similarity

    def construct(self, anchor, positive):
        logits = _similarity(anchor, positive, self.similarity) / self.temperature
        logp = logits - ops.logsumexp(logits, -1, True)
        return -ops.diagonal(logp).mean()


class TripletLoss(nn.Cell):
    r"""
    Triplet margin loss on embeddings: mean over rows of
    :math:`\max(0,\ d(a, p) - d(a, n) + m)`, with :math:`d = 1 - \cos` (``'cosine'``) or the
    Euclidean distance (``'euclidean'``).

    Args:
        margin (float): :math:`m \geq 0`. Default: ``1.0``.
        distance (str): ``'euclidean'`` or ``'cosine'``. Default: ``'euclidean'``.

    Inputs:
        - **anchor**, **positive**, **negative** (Tensor) - :math:`(B, D)` float each.

    Outputs:
        Tensor, a float32 scalar.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``
    """

    def __init__(self, margin=1.0, distance="euclidean"):
        super().__init__()
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or margin < 0:
            raise ValueError(f"For 'TripletLoss', the 'margin' must be a number >= 0, but got {margin!r}.")
        if distance not in ("euclidean", "cosine"):
            raise ValueError(f"For 'TripletLoss', the 'distance' must be in ['euclidean', 'cosine'], but got {distance!r}.")
        self.margin = float(margin)
        self.distance = distance

    def _d(self, x, y):
        x = x.astype(ms.float32)
        y = y.astype(ms.float32)
        if self.distance == "cosine":
            cos = (x * y).sum(-1) / ops.maximum(ops.norm(x, dim=-1) * ops.norm(y, dim=-1),
                                                ops.full((1,), 1e-12, dtype=ms.float32))
            return 1.0 - cos
        return ops.sqrt(((x - y) ** 2).sum(-1) + 1e-12)

    def construct(self, anchor, positive, negative):
        return ops.relu(self._d(anchor, positive) - self._d(anchor, negative) + self.margin).mean()
