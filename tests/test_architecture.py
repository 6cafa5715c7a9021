"""The parts of docs/design.md's import contract that import-linter does not check, read from the
source (AST). The layers and the rules on the engine and the backends are import-linter contracts
in pyproject.toml, checked by scripts/check-imports (docs/layers.md).

- No import cycles anywhere: module-level imports, imports inside functions and imports under
  ``if TYPE_CHECKING:`` alike.
- No source file over 400 lines, no function over 80; the harness in ``bench/`` too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = {"localinfer": ROOT / "localinfer", "localinfer.backends": ROOT / "backends"}
# Held to the size rule but outside the import contract: the harness drives backends directly.
HARNESS_DIRS = {"bench": ROOT / "bench"}
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80


@dataclass(frozen=True, slots=True)
class SourceModule:
    name: str  # dotted, as installed: backends/torch/x.py -> localinfer.backends.torch.x
    path: Path
    tree: ast.Module


def _modules(dirs: dict[str, Path] = PACKAGE_DIRS) -> dict[str, SourceModule]:
    out: dict[str, SourceModule] = {}
    for prefix, folder in dirs.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([prefix, *parts])
            out[name] = SourceModule(name, path, ast.parse(path.read_text(), str(path)))
    return out


MODULES = _modules()
SIZED = {**MODULES, **_modules(HARNESS_DIRS)}


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement: module level, inside functions, and under ``if TYPE_CHECKING:``
    (a cycle that only type hints close still ties the modules together)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def _known(name: str) -> str | None:
    """The longest prefix of ``name`` that is one of our modules (None: a third-party name)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def imports_of(module: SourceModule) -> set[str]:
    """Our modules that ``module`` imports, at run time or for type checking."""
    package = module.name if module.path.name == "__init__.py" else module.name.rpartition(".")[0]
    found: set[str] = set()
    for node in _import_nodes(module.tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for target in targets:
            known = _known(target)
            if known is not None and known != module.name:
                found.add(known)
    return found


GRAPH = {name: imports_of(module) for name, module in MODULES.items()}


def test_the_walker_sees_imports_inside_functions_and_under_type_checking() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "import localinfer.errors\n"
        "if TYPE_CHECKING:\n    from localinfer.session import Session\n"
        "def f():\n    from localinfer.resolve import resolve_model\n"
    )
    probe = SourceModule("localinfer.probe", ROOT / "localinfer" / "probe.py", tree)
    want = {"localinfer.errors", "localinfer.session", "localinfer.resolve"}
    assert imports_of(probe) == want


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
    return groups


def test_cycle_finder_finds_a_loop() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    # A package imports its own __init__ implicitly; only the edges written in source count.
    groups = _cycles(GRAPH)
    assert not groups, "\n".join(" <-> ".join(group) for group in groups)


@pytest.mark.parametrize("module", sorted(SIZED), ids=str)
def test_source_files_and_functions_stay_small(module: str) -> None:
    source = SIZED[module]
    lines = len(source.path.read_text().splitlines())
    assert lines <= MAX_FILE_LINES, f"{source.path}: {lines} lines"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(source.tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{source.path}: " + ", ".join(long)
