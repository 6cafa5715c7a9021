"""Packaging: backends/ installs as localinfer.backends, and the package list matches the tree."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _declared_packages() -> set[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(data["tool"]["setuptools"]["packages"])


def _packages_on_disk() -> set[str]:
    found = set()
    for init in (ROOT / "localinfer").rglob("__init__.py"):
        rel = init.parent.relative_to(ROOT)
        found.add(".".join(rel.parts))
    for init in (ROOT / "backends").rglob("__init__.py"):
        rel = init.parent.relative_to(ROOT / "backends")
        found.add(".".join(("localinfer", "backends", *rel.parts)))
    return {p for p in found if "__pycache__" not in p}


def test_every_package_folder_is_declared() -> None:
    assert _packages_on_disk() == _declared_packages()


def test_backends_import_as_subpackage() -> None:
    import localinfer.backends.base as base

    assert Path(base.__file__).resolve() == ROOT / "backends" / "base.py"


def test_catalog_ships_inside_package() -> None:
    from importlib.resources import files

    assert (files("localinfer") / "models.toml").is_file()


def test_wheel_has_no_top_level_backends(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
    )
    (wheel,) = tmp_path.glob("localinfer-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not any(n.startswith("backends/") for n in names)
    assert "localinfer/backends/base.py" in names
    assert "localinfer/models.toml" in names
    assert "localinfer/backends/torch/cpu_kernels.c" in names  # compiled on first use
