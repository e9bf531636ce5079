"""The machine's and a process's memory as Linux reports it (/proc); None / 0 where there is none.

One reader for the engine's graph release, the isolation watch and the stress stage's guards.
"""

from __future__ import annotations


def _meminfo(field: str) -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def available_bytes() -> int | None:
    """MemAvailable: what can be allocated without swapping (None where there is no /proc)."""
    return _meminfo("MemAvailable")


def total_bytes() -> int | None:
    return _meminfo("MemTotal")


def rss_bytes(pid: int | str = "self") -> int:
    """A process's resident set now (0 where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0
