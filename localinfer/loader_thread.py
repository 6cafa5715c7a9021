"""Load models on a thread of their own that ends when they are loaded.

libgomp (the OpenMP runtime torch ships and llama.cpp links) keeps a team of worker threads for
each thread that starts a parallel region, alive after the region ends. Loading a model runs
parallel regions (packing and converting weights), so a process that loads on its main thread
keeps that team beside the engine thread's own. libgomp counts every worker it manages, and once
they outnumber the CPUs it throttles how long a waiting worker spins (to 100 loops) before it
sleeps: from then on the engine's workers sleep and wake through the kernel at every barrier,
hundreds of times per token. On a 2-core machine decoding ran at about 0.55x, with more CPU
spent per token, until the loading thread was gone (scripts/bench-paths; docs/measurements.md,
"One engine speed on every path"). A thread that ends frees its team, so loading there leaves the
engine's team the only one, on every path: chat, generate, serve and the Python API alike.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from localinfer.thread_name import LOADER_THREAD_NAME, name_this_thread

P = ParamSpec("P")
T = TypeVar("T")


def run_in_own_thread(fn: Callable[[], T]) -> T:
    """``fn()`` on a new thread that ends with it; its result, or its exception, here."""
    outcome: dict[str, object] = {}

    def body() -> None:
        name_this_thread(LOADER_THREAD_NAME)  # and the OpenMP workers it starts
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            outcome["error"] = exc

    # Daemon: a caller interrupted while it waits (Ctrl+C) is not held at exit by a load.
    thread = threading.Thread(target=body, name=LOADER_THREAD_NAME, daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]


def loads_in_own_thread(fn: Callable[P, T]) -> Callable[P, T]:
    """Decorate a function that loads a model so every call runs in :func:`run_in_own_thread`."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        return run_in_own_thread(lambda: fn(*args, **kwargs))

    return wrapper
