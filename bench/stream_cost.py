"""What streaming costs `localinfer serve`, and what its event loop spends per token.

One server per event loop (``--loops``: ``auto`` is what uvicorn picks, uvloop where installed;
``asyncio`` hides uvloop from the server process so uvicorn falls back to asyncio's own loop).
On each, the same greedy answers of ``--tokens`` tokens (EOS ignored) go out alternately streamed
(SSE, a chunk per token) and whole, ``--rounds`` times each. Printed per loop and mode: wall ms
per token and the main thread's CPU ms per token (the thread that runs the event loop: HTTP, SSE
framing, the hand-off of each token from the engine thread; bench/thread_cpu.py), medians. On a
machine whose cores all run compute threads, the event loop's CPU comes out of theirs.

    scripts/bench-stream-cost [--model FILE] [--backend llamacpp] [--loops auto,asyncio]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bench.thread_cpu import shares, snapshot
from localinfer.loading.embedded import embedded_model_path

# The HTTP client and the server stack (bench/peer_servers.py) are imported where they are used:
# `--help` imports neither.
if TYPE_CHECKING:
    from bench.peer_servers import Server

PROMPT = "Write a story about a cat who learns to read. Chapter {}"
# A module named uvloop that fails to import, first on the server's path: uvicorn's "auto" loop
# then takes asyncio's.
NO_UVLOOP = 'raise ImportError("uvloop hidden by bench/stream_cost.py")\n'


@dataclass(frozen=True, slots=True)
class Mode:
    wall_ms: float  # per token, median over rounds
    main_cpu_ms: float  # the server's main thread, per token, median over rounds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    about = __doc__.split("\n")[0]
    p = argparse.ArgumentParser(prog="scripts/bench-stream-cost", description=about)
    p.add_argument("--model", type=Path, default=None, help="GGUF (default: the embedded model)")
    p.add_argument("--backend", default="llamacpp")
    p.add_argument("--loops", default="auto,asyncio", help="comma-separated: auto, asyncio")
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    return p.parse_args(argv)


def answer(server: Server, i: int, tokens: int, stream: bool) -> tuple[float, float]:
    """Wall ms and main-thread CPU ms per token of one answer."""
    import httpx

    body = {"model": server.model, "prompt": PROMPT.format(i), "max_tokens": tokens,
            "temperature": 0, "stream": stream, **server.extra_body}  # fmt: skip
    pid = server.proc.pid
    before, began = snapshot(pid), time.perf_counter()
    url = server.url + "/v1/completions"
    if stream:
        with httpx.stream("POST", url, json=body, timeout=600) as response:
            response.raise_for_status()
            for _ in response.iter_lines():
                pass
    else:
        httpx.post(url, json=body, timeout=600).raise_for_status()
    wall = (time.perf_counter() - began) * 1000 / tokens
    main = [s for s in shares(pid, before, snapshot(pid), tokens) if s.group == "main"]
    return wall, main[0].ms_per_token if main else 0.0


def measure(server: Server, args: argparse.Namespace) -> dict[str, Mode]:
    answer(server, -1, 16, True)  # warm-up
    runs: dict[str, list[tuple[float, float]]] = {"streamed": [], "whole": []}
    for i in range(args.rounds):
        runs["streamed"].append(answer(server, i, args.tokens, True))
        runs["whole"].append(answer(server, i, args.tokens, False))
    return {
        mode: Mode(statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows))
        for mode, rows in runs.items()
    }


def server_env(loop: str, hide: Path) -> dict[str, str] | None:
    if loop == "auto":
        return None
    if loop != "asyncio":
        raise SystemExit(f"unknown loop {loop!r}: auto or asyncio")
    (hide / "uvloop.py").write_text(NO_UVLOOP)
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(hide), *([path] if path else [])])}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from bench.peer_servers import start_localinfer

    model = args.model or embedded_model_path()
    print(f"bench-stream-cost: {model.name}, {args.backend}, {args.threads} threads, greedy "
          f"/v1/completions, {args.tokens} tokens, median of {args.rounds} rounds")  # fmt: skip
    print(f"{'loop':8s} {'mode':9s} {'wall ms/token':>14s} {'vs whole':>9s} "
          f"{'main CPU ms/token':>18s}")  # fmt: skip
    with tempfile.TemporaryDirectory() as hide:
        for loop in args.loops.split(","):
            env = server_env(loop.strip(), Path(hide))
            server = start_localinfer(model, slots=4, ctx=1024, threads=args.threads,
                                      backend=args.backend, env=env)  # fmt: skip
            try:
                modes = measure(server, args)
            finally:
                server.stop()
            whole = modes["whole"].wall_ms
            for mode, m in modes.items():
                print(f"{loop:8s} {mode:9s} {m.wall_ms:14.2f} {m.wall_ms / whole:8.3f}x "
                      f"{m.main_cpu_ms:18.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
