"""`localinfer worker` processes on loopback, for the RPC benchmark and tests: started with
``--port 0``, their address read from what they print."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

START_TIMEOUT = 120.0


@dataclass
class WorkerProcess:
    proc: subprocess.Popen[str]
    endpoint: str
    log: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def rss(self) -> int:
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)


def start_worker(args: Sequence[str] = ()) -> WorkerProcess:
    """``localinfer worker --port 0 --threads 1 ARGS``, once it says its port; its stderr lines
    keep being collected in ``log``."""
    command = [sys.executable, "-m", "localinfer", "worker", "--port", "0", "--threads", "1", *args]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    found: list[str] = []
    log: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            log.append(line)
            match = re.search(r"listening on (\S+) \(port (\d+)", line)
            if match and not found:
                host = match.group(1).rpartition(":")[0]
                found.append(f"{host}:{match.group(2)}")
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(START_TIMEOUT) or not found:
        proc.kill()
        raise AssertionError(f"the worker did not start: {''.join(log)}")
    return WorkerProcess(proc, found[0], log)


@contextmanager
def workers(count: int, args: Sequence[str] = ()) -> Iterator[list[WorkerProcess]]:
    started = []
    try:
        for _ in range(count):
            started.append(start_worker(args))
        yield started
    finally:
        for worker in started:
            worker.stop()
