"""The two servers scripts/bench-server and scripts/bench-servers compare, as child processes.

`localinfer serve` and llama-cpp-python's own server run on the same GGUF file with the same
thread count. Each answer is forced to the request's max_tokens, so both do the same work:
localinfer through ignore_eos, the peer through a logit bias that bans every EOS token. The peer
runs with ``--interrupt_requests False``: otherwise each new request cuts the one in flight.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from localinfer.server.host import free_port

READY_TIMEOUT_S = 600.0  # a first start may compile or page in the model


@dataclass
class Server:
    """A server process and what a request to it carries."""

    name: str
    url: str
    proc: subprocess.Popen[bytes]
    extra_body: dict[str, Any]  # what forces max_tokens on this server
    model: str  # the model name requests give

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start(name: str, cmd: list[str], url: str, ready_path: str, **request: Any) -> Server:
    """Start ``cmd`` and wait until ``url + ready_path`` answers 200; exits the program when the
    server dies or is not ready in time. ``request``: the Server's extra_body and model."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = Server(name, url, proc, **request)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{name} exited with {proc.returncode} during start-up: {' '.join(cmd)}")
        try:
            if httpx.get(url + ready_path, timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    server.stop()
    sys.exit(f"{name} did not become ready in {READY_TIMEOUT_S:.0f} s")


def start_localinfer(model: Path, *, slots: int, ctx: int, threads: int) -> Server:
    """`localinfer serve` on llama.cpp with ``slots`` slots of ``ctx`` tokens."""
    port = free_port()
    cmd = [sys.executable, "-m", "localinfer", "serve", str(model), "--port", str(port),
           "--slots", str(slots), "--ctx", str(ctx), "--threads", str(threads),
           "--backend", "llamacpp", "--max-queue", "256", "--log-level", "warning",
           "--served-name", "bench"]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    return start("localinfer", cmd, url, "/health", extra_body={"ignore_eos": True}, model="bench")


def start_peer(model: Path, *, threads: int, eos_ids: Sequence[int]) -> Server:
    """llama-cpp-python's server (needs its [server] extras) with every EOS token banned."""
    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--port", str(port),
           "--n_threads", str(threads), "--n_threads_batch", str(threads),
           "--n_ctx", "2048", "--interrupt_requests", "False", "--verbose", "False"]  # fmt: skip
    extra = {"logit_bias": {str(i): -100.0 for i in eos_ids}}
    url = f"http://127.0.0.1:{port}"
    return start("llama-cpp-python", cmd, url, "/v1/models", extra_body=extra, model="peer")
