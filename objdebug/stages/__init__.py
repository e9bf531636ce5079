"""The stages: one package per stage, each exposing `checks() -> list[Check]`.

Which stages exist, their order and summaries are data in `objdebug.pipeline.registry`; this
module only finds a stage's checks. A stage never imports another stage: what two stages share
(the gradient batch, the logits of real rows) lives in `objdebug.pipeline.run_data`.
"""

from __future__ import annotations

import importlib

from objdebug.pipeline.registry import pipeline_order



def stage_checks(name: str) -> list:
    pipeline_order([name])
    return importlib.import_module(f"objdebug.stages.{name}").checks()
