"""Stage 7, stress: hostile inputs through the real model and objective, forward and backward.

One Check per case, so each is its own result row and a crash in one does not stop the others.
Codes OBJ5xx; one module per case beside this one, their shared Cells in `_common.py`.
"""

from __future__ import annotations

from objdebug.core.findings import Check
from objdebug.stages.stress.all_padding import AllPadding
from objdebug.stages.stress.determinism import Determinism
from objdebug.stages.stress.garbage_ids import OutOfRangeIds, RandomIds
from objdebug.stages.stress.long_inputs import LongInputs
from objdebug.stages.stress.long_objective import LongObjective
from objdebug.stages.stress.over_smoothing import OverSmoothing
from objdebug.stages.stress.padding_invariance import PaddingInvariance
from objdebug.stages.stress.low_precision import (ExtremeLogits, LossScaleGradient, LowPrecision,
    TrainedPrecision)


def checks() -> list[Check]:
    # Cheap cases first; the long objective late (it holds the most memory); the out-of-range
    # probes after every check that calls the shared graphs: a probe that is rejected leaves its
    # graph to compile again if called again (garbage_ids.py). Long inputs last: their lengths
    # run on graphs of their own, in a process of their own started when the stage starts, beside
    # the probes' fixed waits; their short reference is taken then too (long_inputs.py).
    return [AllPadding(), PaddingInvariance(), RandomIds(), ExtremeLogits(),
            LowPrecision(), Determinism(), OverSmoothing(), LongObjective(),
            TrainedPrecision(), LossScaleGradient(),  # [run] amp_level / loss_scale (skipped at O0)
            OutOfRangeIds(), LongInputs()]
