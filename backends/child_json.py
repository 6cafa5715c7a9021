"""Run a measurement in a child Python process and read the JSON line it prints last.

Calibrations (the native kernels against torch ops, llama.cpp's attention kernels) run in a child:
the parent never imports the framework it asks about, the timing runs in a quiet process, and a
library built for another CPU dies there with an illegal instruction instead of in the parent.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ChildResult:
    data: Any  # the last stdout line as JSON; None when the child failed or printed none
    returncode: int | None  # None: it could not be started or ran out of time
    problem: str  # why there is no data ("" when there is)

    @property
    def illegal_instruction(self) -> bool:
        """Killed by SIGILL: directly (-4) or under a shell that reports 128 + 4."""
        return self.returncode in (-signal.SIGILL, 128 + signal.SIGILL)


def run_json_child(module: str, args: list[str], timeout_s: float) -> ChildResult:
    """``python -m module args...`` with this interpreter; its last stdout line parsed."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", module, *args],
            capture_output=True, text=True, timeout=timeout_s, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return ChildResult(None, None, str(exc))
    if proc.returncode != 0:
        return ChildResult(None, proc.returncode, proc.stderr.strip()[-300:] or "no message")
    try:
        return ChildResult(json.loads(proc.stdout.strip().splitlines()[-1]), 0, "")
    except (ValueError, IndexError):
        return ChildResult(None, 0, f"unreadable output: {proc.stdout.strip()[-200:]!r}")
