"""Stage 0, batches: the user's real batches (`[data] batches`) against the real objective and the
declared conventions. Runs first when `[data] batches` is set and the run names no stages.
Codes OBJ01x:

- OBJ010 padding labels: the label value on padding (attention mask 0, or the pad run) is one
  the objective ignores — probed on the objective in graph mode (the source procedure's bug:
  labels padded with 0, `ignore_index = -100`);
- OBJ011 prompt labels: likewise on real tokens whose label is not the paired input token;
- OBJ012 conventions: `label_pad_id`, `pad_id`, `padding_side`, `bos_id`, `eos_id` vs the batches;
- OBJ013 label layout: unshifted or pre-shifted labels vs `[data] shift`;
- OBJ019 one shift: that layout plus the objective's measured pairing (labels[t] or labels[t+1])
  make exactly one shift (a double shift or none fails, naming both measurements);
- OBJ014 supervision: every row trains on something (supervised share per row);
- OBJ015 vocabulary: input ids and trained labels inside the model's vocabulary;
- OBJ016 attention mask: 0 exactly on the padding;
- OBJ017 / OBJ018 prompt boundary (rows matched to the align / scores prompts): the prompt's
  labels ignored, the answer's first token trained;
- OBJ020 EOS trained (with `eos_id`), OBJ021 the last real token not trained toward the pad id,
  OBJ022 position_ids reset after an EOS inside a row (`framing.py`);
- OBJ023-OBJ028 with `[chat]` (`chat_roles.py`, `chat_checks.py`): each row split into turns by
  role; the content and the stop token of each turn that trains trained, nothing else;
- OBJ030-OBJ035 on preference batches (chosen / rejected columns, `pair_checks.py`): the same
  prompt, prompt and padding masked in both, a scored response each, one BOS, the first response
  token scored, lens that agree.

The batches are read and measured once (`audit.py`); `show.py` prints rows as the checks see them.
"""

from __future__ import annotations

from objdebug.core.findings import Check
from objdebug.stages.batches.chat_checks import CHECKS as CHAT_CHECKS
from objdebug.stages.batches.pair_checks import CHECKS as PAIR_CHECKS
from objdebug.stages.batches.conventions import Conventions, LabelLayout, OneShift
from objdebug.stages.batches.framing import EosTrained, LastToken, PositionsAcrossEos
from objdebug.stages.batches.labels import PaddingLabels, PromptLabels
from objdebug.stages.batches.prompt import PromptBoundary
from objdebug.stages.batches.rows import AttentionMask, Supervision, Vocabulary


def checks() -> list[Check]:
    return [PaddingLabels(), PromptLabels(), Conventions(), LabelLayout(), OneShift(), PromptBoundary(),
            Supervision(), Vocabulary(), AttentionMask(), EosTrained(), LastToken(),
            PositionsAcrossEos()] + [c() for c in CHAT_CHECKS + PAIR_CHECKS]
