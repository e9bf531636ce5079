"""The packing stage: several documents packed into one training sequence, as `[packing]`
describes the pipeline, on the real model and objective (runs only when `[packing]` is set).
Codes OBJ9xx:

- OBJ901 isolation: a document's tokens changed, the other documents' per-token losses and logit
  gradients do not move (TRL #1230 / PR #3526, MeetKai/functionary #265);
- OBJ902 same as unpacked: each document's per-token losses packed equal its losses alone;
- OBJ903 boundary labels: the position before a document does not train on its first token;
- OBJ904 normalisation: the packed batch's loss weighs tokens as the unpacked batch does.

The measurement (`_common.py`) is made once and shared; the end-to-end form has no
logits and `[packing]` refuses it (exit 2).
"""

from __future__ import annotations

from objdebug.core.findings import Check
from objdebug.stages.packing.boundary_labels import PackingBoundaryLabels
from objdebug.stages.packing.isolation import PackingIsolation
from objdebug.stages.packing.normalisation import PackingNormalisation
from objdebug.stages.packing.unpacked import PackingUnpacked


def checks() -> list[Check]:
    return [PackingIsolation(), PackingUnpacked(), PackingBoundaryLabels(), PackingNormalisation()]
