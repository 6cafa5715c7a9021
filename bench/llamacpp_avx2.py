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

import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from bench.llamacpp_source import (
    PACKAGE,
    BuildFailed,
    cmake_build,
    dev_cache,
    fetch_source,
    installed_version,
    locked,
)

CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON "
    "-DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF"
)
BUILD_ENV = "LOCALINFER_LLAMACPP_AVX2_DIR"  # overrides where the build lives
MARKER = "localinfer-avx2-build.txt"  # written last: a directory without it is an unfinished build


def build_dir(version: str) -> Path:
    """Where the AVX2 build of ``version`` lives (its site directory, for PYTHONPATH)."""
    override = os.environ.get(BUILD_ENV)
    if override:
        return Path(override).expanduser()
    key = hashlib.sha256(f"{version} {CMAKE_ARGS}".encode()).hexdigest()[:10]
    return dev_cache() / f"llamacpp-avx2-{version}-{key}"


def marker_text(version: str) -> str:
    return f"{PACKAGE} {version}\nCMAKE_ARGS={CMAKE_ARGS}\n"


def is_built(site: Path, version: str) -> bool:
    """A finished build of ``version`` with these flags (an override directory may hold an
    older version's: the marker says which)."""
    marker = site / MARKER
    return marker.is_file() and marker.read_text() == marker_text(version)


def ensure_built(log: Callable[[str], None] = print) -> Path:
    """The AVX2 build's site directory, building it first when missing; BuildFailed if pip fails.

    One build at a time per directory (a lock beside it: a second caller waits, then finds it
    built), made in a sibling folder and renamed into place once finished, so no process ever
    imports a half-installed tree.
    """
    version = installed_version()
    if version is None:
        raise BuildFailed(f"{PACKAGE} is not installed: nothing to build a second copy of")
    site = build_dir(version)
    if is_built(site, version):
        return site
    site.parent.mkdir(parents=True, exist_ok=True)
    with locked(site.parent / f"{site.name}.lock"):
        if is_built(site, version):  # built by the process that held the lock
            return site
        log(f"building {PACKAGE} {version}'s CPU backend for AVX2 into {site} (once, ~1 min)")
        with tempfile.TemporaryDirectory(prefix="llamacpp-avx2-", dir=site.parent) as tmp:
            staged = Path(tmp) / "site"
            shutil.copytree(installed_package(), staged / "llama_cpp", symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
            _replace_cpu_backend(
                staged / "llama_cpp" / "lib", build_cpu_backend(version, Path(tmp))
            )
            (staged / MARKER).write_text(marker_text(version))
            shutil.rmtree(site, ignore_errors=True)  # an older or unfinished build
            staged.rename(site)
    return site


def installed_package() -> Path:
    """The installed llama_cpp package folder (not whatever PYTHONPATH puts first)."""
    folder = Path(str(metadata.distribution(PACKAGE).locate_file("llama_cpp")))
    if not (folder / "lib").is_dir():
        raise BuildFailed(f"{PACKAGE} has no llama_cpp/lib at {folder}")
    return folder


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
