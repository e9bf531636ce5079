"""What differs between the MindSpore releases objdebug supports (2.7 to 2.10), in one place.

Users do not choose their MindSpore: their Ascend image (and its CANN) and their MindFormers
release do (MindFormers 1.6-1.8 pair with 2.7.x, 1.9 with 2.9.0, 2.0 with 2.10.0). So objdebug
never asks for one version (pyproject.toml admits the range) and every internal it reaches is
looked up here, per version, instead of assuming the newest layout.

Measured differences (this project's CI runs 2.10 in full and a subset on 2.7.2):
- the graph executor and the per-process compile counters live in `mindspore.graph.api` from 2.9
  on (2.9.0, 2.10.0 measured); before, in `mindspore.common.api` (2.7.2 measured). 2.9 and 2.10
  keep the old name as a deprecated alias that logs a warning on import, so the new one is tried
  first. A failed lookup had turned the compile cache off for every run on 2.7 ("this process
  already compiled graphs").
- `mindspore.set_device` raises once a kernel has run in the process on 2.7, even for the same
  device; `runtime.setup` accepts that case on every release.
- the compile cache (`[run]`'s default ./.objdebug_cache) is wrong on 2.7.0: a second run in the
  same folder loaded compiled graphs that raised at run time (`For 'Gather', the 'input_indices'
  should be in the range [0, 256), but got 256` in the demo's align and grad graphs: another
  graph's code for the key), where 2.7.1, 2.7.2, 2.9.0 and 2.10.0 hit all 13 of the demo's graphs
  with the cold run's verdicts. So the cache is refused below `CACHE_FROM`, in one line the report
  shows.
"""

from __future__ import annotations

import functools
from typing import Any

SUPPORTED = ((2, 7), (2, 10))  # the oldest and the newest minor release, inclusive


def parse(version: str) -> tuple[int, int]:
    """'2.7.1.post1' -> (2, 7); anything unreadable -> (0, 0)."""
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


CACHE_FROM = (2, 7, 1)  # the oldest release whose compile cache gave a warm run its cold verdicts


def parse_patch(version: str) -> tuple[int, int, int]:
    """'2.7.1.post1' -> (2, 7, 1); '2.10.0rc1' -> (2, 10, 0); unreadable parts -> 0."""
    out = []
    for part in (version.split(".") + ["0", "0", "0"])[:3]:
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        out.append(int(digits) if digits else 0)
    return out[0], out[1], out[2]


def cache_refusal(version: str) -> str:
    """'' where MindSpore `version`'s compile cache can be used, else one line saying why not."""
    if parse_patch(version) >= CACHE_FROM:
        return ""
    low = ".".join(map(str, CACHE_FROM))
    return (f"not on MindSpore {version}: its compile cache loaded another graph's compiled code on a "
            f"second run (measured on 2.7.0); {low} and later cache")


def installed() -> str:
    # runtime imports this module; importing runtime back would be a cycle. By the time a run asks,
    # runtime.import_mindspore has imported MindSpore under its signal guard, so this is a lookup.
    import mindspore

    return str(mindspore.__version__)


def unsupported_reason(version: str) -> str:
    """'' for a release in the supported range, else one line saying what to install."""
    got = parse(version)
    low, high = SUPPORTED
    if low <= got <= high:
        return ""
    return (f"MindSpore {version} is outside the range objdebug supports "
            f"({low[0]}.{low[1]} to {high[0]}.{high[1]}); install one of those")


@functools.lru_cache(maxsize=1)
def graph_api() -> Any:
    """The module holding `_cell_graph_executor`, `ms_compile_cache`, `cells_compile_cache` and
    `entry_script_path`: `mindspore.graph.api` (2.9+) or `mindspore.common.api` (before 2.9)."""
    try:
        from mindspore.graph import api
    except ImportError:  # before MindSpore 2.9
        from mindspore.common import api
    return api
