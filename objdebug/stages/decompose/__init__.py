"""Stage 4, decompose: the components of a composite objective (total, c1, c2, ...).

Values come from the user's objective run per sample over the data (`engine.evaluate`); a batch
is one engine batch (same bucket grouping, padding rows excluded). Gradient shares come from
sum_i w_i * c_i, differentiated w.r.t. the model's trainable parameters and called with one-hot
`w`: one compile for K components (split form: the objective's weighted logit gradient and the
model's shared VJP, `_component_grad`). Codes OBJ3xx.

This module is the stage's face: one module per check family (components.py OBJ300-OBJ303,
gradient_share.py OBJ304, primary_share.py OBJ305), the components' values in _common.py, their
gradients in _gradients.py, a `[task] kind`'s rows and graphs in task_terms.py.
"""

from __future__ import annotations

from objdebug.core.findings import Check
from objdebug.stages.decompose._common import (KINDS, _samples, component_names, component_values,
                                               engine_batches, shared_params)
from objdebug.stages.decompose._gradients import (GRAPH_NAME, LOGIT_GRAPH_NAME, component_gradients,
                                                  gradient_batches, measured_gradients)
from objdebug.stages.decompose.components import ComponentValues
from objdebug.stages.decompose.gradient_share import GradientShare
from objdebug.stages.decompose.primary_share import PrimaryShare, primary_name, rebalance_factor

__all__ = ["KINDS", "GRAPH_NAME", "LOGIT_GRAPH_NAME", "_samples", "engine_batches", "component_names",
           "component_values", "shared_params", "gradient_batches", "component_gradients",
           "measured_gradients", "primary_name", "rebalance_factor", "ComponentValues", "GradientShare",
           "PrimaryShare", "checks"]


def checks() -> list[Check]:
    return [ComponentValues(), GradientShare(), PrimaryShare()]
