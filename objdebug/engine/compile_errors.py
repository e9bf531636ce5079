"""Graph-compile errors in one line that names the user's file:line.

MindSpore's compile failures are 40-80 lines; `compile_error()` reduces one to
'file:line: graph mode cannot compile the target: reason' (the full text kept for --debug).
Used by the contract probe and by `[run] amp_level`'s probe.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from typing import Any

from objdebug.core.errors import InputError
from objdebug.core.locations import user_frame

_UNSUPPORTED = re.compile(r"Unsupported (?:statement|syntax) '(\w+)'")


class ContractError(InputError):
    """An InputError with MindSpore's full text kept for --debug."""

    def __init__(self, message: str, detail: str | None = None):
        super().__init__(message)
        self.detail = detail


# --------------------------------------------------------------------------- compile errors
def _is_graph_error(text: str) -> bool:
    return "The Traceback of Net Construct Code" in text or bool(_UNSUPPORTED.search(text))


def first_line(text: str) -> str:
    for line in text.strip().splitlines():
        if line.strip() and not line.startswith("-"):
            return line.strip()
    return ""


def _statement_in(cells: list[Any], kind: str) -> tuple[str, int] | None:
    """file:line of the first `kind` statement (e.g. 'Try') in the construct of the user's Cells:
    MindSpore names only the call site of the Cell it could not parse."""
    node_type = getattr(ast, kind, None)
    if node_type is None:
        return None
    for cell in cells:
        fn = getattr(type(cell), "construct", None)
        try:
            lines, start = inspect.getsourcelines(fn)
            path = inspect.getsourcefile(fn)
        except (OSError, TypeError):
            continue
        tree = ast.parse(textwrap.dedent("".join(lines)))
        for node in ast.walk(tree):
            if isinstance(node, node_type):
                return str(path), start + node.lineno - 1
    return None


def user_cells(target) -> list[Any]:
    cells = []
    for root in (target.objective, target.model):
        if root is not None:
            cells += [c for _, c in root.cells_and_names()]
    return cells


def compile_error(exc: BaseException, target=None) -> ContractError | None:
    """A graph-compile failure -> one line 'file:line: graph mode cannot compile ...: reason'."""
    text = str(exc)
    if not _is_graph_error(text):
        return None
    where = user_frame(text)
    unsupported = _UNSUPPORTED.search(text)
    if unsupported and target is not None:
        where = _statement_in(user_cells(target), unsupported.group(1)) or where
    prefix = f"{where[0]}:{where[1]}: " if where else ""
    return ContractError(f"{prefix}graph mode (mindspore.GRAPH_MODE) cannot compile the target: "
                         f"{first_line(text)} (run with --debug for MindSpore's full message)",
                         detail=text)
