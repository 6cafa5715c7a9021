"""The servers the bench scripts compare, as child processes.

`localinfer serve`, llama-cpp-python's own server (scripts/bench-server, scripts/bench-servers)
and llama.cpp's C++ llama-server (scripts/bench-llama-server) run on the same GGUF file with the
same thread count. Each answer is forced to the request's max_tokens, so all do the same work:
localinfer and llama-server through ignore_eos, llama-cpp-python's server through a logit bias
that bans every EOS token. That one runs with ``--interrupt_requests False``: otherwise each new
request cuts the one in flight. A server that dies or never gets ready raises StartFailed (a
SystemExit: scripts that do not catch it end with its message) carrying its last log lines.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

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
    log: IO[bytes] | None = None  # the server's stderr, read when it fails to start

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.log is not None:
            self.log.close()

    def log_tail(self, lines: int = 6) -> str:
        if self.log is None:
            return ""
        self.log.seek(0)
        text = self.log.read().decode("utf-8", errors="replace").strip()
        return "\n".join(text.splitlines()[-lines:])


class StartFailed(SystemExit):
    """A server exited during start-up or was not ready in time."""


def start(
    name: str,
    cmd: list[str],
    url: str,
    ready_path: str,
    env: Mapping[str, str] | None = None,
    **request: Any,
) -> Server:
    """Start ``cmd`` (with ``env``: its whole environment) and wait until ``url + ready_path``
    answers 200; StartFailed when the server dies or is not ready in time. ``request``: the
    Server's extra_body and model."""
    log = tempfile.TemporaryFile()  # noqa: SIM115 (Server.stop closes it)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=env)
    server = Server(name, url, proc, log=log, **request)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = server.log_tail()
            server.stop()
            raise StartFailed(f"{name} exited with {proc.returncode} during start-up: "
                              f"{' '.join(cmd)}" + (f"\n{tail}" if tail else ""))  # fmt: skip
        try:
            if httpx.get(url + ready_path, timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    server.stop()
    raise StartFailed(f"{name} did not become ready in {READY_TIMEOUT_S:.0f} s")


def start_localinfer(
    model: Path,
    *,
    slots: int,
    ctx: int,
    threads: int,
    backend: str = "llamacpp",
    env: Mapping[str, str] | None = None,
) -> Server:
    """`localinfer serve` on ``backend`` with ``slots`` slots of ``ctx`` tokens."""
    port = free_port()
    cmd = [sys.executable, "-m", "localinfer", "serve", str(model), "--port", str(port),
           "--slots", str(slots), "--ctx", str(ctx), "--threads", str(threads),
           "--backend", backend, "--max-queue", "256", "--log-level", "warning",
           "--served-name", "bench"]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    extra = {"ignore_eos": True}
    return start("localinfer", cmd, url, "/health", env, extra_body=extra, model="bench")


def start_peer(model: Path, *, threads: int, eos_ids: Sequence[int]) -> Server:
    """llama-cpp-python's server (needs its [server] extras) with every EOS token banned."""
    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--port", str(port),
           "--n_threads", str(threads), "--n_threads_batch", str(threads),
           "--n_ctx", "2048", "--interrupt_requests", "False", "--verbose", "False"]  # fmt: skip
    extra = {"logit_bias": {str(i): -100.0 for i in eos_ids}}
    url = f"http://127.0.0.1:{port}"
    return start("llama-cpp-python", cmd, url, "/v1/models", extra_body=extra, model="peer")


def llama_server_command(
    binary: Path,
    model: Path,
    *,
    port: int,
    threads: int,
    slots: int,
    ctx: int,
    no_repack: bool,
    extra: Sequence[str] = (),
) -> list[str]:
    """llama-server as localinfer's llama.cpp runner sets llama.cpp up: ``slots`` sequences
    with continuous batching, each its own KV stream of ``ctx`` cells (``-c`` is the total;
    ``--no-kv-unified``, as the runner's kv_unified = false), ``threads`` for decode and batch,
    weights out of the extra (repack/AMX) buffers where the runner keeps them out
    (``no_repack``). ``extra``: more llama-server arguments, last, so they win."""
    cmd = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
           "-t", str(threads), "-tb", str(threads), "-np", str(slots), "-cb",
           "-c", str(slots * ctx), "--no-kv-unified", "-ngl", "0", "--alias", "bench",
           "--no-webui"]  # fmt: skip
    if no_repack:
        cmd.append("--no-repack")
    return cmd + list(extra)


def start_llama_server(
    binary: Path,
    model: Path,
    *,
    threads: int,
    slots: int,
    ctx: int,
    no_repack: bool,
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Server:
    """llama.cpp's C++ server (bench/llama_server.py builds it), answers forced to max_tokens
    with its ignore_eos; ``env``: its whole environment."""
    port = free_port()
    cmd = llama_server_command(binary, model, port=port, threads=threads, slots=slots, ctx=ctx,
                               no_repack=no_repack, extra=extra)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    return start("llama-server", cmd, url, "/health", env, extra_body={"ignore_eos": True},
                 model="bench")  # fmt: skip
