"""llama.cpp with its RPC backend: the installed llama-cpp-python with libggml rebuilt with it.

scripts/_env.sh builds llama-cpp-python with ``GGML_RPC=ON`` (``localinfer worker`` and
``--rpc`` need it), but a venv made before that has a libggml without the RPC backend. Rather
than rebuild the whole package, this compiles the same version's ``ggml`` and ``ggml-rpc``
targets with the flags the install used plus ``GGML_RPC=ON`` (the registry in libggml registers
the RPC backend only when built with it) and lays them into a copy of the installed package; a
process with that directory first on PYTHONPATH imports it instead. libllama is unchanged: it
finds the RPC backend through ggml's registry.

Kept in the user's cache keyed by version and flags, like llamacpp_avx2's build.

    python -m bench.llamacpp_rpc     # build if missing; print the directory
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from bench.cached_build import CachedBuild, copy_installed_package
from bench.llamacpp_avx2 import pythonpath_with
from bench.llamacpp_source import BuildFailed, cmake_build, fetch_source, installed_version

__all__ = ["BuildFailed", "pythonpath_with"]

ROOT = Path(__file__).resolve().parent.parent
LIBRARY_ONLY = ROOT / "scripts" / "cmake" / "llamacpp-library-only.cmake"
CMAKE_ARGS = "-DGGML_RPC=ON -DGGML_RPC_RDMA=OFF -DLLAVA_BUILD=OFF"
BUILD_ENV = "LOCALINFER_LLAMACPP_RPC_DIR"  # overrides where the build lives
MARKER = "localinfer-rpc-build.txt"  # written last: a directory without it is unfinished
# What the build replaces or adds in the copied package's lib folder.
LIBRARIES = ("libggml.so", "libggml-base.so", "libggml-cpu.so", "libggml-rpc.so")


SPEC = CachedBuild("llamacpp-rpc", CMAKE_ARGS, MARKER, env=BUILD_ENV)


def ensure_built(log: Callable[[str], None] = print) -> Path:
    """The RPC build's site directory, building it first when missing (cached_build: one
    builder at a time, renamed into place when finished); BuildFailed if cmake fails."""

    def fill(version: str, work: Path, staged: Path) -> None:
        _lay_in(copy_installed_package(staged), _build(version, work))

    return SPEC.ensure(installed_version(), fill, "ggml with its RPC backend", log)


def _build(version: str, work: Path) -> Path:
    source = fetch_source(version, work)
    build = work / "build"
    options = [f"-DCMAKE_PROJECT_llama.cpp_INCLUDE={LIBRARY_ONLY}", *CMAKE_ARGS.split()]
    # libggml links each backend it registers, ggml-rpc among them: one target builds both.
    cmake_build(source, build, options, "ggml", os.cpu_count() or 2)
    return build


def _lay_in(lib: Path, build: Path) -> None:
    """Each library in LIBRARIES, with its version-named files and links, copied from the build
    over the package's own (ggml's run path is $ORIGIN, so the others find it there)."""
    for name in LIBRARIES:
        built = sorted(build.rglob(f"{name}*"))
        files = [p for p in built if p.is_file() and not p.is_symlink()]
        if not files:
            raise BuildFailed(f"the build made no {name}")
        for old in lib.glob(f"{name}*"):
            old.unlink()
        for path in built:
            target = lib / path.name
            if path.is_symlink():
                target.symlink_to(os.readlink(path))
            else:
                shutil.copy2(path, target)


def main() -> int:
    try:
        print(ensure_built(log=lambda line: print(line, file=sys.stderr)))
    except BuildFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
