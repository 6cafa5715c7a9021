"""CPU time of each thread of a process, from /proc (Linux): who spends the cores while a model
decodes. scripts/bench-paths reads it around each answer, in its own process and in the servers
and `localinfer generate` processes it starts.

Threads are told apart by their kernel name (``/proc/PID/task/TID/comm``): the engine names its
thread (and so the OpenMP workers that thread starts, which inherit the name) ``li-engine``; the
process's first thread is ``main``; the rest keep the process's name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from localinfer.thread_name import ENGINE_THREAD_NAME


@dataclass(frozen=True, slots=True)
class ThreadTime:
    tid: int
    name: str
    seconds: float  # on a CPU since the thread started


@dataclass(frozen=True, slots=True)
class ThreadShare:
    """One group of threads' CPU over a span, per generated token."""

    group: str  # "engine" (the engine thread and the workers it started), "main", "other"
    threads: int
    ms_per_token: float


def _seconds(task: Path) -> float:
    # schedstat's first field is the nanoseconds run on a CPU; stat's utime+stime (ticks) is the
    # fallback where the kernel keeps no schedstat.
    try:
        return int((task / "schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def snapshot(pid: int) -> dict[int, ThreadTime]:
    """Every live thread of ``pid`` and its CPU seconds so far (empty where /proc is missing or
    the process has gone)."""
    out: dict[int, ThreadTime] = {}
    root = Path(f"/proc/{pid}/task")
    try:
        tasks = list(root.iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            tid = int(task.name)
            name = (task / "comm").read_text().strip()
            out[tid] = ThreadTime(tid, name, _seconds(task))
        except (OSError, ValueError):
            continue  # the thread ended between the listing and the read
    return out


def _group(pid: int, thread: ThreadTime) -> str:
    if thread.tid == pid:
        return "main"
    return "engine" if thread.name == ENGINE_THREAD_NAME else "other"


def shares(
    pid: int, before: dict[int, ThreadTime], after: dict[int, ThreadTime], tokens: int
) -> list[ThreadShare]:
    """CPU per token of each group between two snapshots. A thread that started in between
    counts from zero; one that ended in between is lost (its time is not readable any more)."""
    spent: dict[str, list[float]] = {"engine": [], "main": [], "other": []}
    for tid, now in after.items():
        then = before.get(tid)
        used = now.seconds - (then.seconds if then is not None else 0.0)
        if used > 0:
            spent[_group(pid, now)].append(used)
    per = max(tokens, 1)
    return [
        ThreadShare(group, len(times), sum(times) * 1000 / per)
        for group, times in spent.items()
        if times
    ]


def summary(parts: list[ThreadShare]) -> str:
    """``engine 12.1 (2) · main 0.3 · other 0.1`` in ms of CPU per token (threads in brackets
    where a group has several)."""
    text = []
    for part in parts:
        count = f" ({part.threads})" if part.threads > 1 else ""
        text.append(f"{part.group} {part.ms_per_token:.1f}{count}")
    return " · ".join(text) if text else "—"
