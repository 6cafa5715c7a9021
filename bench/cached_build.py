"""A build of the installed llama-cpp-python's llama.cpp kept in the user's cache, as the
benchmarks and tests keep several (llamacpp_avx2, llamacpp_rpc, llama_mtmd_cli): a folder keyed
by the version and the flags, finished when its marker file says so (written last), built by one
process at a time (a lock beside it) in a sibling folder renamed into place, so no process ever
uses a half-made build.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from bench.llamacpp_source import PACKAGE, BuildFailed, dev_cache, locked

# fill(version, work, staged): make the build in ``work`` and put what the folder holds in
# ``staged`` (created by fill).
Fill = Callable[[str, Path, Path], None]


@dataclass(frozen=True, slots=True)
class CachedBuild:
    prefix: str  # the folder's name starts with it: "llamacpp-avx2"
    cmake_args: str
    marker: str  # the file written last
    env: str | None = None  # a variable naming the folder instead
    product: str | None = None  # a file the finished folder must hold (a binary)

    def folder(self, version: str) -> Path:
        override = os.environ.get(self.env) if self.env else None
        if override:
            return Path(override).expanduser()
        key = hashlib.sha256(f"{version} {self.cmake_args}".encode()).hexdigest()[:10]
        return dev_cache() / f"{self.prefix}-{version}-{key}"

    def marker_text(self, version: str) -> str:
        product = f"{self.product}\n" if self.product else ""
        return f"{PACKAGE} {version}\n{product}CMAKE_ARGS={self.cmake_args}\n"

    def is_built(self, folder: Path, version: str) -> bool:
        """A finished build of ``version`` with these flags (an override folder may hold
        another version's: the marker says which)."""
        marker = folder / self.marker
        finished = marker.is_file() and marker.read_text() == self.marker_text(version)
        return finished and (self.product is None or (folder / self.product).is_file())

    def ensure(
        self, version: str | None, fill: Fill, what: str, log: Callable[[str], None]
    ) -> Path:
        """The finished folder for ``version`` (the installed llama-cpp-python's: None when it
        is not installed), made first by ``fill`` when missing (``what`` names it in the one log
        line); BuildFailed when there is nothing to build or the build fails."""
        if version is None:
            raise BuildFailed(f"{PACKAGE} is not installed: nothing to build")
        folder = self.folder(version)
        if self.is_built(folder, version):
            return folder
        folder.parent.mkdir(parents=True, exist_ok=True)
        with locked(folder.parent / f"{folder.name}.lock"):
            if self.is_built(folder, version):  # built by the process that held the lock
                return folder
            log(f"building {what} from {PACKAGE} {version}'s llama.cpp into {folder} (once)")
            with tempfile.TemporaryDirectory(prefix=f"{self.prefix}-", dir=folder.parent) as tmp:
                staged = Path(tmp) / "site"
                fill(version, Path(tmp), staged)
                (staged / self.marker).write_text(self.marker_text(version))
                shutil.rmtree(folder, ignore_errors=True)  # an older or unfinished build
                staged.rename(folder)
        return folder


def installed_package() -> Path:
    """The installed llama_cpp package folder (not whatever PYTHONPATH puts first)."""
    folder = Path(str(metadata.distribution(PACKAGE).locate_file("llama_cpp")))
    if not (folder / "lib").is_dir():
        raise BuildFailed(f"{PACKAGE} has no llama_cpp/lib at {folder}")
    return folder


def copy_installed_package(staged: Path) -> Path:
    """The installed llama_cpp package copied to ``staged/llama_cpp``; its lib folder."""
    shutil.copytree(installed_package(), staged / "llama_cpp", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    return staged / "llama_cpp" / "lib"
