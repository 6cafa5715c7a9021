"""Temporary files and folders a killed writer left behind: recognise them and remove them.

A writer puts its pid in the name of each temporary it makes (:func:`writer_tag`). A temporary is
stale when the process with that pid is gone, or, whatever its name says, when nothing has touched
it for ``max_age_s`` (a name without a pid; a pid the system has since given to another process).
A live writer's temporary has a live pid and a recent modification time, so a sweep never takes it
from under a concurrent writer on this machine. Pids mean nothing across machines: on a folder
shared over the network, a live writer elsewhere can look dead to this one; its write then fails
and the caller treats that as any failed write.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path


def writer_tag() -> str:
    """What a writer puts in its temporaries' names so a sweep can tell whether it still runs."""
    return str(os.getpid())


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid runs on this machine."""
    if pid == os.getpid():
        return True
    if pid <= 0 or os.name == "nt":
        # Windows has no signal 0 (os.kill would terminate the process): rely on the age there.
        return pid > 0
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def age_s(path: Path, now: float | None = None) -> float:
    """Seconds since ``path`` was last modified (a folder: since an entry was added or removed)."""
    return (time.time() if now is None else now) - path.stat().st_mtime


def is_stale(path: Path, pid: int | None, max_age_s: float) -> bool:
    """True when the writer ``pid`` is gone or ``path`` has not changed for ``max_age_s``."""
    try:
        if age_s(path) > max_age_s:
            return True
    except FileNotFoundError:  # its writer just finished or removed it
        return False
    return pid is not None and not pid_alive(pid)


def sweep(folder: Path, pattern: re.Pattern[str], max_age_s: float) -> list[Path]:
    """Remove the stale entries of ``folder`` whose names fully match ``pattern``.

    The pattern's group ``pid``, when it took part in the match, names the writer. Files and
    folders both go; anything that cannot be removed (gone meanwhile, no permission) is left.
    Returns what was removed.
    """
    if not folder.is_dir():
        return []
    removed = []
    for path in folder.iterdir():
        match = pattern.fullmatch(path.name)
        if match is None:
            continue
        pid_text = match.groupdict().get("pid")
        if not is_stale(path, int(pid_text) if pid_text else None, max_age_s):
            continue
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed


class LeftoverSweep:
    """The sweep of one store's folder, run once on the store's first use: the leftovers of an
    earlier run, not the live temporaries of this one."""

    def __init__(self, folder: Path, pattern: re.Pattern[str], max_age_s: float) -> None:
        self.folder = folder
        self.pattern = pattern
        self.max_age_s = max_age_s
        self._done = False

    def run(self) -> list[Path]:
        """Sweep now (again, if it ran before); returns what was removed."""
        return sweep(self.folder, self.pattern, self.max_age_s)

    def once(self) -> None:
        if not self._done:
            self._done = True
            self.run()
