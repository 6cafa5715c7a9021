"""Every module the wheel ships is used by the shipped program itself.

A module that only scripts/ or the tests import belongs to the harness in bench/, which is not
installed. A shipped module counts as used when another shipped module reaches it: an import
statement (at module level or inside a function), or its dotted name as a string, which is how
modules are loaded by name (``importlib.import_module``, a child process run as
``python -m NAME`` through ``run_json_child``, lazy exports). An f-string names every module it
can spell (``f"localinfer.commands.{name}"``: each command). Package ``__init__`` files are
imported with any of their modules, and the console script named in pyproject.toml is the
program's own entry.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = {"localinfer": ROOT / "localinfer", "localinfer.backends": ROOT / "backends"}
# Reached from outside the shipped code, each for a reason of its own.
ENTRY_POINTS = {
    "localinfer.__main__": "`python -m localinfer`, run by the user",
}


def _shipped_modules() -> dict[str, tuple[Path, ast.Module]]:
    """Dotted name -> (file, tree) of every module the wheel ships, packages included."""
    out: dict[str, tuple[Path, ast.Module]] = {}
    for prefix, folder in SHIPPED.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([prefix, *parts])] = (path, ast.parse(path.read_text(), str(path)))
    return out


def _console_scripts() -> set[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {target.split(":")[0] for target in data["project"]["scripts"].values()}


def _names_in(
    name: str, path: Path, tree: ast.Module, tops: set[str]
) -> Iterator[str | re.Pattern[str]]:
    """Dotted names ``tree`` imports, its string constants, and as regexes its f-strings that
    start with a dotted name under one of ``tops``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value
        elif isinstance(node, ast.JoinedStr) and _spells_a_module(node, tops):
            yield re.compile(
                "".join(
                    re.escape(part.value) if isinstance(part, ast.Constant) else r"\w+"
                    for part in node.values
                )
            )


def _spells_a_module(node: ast.JoinedStr, tops: set[str]) -> bool:
    """An f-string that starts with a dotted name of ours (``f"pkg.commands.{name}"``), not any
    f-string whose pieces happen to fit a module name's shape (``f"{a}.{b}"``)."""
    first = node.values[0] if node.values else None
    if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
        return False
    return first.value.partition(".")[0] in tops and "." in first.value


def _unused(modules: dict[str, tuple[Path, ast.Module]], entries: set[str]) -> list[str]:
    """Modules no other module of ``modules`` reaches, entries and packages left out."""
    tops = {name.partition(".")[0] for name in modules}
    used: set[str] = set()
    for name, (path, tree) in modules.items():
        others = modules.keys() - {name}
        for found in _names_in(name, path, tree, tops):
            if isinstance(found, str):
                used |= {found} & others
            else:
                used |= {other for other in others if found.fullmatch(other)}
    return sorted(
        name
        for name, (path, _) in modules.items()
        if name not in used and name not in entries and path.name != "__init__.py"
    )


def test_every_shipped_module_is_used_by_the_program() -> None:
    modules = _shipped_modules()
    unused = _unused(modules, _console_scripts() | set(ENTRY_POINTS))
    assert not unused, (
        "imported by no shipped module (move what only scripts/ and tests use to bench/):\n"
        + "\n".join(f"{modules[name][0].relative_to(ROOT)} ({name})" for name in unused)
    )


def test_the_finder_sees_imports_names_and_fstrings(tmp_path: Path) -> None:
    sources = {
        "pkg.cli": "from pkg import engine\ndef f():\n    from .tools import hammer\n",
        "pkg.engine": "MOD = 'pkg.child'\nimportlib.import_module(f'pkg.cmd.{x}')\n",
        "pkg.tools.hammer": "",
        "pkg.child": "",
        "pkg.cmd.run": "",
        "pkg.cmd.stop": "",
        "pkg.orphan": "import pkg.engine\n",
        "pkg.dead": "",
        "pkg.lookalike": "",
        "pkg.shapes": "NAME = f'{a}.{b}'\n",
    }
    modules = {
        name: (tmp_path / (name.replace(".", "/") + ".py"), ast.parse(source))
        for name, source in sources.items()
    }
    modules["pkg.tools"] = (tmp_path / "pkg" / "tools" / "__init__.py", ast.parse(""))
    assert _unused(modules, {"pkg.cli", "pkg.shapes"}) == [
        "pkg.dead",
        "pkg.lookalike",
        "pkg.orphan",
    ]
