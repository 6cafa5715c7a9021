"""What identifies this machine's CPU for caches of things built or measured for it.

A library compiled with ``-march=native`` / ``-mcpu=native`` runs only on a CPU with the same
features, and a measured choice (llama.cpp's attention kernel, the native kernels' calibration)
holds only for the CPU it was measured on, so their cache keys include this. Linux names the CPU
differently per architecture: x86 ``model name`` and ``flags``; ARM ``Features`` and the
``CPU implementer`` / ``CPU part`` / ``CPU variant`` numbers (ARM has no model name line).
Elsewhere (macOS, Windows) ``platform`` is what there is.
"""

from __future__ import annotations

import platform
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
    return f"{platform.machine()}|{platform.processor()}|{platform.platform()}"
