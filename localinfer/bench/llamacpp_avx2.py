"""llama.cpp as an AVX2 laptop runs it: a second build of the installed llama-cpp-python.

pip builds llama-cpp-python from source with ``GGML_NATIVE=ON``, so its CPU backend uses every
instruction this machine has (AVX-512, VNNI, AMX here) and cannot be lowered at run time. To
measure and test llama.cpp as on a CPU without AVX-512, this builds the same version again with
``GGML_NATIVE=OFF`` and the Haswell set (AVX, AVX2, FMA, F16C, BMI2: what llama.cpp's own
"haswell" CPU variant enables) into a directory of its own; a process that has that directory
first on PYTHONPATH imports it instead of the installed one.

pip's wheel cache keys a source build by the source archive alone, not by ``CMAKE_ARGS``, so the
build bypasses it (it would hand back the native wheel) and keeps its own copy, keyed by version
and flags, in the user's cache (not LOCALINFER_CACHE_DIR, which tests point at throwaway
folders): one build of ~5 minutes per machine and version, then nothing.

    python -m localinfer.bench.llamacpp_avx2     # build if missing; print the directory
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

PACKAGE = "llama-cpp-python"
CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON "
    "-DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF"
)
BUILD_ENV = "LOCALINFER_LLAMACPP_AVX2_DIR"  # overrides where the build lives
MARKER = "localinfer-avx2-build.txt"  # written last: a directory without it is an unfinished build


class BuildFailed(RuntimeError):
    """pip could not fetch or compile llama-cpp-python with the AVX2 flags."""


def installed_version() -> str | None:
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return None


def build_dir(version: str) -> Path:
    """Where the AVX2 build of ``version`` lives (its site directory, for PYTHONPATH)."""
    override = os.environ.get(BUILD_ENV)
    if override:
        return Path(override).expanduser()
    import platformdirs

    key = hashlib.sha256(f"{version} {CMAKE_ARGS}".encode()).hexdigest()[:10]
    base = Path(platformdirs.user_cache_dir("localinfer-dev", appauthor=False))
    return base / f"llamacpp-avx2-{version}-{key}"


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
    with _locked(site.parent / f"{site.name}.lock"):
        if is_built(site, version):  # built by the process that held the lock
            return site
        log(f"building {PACKAGE} {version} for AVX2 without AVX-512 into {site} (once, ~5 min)")
        with tempfile.TemporaryDirectory(prefix="llamacpp-avx2-", dir=site.parent) as tmp:
            wheel = ["wheel", "--no-deps", "--no-cache-dir", "--no-binary", PACKAGE, "-w", tmp]
            _pip([*wheel, f"{PACKAGE}=={version}"], env={"CMAKE_ARGS": CMAKE_ARGS})
            wheels = sorted(Path(tmp).glob("*.whl"))
            if not wheels:
                raise BuildFailed("pip wheel finished without a wheel")
            staged = Path(tmp) / "site"
            _pip(["install", "--no-deps", "--no-compile", "--target", str(staged), str(wheels[0])])
            (staged / MARKER).write_text(marker_text(version))
            shutil.rmtree(site, ignore_errors=True)  # an older or unfinished build
            staged.rename(site)
    return site


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    import fcntl  # POSIX: the AVX2 build is for x86-64 Linux machines

    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _pip(args: list[str], env: dict[str, str] | None = None) -> None:
    run_env = {**os.environ, **(env or {})}
    # Few retries, short timeouts: an offline machine learns it in seconds, not minutes.
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--retries", "1"]
    done = subprocess.run([*pip, "--timeout", "30", *args],
                          env=run_env, capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise BuildFailed(f"pip {args[0]} failed (exit {done.returncode}):\n{tail}")


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
