"""Compile cpu_kernels.c for this machine (torch-free, so the budget can ask about it too).

The C file is compiled once per machine with the system C compiler (``-O3 -march=native
-fopenmp``) into the localinfer cache, keyed by a hash of the source, the flags, the compiler's
version and the CPU, under a temporary name renamed into place (a concurrent build or a crash
never leaves a half-written library under the final name).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from localinfer.paths import cache_dir

SOURCE = Path(__file__).with_name("cpu_kernels.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=gnu11", "-ffp-contract=fast")
DISABLE_ENV = "LOCALINFER_NATIVE_KERNELS"  # "0" turns the native path off (benchmarks, tests)


def native_kernels_enabled() -> bool:
    return os.environ.get(DISABLE_ENV, "1") != "0"


def native_kernels_expected() -> bool:
    """Whether a CPU fp32 torch runner here will use the kernels: switched on, and a C compiler
    to build them. Cheap: nothing is compiled."""
    if not native_kernels_enabled():
        return False
    try:
        compiler()
    except BuildError:
        return False
    return True


class BuildError(RuntimeError):
    pass


def compiler() -> str:
    for candidate in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if candidate and shutil.which(candidate):
            return candidate
    raise BuildError("no C compiler found (set CC, or install gcc or clang)")


def build() -> Path:
    cc = compiler()
    version = subprocess.run(
        [cc, "--version"], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    key = hashlib.sha256(
        SOURCE.read_bytes() + " ".join(FLAGS).encode() + version.encode() + cpu_id().encode()
    ).hexdigest()[:16]
    out_dir = cache_dir() / "kernels"
    target = out_dir / f"cpu_kernels-{key}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    # Built under a temporary name and renamed: a concurrent build or a crash never leaves a
    # half-written library under the final name.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        proc = subprocess.run(
            [cc, *FLAGS, str(SOURCE), "-o", tmp, "-lm"],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise BuildError(f"{cc} failed: {proc.stderr.strip()[-500:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def cpu_id() -> str:
    """-march=native code is only valid on this CPU model: part of the cache key."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        import platform

        return platform.processor() or platform.machine()
    lines = [line for line in text.splitlines() if line.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(lines)))
