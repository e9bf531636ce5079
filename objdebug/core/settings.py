"""One profile section, read strictly: every default lives in checks/default.toml and nowhere else.

Profiles are merged over default.toml (`objdebug.pipeline.profile`), so every key a check reads is present;
a key that is not there is a bug in objdebug (a check reading a setting nobody declared), not a
user error. `Settings` therefore has no fallback: `th["gap_pass"]` or `th.get("gap_pass")` raise
`MissingSetting` naming the section and key, and `get(key, default)` is refused, so a default can
never creep back into the code.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


class MissingSetting(KeyError):
    """An internal error: the code read a profile key that checks/default.toml does not declare."""

    def __str__(self) -> str:  # KeyError quotes its message; this one is a sentence
        return str(self.args[0])


class Settings(Mapping):
    """A read-only, strict view of one profile section (`[align]`, `[stress]`, ...)."""

    def __init__(self, section: str, data: Mapping[str, Any] | None = None):
        self.section = section
        self._data = dict(data or {})

    def __getitem__(self, key: str) -> Any:
        try:
            return self._data[key]
        except KeyError:
            raise MissingSetting(f"[{self.section}] {key} missing from checks/default.toml") from None

    def get(self, key: str, *default: Any) -> Any:
        if default:
            raise TypeError(f"For 'Settings.get', a default is not allowed (the default of [{self.section}] "
                            f"{key} belongs in checks/default.toml), but got {default[0]!r}.")
        return self[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"Settings([{self.section}] {self._data!r})"

    def replace(self, **changes: Any) -> "Settings":
        """A copy with some keys changed (tests, the monitor's explicit overrides)."""
        return Settings(self.section, {**self._data, **changes})
