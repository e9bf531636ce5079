"""A graph MindSpore cannot save in its compile cache: run again without the cache (issue 23).

MindSpore 2.10 refuses to export a graph that holds a `PyExecute` node (graph-mode fallback:
`.asnumpy()`, a Python call inside construct): with the compile cache on, that compile raises
"Cannot export a PyExecute CNode in MindIR", and the target, valid with `--no-cache`, failed.
MindSpore reads its cache switch once per process, so the cache cannot be turned off for the rest
of this process: the CLI re-executes the same command line with the cache off, after every
cleanup of this process ran (scratch folder, cache lock, report temporaries). A cache may only
ever cost compiles.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

MARKER = "Cannot export a PyExecute CNode"
FALLBACK_ENV = "OBJDEBUG_CACHE_FALLBACK"  # set in the re-executed process: no cache at all


class CacheUnusable(BaseException):
    """A compile failed only because the compile cache is on (a BaseException, so a check's
    `except Exception` cannot turn it into an ERROR finding)."""

    def __init__(self, graph: str):
        super().__init__(graph)
        self.graph = graph


def caused_by_cache(exc: BaseException) -> bool:
    """True when `exc` (or what it wraps) is MindSpore refusing to export a graph for the cache,
    and this process runs with the cache on."""
    if os.environ.get("MS_COMPILER_CACHE_ENABLE") != "1" or os.environ.get(FALLBACK_ENV):
        return False
    seen = 0
    while exc is not None and seen < 8:
        if MARKER in str(exc) or MARKER in str(getattr(exc, "detail", "") or ""):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def in_fallback() -> bool:
    return bool(os.environ.get(FALLBACK_ENV))


def rerun_without_cache(graph: str) -> None:
    """Replace this process by the same command with the cache off (never returns)."""
    sys.stderr.write(f"objdebug: compile cache: MindSpore cannot save graph '{graph}' (PyExecute, "
                     f"graph-mode fallback); running again without the cache\n")
    sys.stderr.flush()
    sys.stdout.flush()
    env = {k: v for k, v in os.environ.items()
           if k not in ("MS_COMPILER_CACHE_ENABLE", "MS_COMPILER_CACHE_PATH")}
    env[FALLBACK_ENV] = "1"
    os.execve(sys.executable, list(sys.orig_argv), env)


@contextlib.contextmanager
def rerun_when_the_cache_fails() -> Iterator[None]:
    """A compile that failed only because the compile cache is on (MindSpore cannot save a graph
    that uses graph-mode fallback): the same command again with the cache off. A cache may only
    ever cost compiles."""
    try:
        yield
    except CacheUnusable as exc:
        rerun_without_cache(exc.graph)
    except Exception as exc:
        if caused_by_cache(exc):
            rerun_without_cache("?")
        raise
