"""How llama.cpp's CPU threads wait: libgomp's spin count, set before the library loads.

llama-cpp-python's Linux build runs ggml's CPU graph on OpenMP (libggml-cpu links libgomp.so.1):
every node of the graph ends in ``#pragma omp barrier`` and the workers wait for the next graph
in libgomp's dock. libgomp spins before it sleeps, 300,000 ``pause`` loops by default (several
ms), and ggml's own threadpool ``poll`` setting does not apply to OpenMP builds. A thread
that spins holds its core while the chat's UI thread or the HTTP server's needs a slice, and when
the machine is busier than its cores a worker spins through the slices its partner needs to
reach the barrier: the whole team crawls. scripts/bench-chat-wait measured it (see
``DEFAULT_SPINCOUNT``).

libgomp reads ``GOMP_SPINCOUNT`` and ``OMP_WAIT_POLICY`` once, when it is loaded, so
:func:`prepare_omp_wait` must run before the first ``import llama_cpp`` of the process (the
runner calls it just before). A value the user set in the environment wins. Builds without
OpenMP (macOS) never read these variables.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SPIN_ENV = "GOMP_SPINCOUNT"
POLICY_ENV = "OMP_WAIT_POLICY"
LIBGOMP = "libgomp.so.1"  # the system libgomp llama-cpp-python links (torch bundles its own)

# Spins before a waiting llama.cpp thread sleeps: about 50 us of ``pause`` here, far longer than
# two running threads wait for each other at a graph node's barrier, far shorter than a slice
# another thread takes. On a busy 2-core machine scripts/bench-chat-wait decodes about 4x faster
# with 1,000 than with libgomp's 300,000 (8x beside a UI-like thread), near a single thread's
# speed. PASSIVE (0) is as fast there but sleeps at every barrier (a futex wake per graph node,
# hundreds per token), a cost a quiet machine pays too; 1,000 keeps the barriers between two
# running threads a spin (docs/measurements.md, "libgomp spin count").
DEFAULT_SPINCOUNT = 1_000
# libgomp spins only its "throttled" count (100 by default: a few microseconds) whenever it
# manages more threads than the machine has CPUs, and each engine thread keeps its own OpenMP team
# for as long as it lives: a second llama.cpp model in a server, or a team the main thread once
# started, tips a 2-core machine over, and every graph node's barrier becomes a futex sleep.
# ACTIVE raises the throttled count to 1,000 (capped at the spin count), so the threads wait alike
# however many teams exist: two engines in one process decoded the embedded model at 30-32 ms a
# token each, 11-13 with it (python -m bench.omp_teams; docs/measurements.md, "libgomp spin
# count"). With the spin count set it changes nothing else.
DEFAULT_POLICY = "ACTIVE"


@dataclass(slots=True, frozen=True)
class OmpWait:
    """What the process's llama.cpp threads wait with, and who chose it."""

    spincount: str | None  # GOMP_SPINCOUNT as libgomp reads it (None: libgomp's default)
    policy: str | None  # OMP_WAIT_POLICY as libgomp reads it
    source: str  # "localinfer", "environment" (the user's), or "too late" (already loaded)


def libgomp_loaded(maps: Path = Path("/proc/self/maps")) -> bool:
    """Whether the system libgomp is already mapped into this process (then its settings are
    fixed). False where /proc is missing (not Linux): nothing reads the variables there."""
    try:
        text = maps.read_text()
    except OSError:
        return False
    # The mapped file is the real one behind the soname link (libgomp.so.1.0.0).
    names = (line.rstrip().rsplit("/", 1)[-1] for line in text.splitlines() if "/" in line)
    return any(name.startswith(LIBGOMP) for name in names)


def prepare_omp_wait(
    spincount: int = DEFAULT_SPINCOUNT, maps: Path = Path("/proc/self/maps")
) -> OmpWait:
    """Set ``GOMP_SPINCOUNT`` and ``OMP_WAIT_POLICY`` for llama.cpp's OpenMP threads unless the
    user chose how they wait.

    Call before llama_cpp is imported; later calls change nothing and say so.
    """
    user_spin, user_policy = os.environ.get(SPIN_ENV), os.environ.get(POLICY_ENV)
    if libgomp_loaded(maps):
        return OmpWait(user_spin, user_policy, "too late")
    if user_spin is not None or user_policy is not None:
        return OmpWait(user_spin, user_policy, "environment")
    os.environ[SPIN_ENV] = str(spincount)
    os.environ[POLICY_ENV] = DEFAULT_POLICY
    return OmpWait(str(spincount), DEFAULT_POLICY, "localinfer")
