"""llama.cpp's own C++ ``llama-server``, built once per machine from the installed
llama-cpp-python's sources, so the peer and localinfer's llama.cpp runner run the same llama.cpp.

It is what a user would run instead of ``localinfer serve`` on the same GGUF. The sdist of the
installed version (pip download; the package index is all it needs) holds llama.cpp at
``vendor/llama.cpp``; only the ``llama-server`` target is built, statically linked, so the one
binary is all that is kept. Two variants:

- ``native``: ``GGML_NATIVE=ON``, as pip built the installed package for this CPU;
- ``avx2``: the AVX2 laptop set of llamacpp_avx2.CMAKE_ARGS (no AVX-512, VNNI or AMX), to compare
  with localinfer running as on such a CPU (bench/as_avx2.py).

Each lives in the user's cache keyed by version and flags (llamacpp_source), with a marker written
last and the build's seconds beside it.

    python -m bench.llama_server [--variant avx2]   # build if missing; print the binary
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import llamacpp_avx2
from bench.llamacpp_source import (
    PACKAGE,
    BuildFailed,
    cmake_build,
    dev_cache,
    fetch_source,
    installed_version,
    locked,
)

# Offline and self-contained: no curl/OpenSSL (the peer serves plain HTTP on localhost), no web
# UI (its assets would be fetched from a bucket at build time), static libraries (one binary).
COMMON_ARGS = (
    "-DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF "
    "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON "
    "-DBUILD_SHARED_LIBS=OFF"
)
VARIANTS = {"native": "-DGGML_NATIVE=ON", "avx2": llamacpp_avx2.CMAKE_ARGS}
BINARY = "llama-server"
MARKER = "localinfer-llama-server-build.txt"  # written last: without it, an unfinished build
SECONDS = "build-seconds.txt"


def cmake_args(variant: str) -> str:
    if variant not in VARIANTS:
        raise ValueError(f"unknown llama-server variant '{variant}' (one of {', '.join(VARIANTS)})")
    return f"{COMMON_ARGS} {VARIANTS[variant]}"


def build_dir(version: str, variant: str) -> Path:
    """Where ``variant``'s llama-server of ``version`` lives: one folder per version and flags."""
    key = hashlib.sha256(f"{version} {cmake_args(variant)}".encode()).hexdigest()[:10]
    return dev_cache() / f"llama-server-{variant}-{version}-{key}"


def marker_text(version: str, variant: str) -> str:
    return f"{PACKAGE} {version}\nllama-server {variant}\nCMAKE_ARGS={cmake_args(variant)}\n"


def is_built(folder: Path, version: str, variant: str) -> bool:
    marker = folder / MARKER
    finished = marker.is_file() and marker.read_text() == marker_text(version, variant)
    return finished and (folder / BINARY).is_file()


def build_seconds(folder: Path) -> float | None:
    """How long the build in ``folder`` took (the download included), when it says."""
    try:
        return float((folder / SECONDS).read_text())
    except (OSError, ValueError):
        return None


def ensure_built(variant: str = "native", log: Callable[[str], None] = print) -> Path:
    """The llama-server binary of ``variant``, built first when missing; BuildFailed otherwise.

    One build at a time per folder (a lock beside it), made in a sibling folder and renamed into
    place once finished, so no run ever starts a half-copied binary.
    """
    version = installed_version()
    if version is None:
        raise BuildFailed(f"{PACKAGE} is not installed: no llama.cpp version to build")
    folder = build_dir(version, variant)
    if is_built(folder, version, variant):
        return folder / BINARY
    folder.parent.mkdir(parents=True, exist_ok=True)
    with locked(folder.parent / f"{folder.name}.lock"):
        if is_built(folder, version, variant):  # built by the process that held the lock
            return folder / BINARY
        jobs = os.cpu_count() or 2
        log(f"building llama-server ({variant}) from {PACKAGE} {version}'s llama.cpp into "
            f"{folder} (once; minutes with {jobs} jobs)")  # fmt: skip
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="llama-server-", dir=folder.parent) as tmp:
            work = Path(tmp)
            source = fetch_source(version, work) / "vendor" / "llama.cpp"
            build = work / "build"
            cmake_build(source, build, cmake_args(variant).split(), BINARY, jobs)
            built = build / "bin" / BINARY
            if not built.is_file():
                raise BuildFailed(f"the build made no {built}")
            staged = work / "out"
            staged.mkdir()
            shutil.copy2(built, staged / BINARY)
            seconds = time.perf_counter() - start
            (staged / SECONDS).write_text(f"{seconds:.1f}\n")
            (staged / MARKER).write_text(marker_text(version, variant))
            shutil.rmtree(folder, ignore_errors=True)  # an older or unfinished build
            staged.rename(folder)
        log(f"built llama-server ({variant}) in {seconds:.0f} s")
    return folder / BINARY


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.llama_server", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--variant", choices=sorted(VARIANTS), default="native")
    args = p.parse_args()
    try:
        binary = ensure_built(args.variant, log=lambda line: print(line, file=sys.stderr))
    except BuildFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    seconds = build_seconds(binary.parent)
    if seconds is not None:
        print(f"llama-server ({args.variant}): its build took {seconds:.0f} s", file=sys.stderr)
    print(binary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
