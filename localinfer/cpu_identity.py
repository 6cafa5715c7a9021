"""What identifies this machine's CPU for caches of things built or measured for it.

A library compiled with ``-march=native`` / ``-mcpu=native`` runs only on a CPU with the same
features, and a measured choice (llama.cpp's attention kernel, the native kernels' calibration)
holds only for the CPU it was measured on, so their cache keys include this. Linux names the CPU
differently per architecture: x86 ``model name`` and ``flags``; ARM ``Features`` and the
``CPU implementer`` / ``CPU part`` / ``CPU variant`` numbers (ARM has no model name line).
Elsewhere: the machine, the processor and, on macOS, sysctl's CPU name.
"""

from __future__ import annotations

import platform
import subprocess
from functools import cache
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
_KEYS = ("model name", "flags", "Features", "CPU implementer", "CPU part", "CPU variant")


def identity_lines(cpuinfo: str) -> list[str]:
    """The lines of a /proc/cpuinfo text that identify the CPU, each once, sorted."""
    return sorted({line.strip() for line in cpuinfo.splitlines() if line.startswith(_KEYS)})


@cache
def cpu_identity() -> str:
    """This CPU's identifying lines (Linux), else what ``platform`` knows."""
    try:
        found = identity_lines(CPUINFO.read_text(errors="replace"))
    except OSError:
        found = []
    if found:
        return "\n".join(found)
    return f"{platform.machine()}|{platform.processor()}|{_brand()}"


def _brand() -> str:
    """The CPU's name where there is no /proc/cpuinfo: macOS's sysctl ("Apple M3 Pro"); not the
    OS version, or every system update would rebuild and re-measure what is keyed on this."""
    if platform.system() != "Darwin":
        return ""
    try:
        done = subprocess.run(
            ["sysctl", "-n", "machdep.cpu.brand_string"],
            capture_output=True, text=True, timeout=5, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()
