"""Stage 2, grad: one real forward + backward of the user's objective on a batch of the target's data.

The batch total is the objective called as the user calls it (flat / sequence / end-to-end); its
gradients are reduced inside the compiled graph (see objdebug/engine/gradients.py). Codes OBJ2xx:

- OBJ201 mean per-parameter gradient norm out of range, OBJ202 max/mean norm imbalance,
  OBJ203 NaN/Inf gradients, OBJ204 disconnected (all-zero) parameters;
- OBJ205 padding / prompt positions (label == label_pad_id) receive gradient;
- OBJ209 supervised positions get no gradient (dropped supervision), OBJ210 the label contract
  (data side, with one row's table): supervision.py beside this module;
- OBJ206 autodiff disagrees with central finite differences of the real objective;
- OBJ207 logit-gradient scale differs from a standard mean cross-entropy (reference);
- OBJ208 logit-gradient direction is not a likelihood's (see objdebug/stages/grad/likelihood.py).

This module is the stage's face: one module per check family (health.py OBJ201-OBJ204,
padding_leakage.py OBJ205, finite_differences.py OBJ206, logit_scale.py OBJ207,
likelihood_shape.py OBJ208, supervision.py OBJ209 / OBJ210; the task kinds' class_weights.py,
crf.py, contrastive.py, task_fd.py), their shared pieces in _common.py.
"""

from __future__ import annotations

from objdebug.core.findings import Check
# the gradient batch and its measurements, read by the tests through the stage
from objdebug.pipeline.run_data import fd_directions, grad_batch, grad_probe, param_gradients
from objdebug.stages.grad.health import GradientHealth, TaskGradientHealth
from objdebug.stages.grad.padding_leakage import PaddingLeakage
from objdebug.stages.grad.logit_scale import LogitGradientScale
from objdebug.stages.grad.finite_differences import FiniteDifferences, TaskFiniteDifferences
from objdebug.stages.grad.likelihood_shape import LikelihoodShape
from objdebug.stages.grad.supervision import SupervisionCoverage
from objdebug.stages.grad.class_weights import ClassWeights, IgnoredLabel
from objdebug.stages.grad.crf import CRFChecks
from objdebug.stages.grad.contrastive import Contrastive

__all__ = ["GradientHealth", "PaddingLeakage", "SupervisionCoverage", "LogitGradientScale", "FiniteDifferences",
           "LikelihoodShape", "TaskGradientHealth", "TaskFiniteDifferences", "ClassWeights", "IgnoredLabel",
           "CRFChecks", "Contrastive", "fd_directions", "grad_batch", "grad_probe", "param_gradients", "checks"]


def checks() -> list[Check]:
    return [GradientHealth(), PaddingLeakage(), SupervisionCoverage(), LogitGradientScale(),
            FiniteDifferences(), LikelihoodShape(),
            TaskGradientHealth(), TaskFiniteDifferences(), ClassWeights(), IgnoredLabel(), CRFChecks(), Contrastive()]  # [task] kinds (issue 47)
