"""`localinfer worker`: llama.cpp's RPC server on this machine's CPU, behind a guarding relay.

ggml's server (rpc_ggml.py) runs in a thread of this process on 127.0.0.1, on a port of its own;
the address the user gives is the relay's (rpc_relay.py), which turns away peers not in
``--allow`` and answers memory questions within ``--mem``. A runner elsewhere loads some of a
model's layers here (`localinfer chat|generate|serve --rpc HOST:PORT`).
"""

from __future__ import annotations

import contextlib
import ctypes
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from localinfer.backends.llamacpp import rpc_wire as wire
from localinfer.backends.llamacpp.cpu import physical_cores
from localinfer.backends.llamacpp.omp_wait import prepare_omp_wait
from localinfer.backends.llamacpp.rpc_ggml import rpc_functions
from localinfer.backends.llamacpp.rpc_relay import MemoryLedger, Relay, RelayConfig, parse_allow
from localinfer.errors import BackendUnavailableError, InvalidParameterError

LOOPBACK = "127.0.0.1"
START_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    host: str = LOOPBACK
    port: int = 50052  # rpc-server's default; 0: any free port
    mem: int | None = None  # bytes it may hold for clients; None: what the machine has
    allow: str | None = None  # --allow: peers (IPs, networks) it serves; None: any
    threads: int | None = None  # the CPU backend's threads; None: physical cores


@dataclass
class Worker:
    relay: Relay
    version: str
    threads: int
    server_thread: threading.Thread

    @property
    def endpoint(self) -> str:
        return self.relay.endpoint

    def close(self) -> None:
        """Stops accepting; ggml's server thread ends with the process."""
        self.relay.close()


def start_worker(
    options: WorkerOptions,
    available: Callable[[], tuple[int, int]],
    log: Callable[[str], None] = print,
) -> Worker:
    """ggml's server on the CPU and the relay in front of it, both serving when this returns.
    ``available()``: this machine's (available, total) RAM now, what a client is told."""
    try:
        allow = parse_allow(options.allow)
    except ValueError as exc:
        raise InvalidParameterError(str(exc)) from None
    prepare_omp_wait()  # before llama_cpp loads libgomp: its threads wait as the runner's do
    rpc = rpc_functions()
    threads = options.threads or physical_cores()
    port = _free_loopback_port()
    devices = _device_array(rpc.cpu_device())
    endpoint = f"{LOOPBACK}:{port}".encode()

    def serve() -> None:  # returns only if the server could not start
        rpc.start_server(endpoint, None, threads, 1, devices)

    server = threading.Thread(target=serve, name="li-rpc-server", daemon=True)
    server.start()
    hello = _wait_for_server(port, server)
    ledger = MemoryLedger(available, options.mem)
    config = RelayConfig((LOOPBACK, port), f"{options.host}:{options.port}", allow, ledger)
    try:
        relay = Relay(options.host, options.port, config, hello, log).start()
    except OSError as exc:
        raise BackendUnavailableError(
            f"cannot listen on {options.host}:{options.port}: {exc.strerror or exc}"
        ) from None
    return Worker(relay, hello.version, threads, server)


def _device_array(device: int) -> ctypes.Array[ctypes.c_void_p]:
    array = (ctypes.c_void_p * 1)(device)
    _KEEP.append(array)  # ggml keeps the pointer for the server's life: never collected
    return array


_KEEP: list[object] = []


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _wait_for_server(port: int, server: threading.Thread) -> wire.Hello:
    """ggml's server's HELLO, once it accepts (its thread ends at once if it cannot bind)."""
    deadline = time.monotonic() + START_TIMEOUT
    last: Exception | None = None
    while time.monotonic() < deadline:
        if not server.is_alive():
            break
        try:
            with contextlib.closing(wire.connect(LOOPBACK, port, timeout=2.0)) as sock:
                return wire.hello(sock)
        except (OSError, wire.WireError) as exc:
            last = exc
            time.sleep(0.05)
    raise BackendUnavailableError(f"llama.cpp's RPC server did not start ({last or 'exited'})")
