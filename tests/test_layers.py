"""The package's shape: layers import only downward, no import cycle between files, a stage never
imports another stage, a small package root and a thin CLI (docs/architecture.md).

The import graph is read from the source (module level and inside functions; imports under
`if TYPE_CHECKING:` are type annotations only and do not count), the way the before-stop hook reads it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "objdebug"

# bottom to top: a module may import its own layer and the layers below it, never one above
LAYERS: tuple[tuple[str, ...], ...] = (
    ("objdebug.rules",),                                   # the codes' pages (no imports)
    ("objdebug.core",),                                    # findings, settings, config, errors, ...: no MindSpore
    ("objdebug.report",),                                  # serializers of the report dict
    ("objdebug.engine",),                                  # everything that becomes a MindSpore call
    ("objdebug.pipeline",),                                # context, contract, runner, shared run data
    ("objdebug.stages",),                                  # one package per stage
    ("objdebug.monitor", "objdebug.losses", "objdebug.demo"),
    ("objdebug.api", "objdebug.init", "objdebug.init_model_io"),  # the library's entry points
    ("objdebug.cli", "objdebug.supervisor"),              # the command (and the process it runs in)
)
MAX_ROOT_MODULES = 10
MAX_CLI_LINES = 250


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PKG.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        mods[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
    return mods


def import_graph() -> dict[str, set[str]]:
    """module -> the objdebug modules it imports (not counting `if TYPE_CHECKING:` blocks)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typing_only = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                typing_only.update(id(x) for stmt in node.body for x in ast.walk(stmt))
        for node in ast.walk(tree):
            if id(node) in typing_only or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.ImportFrom):
                base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
                pre = (".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
                       if node.level else node.module or "")
                names = [f"{pre}.{a.name}" for a in node.names] + [pre]
            else:
                names = [a.name for a in node.names]
            for name in names:
                while name and name not in mods:
                    name = name.rpartition(".")[0]
                if name and name not in (mod, "objdebug"):
                    graph[mod].add(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(a):
        index[a] = low[a] = counter[0]
        counter[0] += 1
        stack.append(a)
        on.add(a)
        for b in graph[a]:
            if b not in index:
                visit(b)
                low[a] = min(low[a], low[b])
            elif b in on:
                low[a] = min(low[a], index[b])
        if low[a] == index[a]:
            comp = []
            while True:
                b = stack.pop()
                on.discard(b)
                comp.append(b)
                if b == a:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for a in sorted(graph):
        if a not in index:
            visit(a)
    return out


def layer_of(module: str) -> int | None:
    for level, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return level
    return None


def stage_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "stages" else None


def test_no_import_cycle_between_files():
    assert cycles(import_graph()) == []


def test_every_module_has_a_layer():
    assert [m for m in import_graph() if m != "objdebug" and layer_of(m) is None] == []


def test_layers_import_only_downward():
    upward = [f"{m} -> {t}" for m, targets in import_graph().items() if m != "objdebug"
              for t in targets if layer_of(t) > layer_of(m)]
    assert upward == []


def test_a_stage_never_imports_another_stage():
    crossing = [f"{m} -> {t}" for m, targets in import_graph().items() for t in targets
                if stage_of(m) and stage_of(t) and stage_of(m) != stage_of(t)]
    assert crossing == []


def test_core_imports_no_mindspore_at_module_level():
    heavy = []
    for path in (PKG / "core").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                heavy += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "mindspore"]
    assert heavy == []


def test_a_small_package_root_and_a_thin_cli():
    root = sorted(p.name for p in PKG.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root
    assert len((PKG / "cli.py").read_text(encoding="utf-8").splitlines()) <= MAX_CLI_LINES


@pytest.mark.parametrize("source, expected", [
    ({"a": {"b"}, "b": {"a"}, "c": set()}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
])
def test_the_cycle_finder_finds_cycles(source, expected):
    assert cycles(source) == expected
