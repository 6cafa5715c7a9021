"""llama.cpp as an AVX2 laptop runs it: the installed llama-cpp-python with its CPU backend rebuilt.

pip builds llama-cpp-python from source with ``GGML_NATIVE=ON``, so its CPU backend uses every
instruction this machine has (AVX-512, VNNI, AMX here) and cannot be lowered at run time. Only
that one library, ``libggml-cpu``, is built for the machine: libllama, libggml-base and the rest
are compiled for plain x86-64 (not one zmm register in them). So to test and measure llama.cpp as
on a CPU without AVX-512 this compiles just the ``ggml-cpu`` target of the same version's
sources with ``GGML_NATIVE=OFF`` and the Haswell set (AVX, AVX2, FMA, F16C, BMI2: llama.cpp's
own "haswell" CPU variant), and lays it into a copy of the installed package; a process that
has that directory first on PYTHONPATH imports it instead of the installed one. About a minute
(the source download and one library), against five for the whole package.

The build is kept in the user's cache, keyed by version and flags (not LOCALINFER_CACHE_DIR,
which tests point at throwaway folders): once per machine and version, then nothing.

    python -m bench.llamacpp_avx2     # build if missing; print the directory
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from bench.cached_build import CachedBuild, copy_installed_package, installed_package
from bench.llamacpp_source import (
    PACKAGE,
    BuildFailed,
    cmake_build,
    fetch_source,
    installed_version,
)

__all__ = ["PACKAGE", "BuildFailed", "installed_package", "installed_version"]

CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON "
    "-DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF"
)
BUILD_ENV = "LOCALINFER_LLAMACPP_AVX2_DIR"  # overrides where the build lives
MARKER = "localinfer-avx2-build.txt"  # written last: a directory without it is an unfinished build


def _spec() -> CachedBuild:  # read at each call: tests change CMAKE_ARGS and BUILD_ENV
    return CachedBuild("llamacpp-avx2", CMAKE_ARGS, MARKER, env=BUILD_ENV)


def build_dir(version: str) -> Path:
    """Where the AVX2 build of ``version`` lives (its site directory, for PYTHONPATH)."""
    return _spec().folder(version)


def marker_text(version: str) -> str:
    return _spec().marker_text(version)


def is_built(site: Path, version: str) -> bool:
    """A finished build of ``version`` with these flags."""
    return _spec().is_built(site, version)


def ensure_built(log: Callable[[str], None] = print) -> Path:
    """The AVX2 build's site directory, building it first when missing (~1 min; cached_build:
    one builder at a time, renamed into place when finished); BuildFailed if the build fails."""

    def fill(version: str, work: Path, staged: Path) -> None:
        _replace_cpu_backend(copy_installed_package(staged), build_cpu_backend(version, work))

    return _spec().ensure(installed_version(), fill, "its CPU backend for AVX2", log)


def build_cpu_backend(version: str, work: Path) -> Path:
    """Compile the ``ggml-cpu`` target of ``version``'s sources with CMAKE_ARGS; its library."""
    source = fetch_source(version, work)
    build = work / "build"
    options = ["-DLLAVA_BUILD=OFF", *CMAKE_ARGS.split()]
    cmake_build(source, build, options, "ggml-cpu", os.cpu_count() or 2)
    libraries = sorted(build.rglob("libggml-cpu.so.*.*.*"))
    if not libraries:
        raise BuildFailed("the build made no libggml-cpu.so")
    return libraries[0]


def _replace_cpu_backend(lib: Path, built: Path) -> None:
    """Every name the package has for libggml-cpu (the .so, .so.0, .so.0.x.y copies) becomes
    the new build; the other libraries load it through their $ORIGIN run path."""
    names = sorted(lib.glob("libggml-cpu.so*"))
    if not names:
        raise BuildFailed(f"no libggml-cpu.so in {lib} to replace")
    for name in names:
        name.unlink()
        shutil.copy2(built, name)


def pythonpath_with(site: Path, current: str | None) -> str:
    """PYTHONPATH with ``site`` first, so ``import llama_cpp`` finds the AVX2 build."""
    return os.pathsep.join([str(site), *([current] if current else [])])


def loaded_build() -> str:
    """Which llama.cpp this process imports, for a benchmark row's label."""
    import llama_cpp

    site = Path(llama_cpp.__file__).resolve().parent.parent
    return "AVX2 build, no AVX-512" if (site / MARKER).is_file() else "as pip built it for this CPU"


def main() -> int:
    try:
        print(ensure_built(log=lambda line: print(line, file=sys.stderr)))
    except BuildFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
