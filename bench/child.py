"""Child Python processes of the harness: ``python -m bench.x`` from whatever directory.

bench/ is not installed, so a child finds it only through the repository root on its path. The
root is appended to PYTHONPATH, never put first: scripts/gpu-check runs from a symlink tree of
its own (localinfer with backends/ mapped in) whose entry must stay the one imported.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

# Not resolved: from gpu-check's symlink tree this is the tree, not the checkout behind it.
ROOT = Path(__file__).absolute().parent.parent


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with the repository root on PYTHONPATH."""
    out = dict(os.environ if env is None else env)
    paths = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(ROOT) not in paths:
        out["PYTHONPATH"] = os.pathsep.join([*paths, str(ROOT)])
    return out


def module_argv(module: str, *args: str) -> list[str]:
    """The command that runs ``module`` (``bench.x``) with ``args`` in this Python."""
    return [sys.executable, "-m", module, *args]
