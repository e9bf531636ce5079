"""What a check sees: the loaded target, the shared engine, thresholds, options and a cache."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from objdebug.config import Config
from objdebug.engine.core import Engine
from objdebug.profile import Profile
from objdebug.engine.target import Target


@dataclass
class Context:
    config: Config
    target: Target
    engine: Engine
    profile: Profile
    options: dict[str, Any] = field(default_factory=dict)   # stage options from the CLI/API
    out_dir: str | None = None                              # where figures go, when asked
    debug: bool = False
    cache: dict[str, Any] = field(default_factory=dict)     # shared between checks and stages

    def cached(self, key: str, compute):
        """Compute once per run: stages share loaded data and measurements."""
        if key not in self.cache:
            self.cache[key] = compute()
        return self.cache[key]

    def option(self, name: str, default: Any = None) -> Any:
        value = self.options.get(name)
        return default if value is None else value
