"""Stage 3, invariants: properties every correct objective has, each the subject of a bug that
shipped in a widely used project (the rule pages cite the reports). Codes OBJ7xx:

- OBJ701 label alignment: the configured label shift gives the clearly lowest loss on real text;
- OBJ702 logit-shift invariance: logits + c leave loss and gradient unchanged (float32 rounding);
- OBJ703 ignored positions: removing them changes neither loss nor gradient (mean / sum,
  smoothing, class weights);
- OBJ704 upstream gradient: grad(c·loss) = c·grad(loss), weighted sums of micro-batch losses;
- OBJ705 settings that do nothing: a perturbed setting must change loss or gradient;
- OBJ706 token weighting when micro-batch gradients are averaged (accumulation, data parallel);
- OBJ707 inputs written by the objective, OBJ708 training vs evaluation mode;
- OBJ709 rows emptied by truncation, OBJ710 the objective's value on rows with nothing scored.

Every verdict runs the user's objective in graph mode on the model's real logits for the grad
stage's batch (see _common.py); the graphs each check uses are in its docstring.
The end-to-end form (no logits) is skipped, except a library model whose output head objdebug
probes (engine/library_logits.py): OBJ701 and OBJ702 run on its own loss, the others say why not.
"""

from __future__ import annotations

from objdebug.core.findings import Check
from objdebug.stages.invariants.alignment import LabelAlignment
from objdebug.stages.invariants.ignored import IgnoredPositions
from objdebug.stages.invariants.logit_shift import LogitShift
from objdebug.stages.invariants.settings_used import SettingsUsed
from objdebug.stages.invariants.side_effects import SideEffects
from objdebug.stages.invariants.token_weighting import TokenWeighting
from objdebug.stages.invariants.truncation import EmptyAfterTruncation
from objdebug.stages.invariants.upstream import UpstreamGradient


def checks() -> list[Check]:
    return [SideEffects(), LabelAlignment(), LogitShift(), UpstreamGradient(), IgnoredPositions(),
            TokenWeighting(), EmptyAfterTruncation(), SettingsUsed()]
