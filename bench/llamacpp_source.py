"""The llama.cpp sources of the installed llama-cpp-python, built into the user's cache.

Shared by the builds the benchmarks keep (llamacpp_avx2: the CPU backend without AVX-512;
llama_server: llama.cpp's own C++ server): the same version's sdist fetched with pip, unpacked,
configured and built with cmake, one build at a time per directory, under the user's cache
(not LOCALINFER_CACHE_DIR, which tests point at throwaway folders), so both sides of a comparison
run the same llama.cpp.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

PACKAGE = "llama-cpp-python"


class BuildFailed(RuntimeError):
    """pip could not fetch, or cmake could not build, llama-cpp-python's llama.cpp."""


def installed_version() -> str | None:
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return None


def dev_cache() -> Path:
    """The user's cache folder for the benchmarks' builds and files (~/.cache/localinfer-dev)."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("localinfer-dev", appauthor=False))


def fetch_source(version: str, work: Path) -> Path:
    """``version``'s sdist downloaded with pip and unpacked under ``work``; its root folder
    (llama.cpp itself is ``vendor/llama.cpp`` in it)."""
    pip(["download", "--no-deps", "--no-binary", ":all:", "-d", str(work),
         f"{PACKAGE}=={version}"])  # fmt: skip
    archives = sorted(work.glob("*.tar.gz"))
    if not archives:
        raise BuildFailed("pip download finished without a source archive")
    with tarfile.open(archives[0]) as archive:
        archive.extractall(work / "src", filter="data")
    return next((work / "src").iterdir())


def cmake_build(source: Path, build: Path, options: list[str], target: str, jobs: int) -> None:
    """Configure ``source`` into ``build`` (Release, Ninja where installed) and build ``target``."""
    cmake = shutil.which("cmake")
    if cmake is None:
        raise BuildFailed("cmake is not installed (it builds llama.cpp)")
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    configure = [cmake, "-S", str(source), "-B", str(build), *generator,
                 "-DCMAKE_BUILD_TYPE=Release", *options]  # fmt: skip
    run_checked(configure, "cmake configure")
    run_checked([cmake, "--build", str(build), "--target", target, "-j", str(jobs)], "cmake build")


def run_checked(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise BuildFailed(f"{what} failed (exit {done.returncode}):\n{tail}")


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (a second builder waits, then finds the build made)."""
    import fcntl  # POSIX: these builds are for Linux machines

    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def pip(args: list[str], env: dict[str, str] | None = None) -> None:
    run_env = {**os.environ, **(env or {})}
    # Few retries, short timeouts: an offline machine learns it in seconds, not minutes.
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--retries", "1"]
    done = subprocess.run([*command, "--timeout", "30", *args],
                          env=run_env, capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise BuildFailed(f"pip {args[0]} failed (exit {done.returncode}):\n{tail}")
