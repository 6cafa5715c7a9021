"""`localinfer serve` as a child process, for tests that talk to a real server over HTTP."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import httpx

from tests.test_server_support import wait_until

SERVE = [sys.executable, "-m", "localinfer", "serve"]


def read_port(proc: subprocess.Popen[str]) -> int:
    assert proc.stderr is not None
    for line in proc.stderr:
        found = re.search(r"port (\d+)", line)
        if found:
            return int(found.group(1))
    raise AssertionError(f"serve exited ({proc.wait()}) without saying its port")


def health_ok(url: str) -> bool:
    try:
        return httpx.get(url + "/health").json()["status"] == "ok"
    except httpx.TransportError:
        return False


@contextmanager
def running_server(
    args: Sequence[str], what: str, env: dict[str, str] | None = None
) -> Iterator[str]:
    """``localinfer serve ARGS`` (ARGS hold ``--port 0``) started and polled until /health says
    ok; its base URL. Terminated on the way out."""
    proc = subprocess.Popen([*SERVE, *args], env=env, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{read_port(proc)}"
        wait_until(lambda: health_ok(url), timeout=180, what=what)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)
