"""Models load on a thread of their own that ends with the load (localinfer/loader_thread.py),
so no OpenMP team of the loading thread lives on beside the engine's: the root of generate, the
chat and the Python API decoding at about half of serve's speed."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from localinfer.loader_thread import loads_in_own_thread, run_in_own_thread
from localinfer.thread_name import ENGINE_THREAD_NAME, LOADER_THREAD_NAME

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="thread names live in /proc")


def _threads() -> dict[int, str]:
    """This process's threads: kernel id -> kernel name."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            out[int(task.name)] = (task / "comm").read_text().strip()
        except OSError:
            continue  # ended between the listing and the read
    return out


def test_the_result_and_the_error_come_back_to_the_caller() -> None:
    seen: list[threading.Thread] = []

    def load() -> int:
        seen.append(threading.current_thread())
        return 42

    assert run_in_own_thread(load) == 42
    assert seen[0] is not threading.current_thread() and not seen[0].is_alive()

    @loads_in_own_thread
    def broken(name: str) -> None:
        raise FileNotFoundError(name)

    with pytest.raises(FileNotFoundError, match="model.gguf"):
        broken("model.gguf")


@linux_only
def test_open_session_loads_off_the_callers_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the embedded model through the torch runner: the runner is built on the loader thread,
    which has ended when the session is handed back, and so have the OpenMP workers the load
    started (loading on this thread kept them, named as it is); the one thread left of the
    load is the engine's, under its kernel name. Exiting workers are waited for, never timed."""
    from localinfer import session as session_module

    built_on: list[threading.Thread] = []
    build = session_module.build_runner

    def spy(*args: object, **kwargs: object) -> object:
        built_on.append(threading.current_thread())
        return build(*args, **kwargs)

    monkeypatch.setattr(session_module, "build_runner", spy)
    before = set(_threads())
    with session_module.open_session(None, backend="torch", slots=1, ctx=256) as session:
        assert built_on and built_on[0] is not threading.current_thread()
        assert not built_on[0].is_alive()
        engine_tid = session.engine._thread.native_id
        assert _threads()[engine_tid] == ENGINE_THREAD_NAME
        deadline = time.monotonic() + 30
        while True:
            left = {tid: name for tid, name in _threads().items() if tid not in before}
            if set(left) == {engine_tid} or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert left == {engine_tid: ENGINE_THREAD_NAME}
        assert LOADER_THREAD_NAME not in _threads().values()
