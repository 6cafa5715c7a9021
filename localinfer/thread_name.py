"""Kernel-visible thread names, so `top -H`, `ps -L` and /proc tell localinfer's threads apart.

Threads a named thread starts inherit its name: the OpenMP workers the engine thread's first
parallel region starts read ``li-engine`` too, so the engine's whole compute shows as one name.
Linux only (through /proc); elsewhere naming is skipped.
"""

from __future__ import annotations

import threading
from pathlib import Path

ENGINE_THREAD_NAME = "li-engine"
LOADER_THREAD_NAME = "li-load"  # loader_thread.py: models load there
MAX_NAME = 15  # the kernel keeps 15 bytes of a thread's name


def name_this_thread(name: str) -> bool:
    """Name the calling thread; False where the system has no /proc to name it through."""
    try:
        Path(f"/proc/self/task/{threading.get_native_id()}/comm").write_text(name[:MAX_NAME])
    except OSError:
        return False
    return True
