"""How many threads llama.cpp should use: the physical cores this process may run on.

Hyper-threads share one core's vector units, and llama.cpp's matmuls are memory- and SIMD-bound,
so a second thread per core only adds synchronisation cost (llama.cpp's own default is the same).
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path


def _allowed_cpus() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _linux_physical(cpus: list[int]) -> int | None:
    cores: set[tuple[str, str]] = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            package = (topo / "physical_package_id").read_text().strip()
            core = (topo / "core_id").read_text().strip()
        except OSError:
            return None
        cores.add((package, core))
    return len(cores) or None


def _darwin_physical() -> int | None:
    # Performance cores only on Apple Silicon (efficiency cores slow the whole team down).
    for key in ("hw.perflevel0.physicalcpu", "hw.physicalcpu"):
        try:
            out = subprocess.run(
                ["sysctl", "-n", key], capture_output=True, text=True, timeout=2, check=True
            )
            return int(out.stdout.strip())
        except (OSError, ValueError, subprocess.SubprocessError):
            continue
    return None


def physical_cores() -> int:
    """Physical cores available to this process (at least 1)."""
    cpus = _allowed_cpus()
    found: int | None = None
    system = platform.system()
    if system == "Linux":
        found = _linux_physical(cpus)
    elif system == "Darwin":
        found = _darwin_physical()
    if found is None:
        found = len(cpus)
    return max(1, min(found, len(cpus)))
