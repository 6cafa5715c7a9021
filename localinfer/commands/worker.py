"""`localinfer worker`: lend this machine's memory and CPU to a model split across machines
(llama.cpp's RPC server; a runner elsewhere loads some of its layers here with --rpc)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import sys
import threading

from localinfer.command_help import command_parser
from localinfer.threads_option import add_threads_option

DEFAULT_PORT = 50052  # llama.cpp's rpc-server's


def register(subparsers: argparse._SubParsersAction) -> None:
    p = command_parser(subparsers, "worker", run)
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this "
        "machine only; another address lets anyone who reaches the port use this memory)",
    )  # fmt: skip
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default: {DEFAULT_PORT}")
    p.add_argument("--mem", metavar="SIZE", help="most memory clients may take, like 12GiB "
                   "(default: the RAM available)")  # fmt: skip
    p.add_argument(
        "--allow",
        metavar="IP,...",
        help="serve only these client addresses or networks (like 192.168.1.20,10.0.0.0/24); "
        "others are refused unread",
    )
    add_threads_option(p)


def run(args: argparse.Namespace) -> int:
    from localinfer.budget.memory import cpu_memory, human_bytes, parse_size
    from localinfer.errors import InvalidParameterError
    from localinfer.rpc_nodes import start_rpc_worker

    if not 0 <= args.port < 65536:
        raise InvalidParameterError(f"--port must be 0-65535, got {args.port}")
    mem = parse_size(args.mem) if args.mem else None
    if not _loopback(args.host):
        print(f"localinfer worker: warning: listening on {args.host}: llama.cpp's RPC has no "
              "authentication, so anyone who can reach this port can run code on this memory"
              + ("" if args.allow else " (--allow limits who)"), file=sys.stderr)  # fmt: skip
    _quiet_stdout()  # ggml's server prints a line per connection
    worker = start_rpc_worker(
        args.host, args.port, mem=mem, allow=args.allow, threads=args.threads,
        available=cpu_memory, log=lambda line: print(f"localinfer worker: {line}", file=sys.stderr),
    )  # fmt: skip
    free = min(cpu_memory()[0], mem) if mem else cpu_memory()[0]
    print(f"localinfer worker: llama.cpp RPC {worker.version} listening on {worker.endpoint} "
          f"(port {worker.relay.address[1]}; CPU, {worker.threads} threads, {human_bytes(free)} "
          f"free{', capped by --mem' if mem else ''})", file=sys.stderr, flush=True)  # fmt: skip
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    worker.close()
    return 0


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _quiet_stdout() -> None:
    """Point file descriptor 1 at /dev/null (ggml's printf), keeping Python's stdout."""
    sys.stdout.flush()
    kept = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    sys.stdout = os.fdopen(kept, "w", buffering=1)
