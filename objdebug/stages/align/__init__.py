"""Stage 1, align: the objective must rank good < medium < bad answers to the same prompt.

Each answer is scored by the user's objective on prompt + answer, with prompt and padding
positions labelled `label_pad_id` as the user's data pipeline would label them. Codes OBJ1xx.

This module is the stage's face: one module per check family (alignment.py OBJ101-OBJ104,
label_pad_masking.py OBJ105, synthesized_sanity.py OBJ106; the task kinds' classification.py
OBJ110 and task_order.py OBJ111 / OBJ112), their shared pieces in _common.py.
"""

from __future__ import annotations

from objdebug.core.findings import Check
from objdebug.stages.align.alignment import AlignmentLoss
from objdebug.stages.align.label_pad_masking import LabelPadMasking
from objdebug.stages.align.synthesized_sanity import SynthesizedSanity

__all__ = ["AlignmentLoss", "LabelPadMasking", "SynthesizedSanity", "checks"]


def checks() -> list[Check]:
    from objdebug.stages.align.classification import ClassRanking  # [task] kinds (issue 47)
    from objdebug.stages.align.task_order import PairRanking, TagRanking

    return [AlignmentLoss(), LabelPadMasking(), SynthesizedSanity(), ClassRanking(), TagRanking(),
            PairRanking()]
