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


def status_bytes(field: str, pid: int | str = "self") -> int | None:
    """A size field of /proc/PID/status ("VmRSS", "VmHWM") in bytes; None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def rss_bytes(pid: int | str = "self") -> int:
    """A process's resident set now (0 where it cannot be read)."""
    return status_bytes("VmRSS", pid) or 0


# The process's peak resident set over a run. The stress stage resets the kernel's high-water mark
# (/proc/self/clear_refs) to measure one call's peak, so the peak before each reset is kept here.
_peaks = {"self": 0, "isolated": 0}


def _hwm_bytes() -> int:
    return status_bytes("VmHWM") or 0


def before_hwm_reset() -> None:
    """Call before resetting the high-water mark: the peak so far is kept."""
    _peaks["self"] = max(_peaks["self"], _hwm_bytes())


def isolated_peak(rss: int) -> None:
    """The largest resident set a measurement's own process reached (pipeline/isolation.py)."""
    _peaks["isolated"] = max(_peaks["isolated"], int(rss))


def run_peaks() -> dict[str, int]:
    """{"peak_rss_bytes": this process's peak, "isolated_peak_rss_bytes": its children's} so far."""
    return {"peak_rss_bytes": max(_peaks["self"], _hwm_bytes()),
            "isolated_peak_rss_bytes": _peaks["isolated"]}


def start_run() -> None:
    """A run starts: its peaks are its own (the high-water mark reset where Linux allows it)."""
    _peaks.update(self=0, isolated=0)
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
    except OSError:
        pass
