"""Packaging: backends/ installs as localinfer.backends, the package list matches the tree, and
building the wheel prints no setuptools warnings (every new user saw them on install)."""

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
    # Every folder is a package to setuptools, a folder of data files (no __init__.py) too: one
    # left out of the list is dropped from the wheel with a warning.
    found = {"localinfer", "localinfer.backends"}
    for folder in (ROOT / "localinfer").rglob("*/"):
        if folder.is_dir():
            found.add(".".join(folder.relative_to(ROOT).parts))
    for folder in (ROOT / "backends").rglob("*/"):
        if folder.is_dir():
            rel = folder.relative_to(ROOT / "backends")
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


def test_wheel_layout_and_a_build_without_warnings(tmp_path: Path) -> None:
    # Not quiet: pip shows the build backend's output, where setuptools' warnings go.
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr
    output = build.stdout + build.stderr
    assert "warning" not in output.lower(), output
    (wheel,) = tmp_path.glob("localinfer-*.whl")
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    assert not any(n.startswith("backends/") for n in names)
    assert not any(n.startswith("bench/") for n in names)  # the harness stays in the repo
    assert "localinfer/backends/base.py" in names
    assert "localinfer/models.toml" in names
    assert "localinfer/backends/torch/cpu_kernels.c" in names  # compiled on first use
    assert "localinfer/tui/chat.tcss" in names
    data = {p.name for p in (ROOT / "localinfer" / "data").iterdir()}
    assert data and all(f"localinfer/data/{name}" in names for name in data)
    metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
