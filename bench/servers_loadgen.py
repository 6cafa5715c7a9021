"""`localinfer serve` against llama-cpp-python's server, with `localinfer bench`'s load generator.

Both servers run as separate processes on the same GGUF file with the same thread count. For
each concurrency level the same requests (the shipped prompt set, in order) go to localinfer and
then to the peer, level by level, so machine noise falls on both in turn. It prints the bench
table of each server and a table of ratios (localinfer / peer: output tok/s, requests/s, and
TTFT / latency p50, where lower is better).

Every answer is forced to --max-tokens (localinfer: ignore_eos; the peer: a logit bias that bans
EOS), so both do the same work. localinfer reports tokens in its usage chunk; the peer sends
none, so its tokens are its streamed text chunks (one per token). The peer runs with
``--interrupt_requests False``: otherwise each new request cuts the one in flight
(bench/peer_servers.py; docs/facts.md, "The peer server").

    scripts/bench-servers                          # embedded SmolLM2-135M Q4_1
    scripts/bench-servers --concurrency 1,4 --requests 8 --max-tokens 32
    scripts/bench-servers --plot bench.png --json bench.json

Needs llama-cpp-python's server extras for the peer: pip install 'llama-cpp-python[server]'.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from localinfer.bench.records import BenchReport, LevelResult
from localinfer.bench.render import bench_table

# The servers (bench/peer_servers.py: the whole server stack) and the HTTP load generator are
# imported where they are used: `--help` imports neither.
if TYPE_CHECKING:
    from bench.peer_servers import Server


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/bench-servers", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="GGUF file (default: the embedded SmolLM2-135M Q4_1)")
    p.add_argument("--concurrency", default="1,4,8", help="levels, comma-separated")
    p.add_argument("--requests", type=int, default=16, help="requests per level")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--sizes", default="", help="prompt sizes: short,medium,long (default all)")
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--ctx", type=int, default=1024, help="localinfer context per slot")
    p.add_argument("--plot", type=Path, help="write both servers' curves to this PNG")
    p.add_argument("--json", type=Path, help="write both reports to this JSON file")
    return p.parse_args()


# -- the run ----------------------------------------------------------------------------------


async def bench_both(
    args: argparse.Namespace, servers: list[Server], levels: list[int], completions: bool = False
) -> list[BenchReport]:
    """Every level against each server in turn (warm-up first); ``completions``: the prompts as
    raw text to /v1/completions instead of chat."""
    from localinfer.bench.loadgen import run_level
    from localinfer.bench.prompts import load_prompts
    from localinfer.bench.targets import HttpTarget

    sizes = tuple(s for s in args.sizes.split(",") if s)
    prompts = load_prompts(sizes=sizes)
    targets = [HttpTarget(s.url, extra_body=s.extra_body, concurrency=max(levels),
                          completions=completions) for s in servers]  # fmt: skip
    try:
        for t in targets:
            await t.resolve_model()
            await run_level(t, prompts[:1], 1, 1, 4)  # warm-up, not measured
        results: list[list[LevelResult]] = [[] for _ in servers]
        for c in levels:
            for server, target, out in zip(servers, targets, results, strict=True):
                level = await run_level(target, prompts, c, max(args.requests, c), args.max_tokens)
                out.append(level)
                print(f"  {server.name:>21} {c:>2} clients: {level.output_tps:7.1f} tok/s, "
                      f"{level.errors} errors", file=sys.stderr, flush=True)  # fmt: skip
    finally:
        for t in targets:
            await t.aclose()
    return [
        BenchReport(s.name, t.model, args.max_tokens, r)
        for s, t, r in zip(servers, targets, results, strict=True)
    ]


def ratio_table(ours: BenchReport, peer: BenchReport) -> Table:
    table = Table(title="localinfer / llama-cpp-python (>1 is better for tok/s and req/s, "
                  "<1 is better for latency)", title_justify="left")  # fmt: skip
    for header in ("conc", "out tok/s", "req/s", "TTFT p50", "TTFT p95", "latency p50"):
        table.add_column(header, justify="right")

    def div(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}x" if a is not None and b else "n/a"

    for a, b in zip(ours.levels, peer.levels, strict=True):
        table.add_row(str(a.concurrency), div(a.output_tps, b.output_tps),
                      div(a.requests_per_s, b.requests_per_s), div(a.ttft.p50, b.ttft.p50),
                      div(a.ttft.p95, b.ttft.p95), div(a.e2e.p50, b.e2e.p50))  # fmt: skip
    return table


def main() -> int:
    args = parse_args()
    from bench.peer_servers import start_localinfer, start_peer
    from localinfer.bench.loadgen import parse_levels
    from localinfer.loading.loader import load_model

    levels = parse_levels(args.concurrency)

    if args.model:
        model_path = Path(args.model)
    else:
        from localinfer.loading.embedded import embedded_model_path

        model_path = embedded_model_path()
    eos_ids = list(load_model(model_path).tokenizer.eos_ids)
    servers = [start_localinfer(model_path, slots=max(levels), ctx=args.ctx, threads=args.threads)]
    try:
        servers.append(start_peer(model_path, threads=args.threads, eos_ids=eos_ids))
        ours, peer = asyncio.run(bench_both(args, servers, levels))
    finally:
        for s in servers:
            s.stop()

    console = Console(width=None if sys.stdout.isatty() else 120)
    print(f"bench-servers: {model_path.name}, {args.threads} threads each, greedy chat, "
          f"{args.max_tokens} tokens per answer, {args.requests} requests per level")  # fmt: skip
    console.print(bench_table(ours))
    console.print(bench_table(peer))
    console.print(ratio_table(ours, peer))
    if args.json:
        args.json.write_text(json.dumps([ours.as_dict(), peer.as_dict()], indent=2))
    if args.plot:
        from localinfer.bench.plot import write_plot

        print(f"plot: {write_plot([ours, peer], args.plot)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
