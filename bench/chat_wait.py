"""scripts/bench-chat-wait: llama.cpp's decode beside a UI-like neighbour, per wait setting.

The chat's UI thread wants a short slice (a render, a few ms) many times a second while the
engine decodes. llama.cpp's CPU threads (OpenMP in the bundled build) spin at every barrier and
after every graph, so a neighbour that takes one of two cores for a moment stalls both workers.
How libgomp waits is fixed when it loads (``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``), so every
setting runs in its own process (:func:`measure_in_child`); the settings take turns, round after
round, so a machine whose load changes meanwhile weighs on each alike.

Each child decodes the same greedy request through the real engine three times: alone, beside a
neighbour that holds the GIL for ``burst_ms`` every ``period_ms`` (Python code, as Textual's
rendering is), and beside one that does the same work with the GIL released (CPU only). The
ratios busy/alone in one process are the figures to compare; absolute rates follow the machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass

from bench.child import child_env

NEIGHBOURS = ("none", "gil", "nogil")


@dataclass(slots=True, frozen=True)
class WaitCase:
    """One setting: libgomp's environment, llama.cpp's thread count, Python's switch interval."""

    name: str
    env: tuple[tuple[str, str], ...] = ()
    threads: int | None = None
    switch_interval_s: float | None = None


@dataclass(slots=True, frozen=True)
class Neighbour:
    burst_ms: float = 3.0  # one render
    period_ms: float = 33.0  # ~30 renders a second: ~9% of a core


def _spin_python(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


_BLOCK = b"x" * (1 << 16)


def _spin_released(seconds: float) -> None:
    # hashlib drops the GIL for inputs over 2 KiB: CPU work that leaves the GIL to the engine.
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        hashlib.sha256(_BLOCK).digest()


class _Busy:
    def __init__(self, kind: str, shape: Neighbour) -> None:
        self._kind, self._shape, self._stop = kind, shape, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        spin = _spin_python if self._kind == "gil" else _spin_released
        burst, period = self._shape.burst_ms / 1000, self._shape.period_ms / 1000
        while not self._stop.is_set():
            spin(burst)
            time.sleep(max(0.0, period - burst))

    def __enter__(self) -> _Busy:
        if self._kind != "none":
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._kind != "none":
            self._thread.join()


def child_main(case: WaitCase, tokens: int, shape: Neighbour) -> dict[str, float | None]:
    """In the child: open the model as the chat does and time one request per neighbour."""
    if case.switch_interval_s is not None:
        sys.setswitchinterval(case.switch_interval_s)
    from bench.chat import ChatBenchConfig, run_engine_alone
    from localinfer.tui.host import open_with_settings

    config = ChatBenchConfig(max_tokens=tokens, backend="llamacpp", threads=case.threads)
    session = open_with_settings(config.settings())
    try:
        warm = ChatBenchConfig(max_tokens=16, backend="llamacpp", threads=case.threads)
        run_engine_alone(session, warm)
        out: dict[str, float | None] = {}
        for kind in NEIGHBOURS:
            with _Busy(kind, shape):
                out[kind] = run_engine_alone(session, config).decode_tps
        return out
    finally:
        session.close()


def measure_in_child(case: WaitCase, tokens: int, shape: Neighbour) -> dict[str, float | None]:
    """Run :func:`child_main` for ``case`` in a fresh interpreter (libgomp reads its env once)."""
    env = child_env({**os.environ, **dict(case.env)})
    payload = json.dumps({"case": asdict(case), "tokens": tokens, "shape": asdict(shape)})
    argv = [sys.executable, "-c", "import bench.chat_wait as m; m._child_entry()"]
    proc = subprocess.run(argv, input=payload, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{case.name}: {proc.stderr.strip()[-1500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _child_entry() -> None:
    data = json.loads(sys.stdin.read())
    raw = data["case"]
    case = WaitCase(
        name=raw["name"],
        env=tuple(tuple(pair) for pair in raw["env"]),  # type: ignore[misc]
        threads=raw["threads"],
        switch_interval_s=raw["switch_interval_s"],
    )
    result = child_main(case, data["tokens"], Neighbour(**data["shape"]))
    print(json.dumps(result))
