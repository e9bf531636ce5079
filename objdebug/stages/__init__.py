"""The stages, in pipeline order. Each module exposes `checks() -> list[Check]`."""

from __future__ import annotations

import importlib

STAGES = ("align", "grad", "invariants", "decompose", "correlate", "stress")


def stage_checks(name: str) -> list:
    if name not in STAGES:
        from objdebug.errors import InputError

        raise InputError(f"For '--stages', each stage must be in {list(STAGES)}, but got '{name}'.")
    return importlib.import_module(f"objdebug.stages.{name}").checks()
