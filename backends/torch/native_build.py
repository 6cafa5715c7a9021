"""Compile cpu_kernels.c for this machine (torch-free, so the budget can ask about it too).

The C file is compiled once per machine with the system C compiler into the localinfer cache,
keyed by a hash of the source, the flags, the compiler's version and the CPU, under a temporary
name renamed into place (a concurrent build or a crash never leaves a half-written library under
the final name).

Flags follow the platform (``build_flags``): x86-64 ``-march=native``; aarch64 Linux
``-mcpu=native`` (NEON through the generic vector code); macOS on Apple Silicon ``-mcpu=apple-m1``
and no OpenMP (Apple clang has no ``-fopenmp``, and a second OpenMP runtime beside the one torch
ships is a known crash: the kernels run single-threaded there). A compiler that refuses OpenMP
gets one more try without it. ``LOCALINFER_KERNEL_ISA`` lowers the x86 ISA level so a machine
with AVX-512 can build, test and measure what an AVX2 laptop runs: ``avx2`` (AVX-512 hidden) or
``generic`` (baseline x86-64 vectors only); it is part of the flags and so of the cache key.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from localinfer.cpu_identity import cpu_identity
from localinfer.paths import cache_dir

SOURCE = Path(__file__).with_name("cpu_kernels.c")
COMMON_FLAGS = ("-O3", "-fPIC", "-shared", "-std=gnu11", "-ffp-contract=fast")
OPENMP_FLAGS = ("-fopenmp",)
DISABLE_ENV = "LOCALINFER_NATIVE_KERNELS"  # "0" turns the native path off (benchmarks, tests)
ISA_ENV = "LOCALINFER_KERNEL_ISA"  # native (default) | avx2 | generic: x86 ISA level to build for
ISA_LEVELS = ("native", "avx2", "generic")
# -mno-avx512f turns off every AVX-512 subset (each depends on AVX512F): what an AVX2 + FMA
# laptop CPU (Intel Core 12th gen on, AMD Zen 2/3) executes.
_X86_ISA_FLAGS = {
    "native": ("-march=native",),
    "avx2": ("-march=native", "-mno-avx512f"),
    "generic": ("-march=x86-64",),
}


def native_kernels_enabled() -> bool:
    return os.environ.get(DISABLE_ENV, "1") != "0"


def native_kernels_expected() -> bool:
    """Whether a CPU fp32 torch runner here can use the kernels: switched on, and a C compiler
    to build them. Cheap: nothing is compiled (whether they are the faster path is the
    calibration's answer: native_plan.py)."""
    if not native_kernels_enabled():
        return False
    try:
        compiler()
    except BuildError:
        return False
    return True


class BuildError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class Platform:
    """What the flags depend on; ``Platform.here()`` is this machine."""

    system: str  # platform.system(): Linux | Darwin | Windows
    machine: str  # platform.machine(), lower case: x86_64 | amd64 | aarch64 | arm64
    isa: str = "native"  # LOCALINFER_KERNEL_ISA (x86 only)

    @classmethod
    def here(cls) -> Platform:
        isa = os.environ.get(ISA_ENV, "native").strip().lower() or "native"
        if isa not in ISA_LEVELS:
            raise BuildError(f"{ISA_ENV}={isa!r}: choose one of {', '.join(ISA_LEVELS)}")
        return cls(platform.system(), platform.machine().lower(), isa)


@cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (x86 "flags", ARM "Features"; elsewhere
    none)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[-1].split())
    return frozenset()


def kernel_isa(where: Platform, flags: frozenset[str]) -> int:
    """The vector ISA (``li_isa``: 512, 256 or 0) of the library ``build_flags(where)`` makes
    on a CPU with ``flags``, known without compiling it: cpu_kernels.c takes its AVX-512 path
    where the compiler targets AVX512F, its AVX2 one with AVX2 + FMA, generic vectors else."""
    if where.machine not in ("x86_64", "amd64") or where.isa == "generic":
        return 0
    if where.isa == "native" and "avx512f" in flags:
        return 512
    return 256 if {"avx2", "fma"} <= flags else 0


def build_flags(where: Platform) -> list[tuple[str, ...]]:
    """The flag sets to try, in order (the first that compiles wins)."""
    if where.machine in ("x86_64", "amd64"):
        isa = _X86_ISA_FLAGS[where.isa]
    elif where.system == "Darwin":
        isa = ("-mcpu=apple-m1",)  # every Apple Silicon CPU runs M1 code
    elif where.machine in ("aarch64", "arm64"):
        isa = ("-mcpu=native",)
    else:
        isa = ()
    plain = (*COMMON_FLAGS, *isa)
    if where.system == "Darwin":
        return [plain]
    return [(*plain, *OPENMP_FLAGS), plain]


def compiler() -> str:
    for candidate in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if candidate and shutil.which(candidate):
            return candidate
    raise BuildError("no C compiler found (set CC, or install gcc or clang)")


def library_path(flags: tuple[str, ...], cc: str) -> Path:
    """Where the library built with ``flags`` by ``cc`` lives (it may not exist yet)."""
    key = hashlib.sha256(
        SOURCE.read_bytes()
        + " ".join(flags).encode()
        + _version(cc).encode()
        + cpu_identity().encode()
    ).hexdigest()[:16]
    return cache_dir() / "kernels" / f"cpu_kernels-{key}.so"


@cache
def _version(cc: str) -> str:
    # Asked once per process: the budget, backend choice and runner each look the library up.
    return subprocess.run(
        [cc, "--version"], capture_output=True, text=True, timeout=30, check=False
    ).stdout


def build(where: Platform | None = None) -> Path:
    """The library for ``where`` (default: this machine), compiled if not cached yet."""
    cc = compiler()
    errors = []
    for flags in build_flags(where or Platform.here()):
        target = library_path(flags, cc)
        if target.exists():
            return target
        try:
            _compile(cc, flags, target)
            return target
        except BuildError as exc:
            errors.append(str(exc))
    raise BuildError(errors[-1] if len(errors) == 1 else "; ".join(errors))


def _compile(cc: str, flags: tuple[str, ...], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # Built under a temporary name and renamed: a concurrent build or a crash never leaves a
    # half-written library under the final name.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        proc = subprocess.run(
            [cc, *flags, str(SOURCE), "-o", tmp, "-lm"],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise BuildError(f"{cc} {' '.join(flags)} failed: {proc.stderr.strip()[-400:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
