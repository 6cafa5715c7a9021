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

import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench.llamacpp_avx2 import installed_package
from bench.llamacpp_source import (
    PACKAGE,
    BuildFailed,
    cmake_build,
    dev_cache,
    fetch_source,
    installed_version,
    locked,
)

ROOT = Path(__file__).resolve().parent.parent
LIBRARY_ONLY = ROOT / "scripts" / "cmake" / "llamacpp-library-only.cmake"
CMAKE_ARGS = "-DGGML_RPC=ON -DGGML_RPC_RDMA=OFF -DLLAVA_BUILD=OFF"
BUILD_ENV = "LOCALINFER_LLAMACPP_RPC_DIR"  # overrides where the build lives
MARKER = "localinfer-rpc-build.txt"  # written last: a directory without it is unfinished
# What the build replaces or adds in the copied package's lib folder.
LIBRARIES = ("libggml.so", "libggml-base.so", "libggml-cpu.so", "libggml-rpc.so")


def build_dir(version: str) -> Path:
    override = os.environ.get(BUILD_ENV)
    if override:
        return Path(override).expanduser()
    key = hashlib.sha256(f"{version} {CMAKE_ARGS}".encode()).hexdigest()[:10]
    return dev_cache() / f"llamacpp-rpc-{version}-{key}"


def marker_text(version: str) -> str:
    return f"{PACKAGE} {version}\nCMAKE_ARGS={CMAKE_ARGS}\n"


def is_built(site: Path, version: str) -> bool:
    marker = site / MARKER
    return marker.is_file() and marker.read_text() == marker_text(version)


def ensure_built(log: Callable[[str], None] = print) -> Path:
    """The RPC build's site directory, building it first when missing (one builder at a time,
    staged beside it and renamed into place when finished); BuildFailed if cmake fails."""
    version = installed_version()
    if version is None:
        raise BuildFailed(f"{PACKAGE} is not installed: nothing to build a second copy of")
    site = build_dir(version)
    if is_built(site, version):
        return site
    site.parent.mkdir(parents=True, exist_ok=True)
    with locked(site.parent / f"{site.name}.lock"):
        if is_built(site, version):
            return site
        log(f"building {PACKAGE} {version}'s ggml with its RPC backend into {site} (once)")
        with tempfile.TemporaryDirectory(prefix="llamacpp-rpc-", dir=site.parent) as tmp:
            staged = Path(tmp) / "site"
            shutil.copytree(installed_package(), staged / "llama_cpp", symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
            build = _build(version, Path(tmp))
            _lay_in(staged / "llama_cpp" / "lib", build)
            (staged / MARKER).write_text(marker_text(version))
            shutil.rmtree(site, ignore_errors=True)
            staged.rename(site)
    return site


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


def pythonpath_with(site: Path, current: str | None) -> str:
    return os.pathsep.join([str(site), *([current] if current else [])])


def main() -> int:
    try:
        print(ensure_built(log=lambda line: print(line, file=sys.stderr)))
    except BuildFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
