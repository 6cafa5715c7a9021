"""Serving throughput and TTFT of `localinfer serve` against llama-cpp-python's own server.

Both servers run as separate processes on the same GGUF file with the same thread count, and the
same load runs against each in the same run, interleaved (localinfer, peer, localinfer, ...) so
machine noise falls on both. For 1/4/8/16 concurrent streaming clients it prints aggregate
tokens/s (median over runs) and TTFT p50/p95/p99 (over every request of every run), side by side,
with the ratio. The peer runs with ``--interrupt_requests False`` (otherwise a new request cuts
the one in flight: docs/facts.md, "The peer server").

Completion tokens are counted the same way for both servers: the streamed text re-tokenized with
the model's tokenizer (the peer sends no usage chunk). Every answer is forced to ``--max-tokens``
(localinfer: ignore_eos; the peer: a logit bias banning EOS), so both do the same work
(bench/peer_servers.py).

Then the autocomplete rows (bench/autocomplete.py): fill-in-the-middle requests while a
user types ``--fim-lines`` lines into a source file cut to ``--fim-tokens`` tokens, one request per
line, TTFT p50/p95 with prefix reuse off, on, and on with ``--cache-reuse N``
(``--fim-cache-reuse``, default 64: cached chunks found later in the prompt are moved rather than
prefilled, an approximation), each one's ratio over reuse off (target: <= 0.3x), for the PSM
layout (prefix first: StarCoder, Qwen) and the SPM one (suffix first: Codestral), on the embedded
model's weights with renamed FIM markers (or ``--fim-model``, a GGUF with FIM tokens).

    scripts/bench-server                      # embedded SmolLM2-135M Q4_1
    scripts/bench-server --clients 1,8 --runs 5 --threads 2
    scripts/bench-server --no-peer            # localinfer only
    scripts/bench-server --autocomplete-only --fim-lines 8
    scripts/bench-server --two-models-only --runs 2

Then the two-model row (bench/two_models.py): one server, two models that both fit,
two clients on one model or alternating between both: TTFT of each, the ratio, and the reloads.

Needs llama-cpp-python's server extras for the peer: pip install 'llama-cpp-python[server]'.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

# The servers (bench/peer_servers.py: the whole server stack) are imported where they start:
# `--help` does not import them.
if TYPE_CHECKING:
    from bench.peer_servers import Server

ROOT = Path(__file__).resolve().parent.parent
TARGET_AT_8 = 1.5  # localinfer / peer aggregate tokens/s at 8 clients
TOPICS = ["cats", "rain", "chess", "bread", "rivers", "maths", "music", "trains",
          "ships", "bees", "snow", "tea", "clocks", "maps", "owls", "glass"]  # fmt: skip


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/bench-server", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="GGUF file (default: the embedded SmolLM2-135M Q4_1)")
    p.add_argument("--clients", default="1,4,8,16", help="comma-separated concurrency levels")
    p.add_argument("--requests-per-client", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=3, help="runs per level (median tok/s)")
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--slots", type=int, default=8, help="localinfer slots")
    p.add_argument("--ctx", type=int, default=512, help="localinfer context per slot")
    p.add_argument("--no-peer", action="store_true", help="measure localinfer only")
    p.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    fim = p.add_argument_group("autocomplete rows")
    which = fim.add_mutually_exclusive_group()
    which.add_argument("--no-autocomplete", action="store_true", help="skip them")
    which.add_argument("--autocomplete-only", action="store_true", help="only them")
    fim.add_argument(
        "--fim-file",
        type=Path,
        default=ROOT / "localinfer" / "engine" / "engine.py",
        help="the file being edited (cut to --fim-tokens)",
    )
    fim.add_argument("--fim-tokens", type=int, default=1500)
    fim.add_argument("--fim-lines", type=int, default=16, help="lines typed, one request each")
    fim.add_argument(
        "--fim-cursor", type=float, default=0.5, help="where typing starts: 0 top, 0.5 middle"
    )
    fim.add_argument(
        "--fim-cache-reuse",
        type=int,
        default=64,
        metavar="N",
        help="the third server's --cache-reuse (0: no third server)",
    )
    fim.add_argument(
        "--fim-backend",
        default="llamacpp",
        choices=("llamacpp", "torch", "mlx"),
        help="backend of the autocomplete servers",
    )
    fim.add_argument(
        "--fim-model",
        type=Path,
        help="a GGUF with FIM tokens (default: the embedded model, markers renamed, both layouts)",
    )
    from bench.two_models import add_two_model_options

    add_two_model_options(p)
    return p.parse_args()


# -- load -------------------------------------------------------------------------------------


@dataclass
class Level:
    tps: list[float] = field(default_factory=list)  # aggregate tokens/s, one per run
    ttft: list[float] = field(default_factory=list)  # seconds, every request of every run
    tokens: list[int] = field(default_factory=list)  # completion tokens per request
    failures: int = 0


async def one_request(
    client: httpx.AsyncClient, server: Server, prompt: str, max_tokens: int
) -> tuple[float | None, str, bool]:
    """(TTFT, streamed text, finished) of one streaming chat request."""
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        **server.extra_body,
    }
    start = time.perf_counter()
    ttft, parts, finished = None, [], False
    async with client.stream("POST", server.url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return None, "", False
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                text = (choice.get("delta") or {}).get("content") or ""
                if text and ttft is None:
                    ttft = time.perf_counter() - start
                parts.append(text)
                finished = finished or choice.get("finish_reason") is not None
    return ttft, "".join(parts), finished


async def run_level(
    server: Server, clients: int, per_client: int, max_tokens: int, count, level: Level
) -> None:
    async def client_loop(c: int, http: httpx.AsyncClient) -> list[tuple]:
        out = []
        for r in range(per_client):
            topic = TOPICS[(c + r * clients) % len(TOPICS)]
            prompt = f"Write a long story about {topic}, part {c * per_client + r}."
            out.append(await one_request(http, server, prompt, max_tokens))
        return out

    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        start = time.perf_counter()
        results = await asyncio.gather(*(client_loop(c, http) for c in range(clients)))
        wall = time.perf_counter() - start
    total = 0
    for ttft, text, finished in (item for per in results for item in per):
        if ttft is None or not finished:
            level.failures += 1
            continue
        n = count(text)
        total += n
        level.ttft.append(ttft)
        level.tokens.append(n)
    level.tps.append(total / wall)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = int(pos), min(int(pos) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def main() -> int:
    args = parse_args()
    figures = {} if args.autocomplete_only or args.two_models_only else throughput(args)
    auto = None if args.no_autocomplete or args.two_models_only else autocomplete(args)
    two = None if args.no_two_models or args.autocomplete_only else two_models(args)
    if args.json:
        doc = {
            name: {str(c): {"tok_s_median": statistics.median(lv.tps), "tok_s_runs": lv.tps,
                            "ttft_p50_s": pct(lv.ttft, 50), "ttft_p95_s": pct(lv.ttft, 95),
                            "ttft_p99_s": pct(lv.ttft, 99), "failures": lv.failures,
                            "mean_tokens": statistics.fmean(lv.tokens) if lv.tokens else 0}
                   for c, lv in per.items()}
            for name, per in figures.items()}  # fmt: skip
        if auto is not None:
            doc["autocomplete"] = auto
        if two is not None:
            doc["two_models"] = two
        args.json.write_text(json.dumps(doc, indent=2))
    return 0


def throughput(args: argparse.Namespace) -> dict:
    """The throughput rows: both servers at each concurrency level; prints the table."""
    from bench.peer_servers import start_localinfer, start_peer
    from localinfer.loading.loader import load_model

    model_path = bench_model(args)
    tokenizer = load_model(model_path).tokenizer
    levels = [int(c) for c in args.clients.split(",")]

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    servers = [start_localinfer(model_path, slots=args.slots, ctx=args.ctx, threads=args.threads)]
    try:
        if not args.no_peer:
            servers.append(start_peer(model_path, threads=args.threads, eos_ids=tokenizer.eos_ids))
        figures = {s.name: {c: Level() for c in levels} for s in servers}
        for s in servers:  # warm-up: first-request costs are not serving speed
            asyncio.run(run_level(s, 1, 1, 4, count, Level()))
        for run in range(args.runs):
            for c in levels:
                for s in servers:
                    asyncio.run(
                        run_level(
                            s,
                            c,
                            args.requests_per_client,
                            args.max_tokens,
                            count,
                            figures[s.name][c],
                        )
                    )
                    lv = figures[s.name][c]
                    print(
                        f"  run {run + 1}/{args.runs} {s.name:>17} {c:>2} clients: "
                        f"{lv.tps[-1]:7.1f} tok/s",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        for s in servers:
            s.stop()
    report(args, model_path, levels, figures)
    return figures


def autocomplete(args: argparse.Namespace) -> dict:
    """The autocomplete rows, in this process; prints them and returns their figures."""
    from bench.autocomplete import AutocompleteSettings, report_lines, run_autocomplete

    settings = AutocompleteSettings(
        args.fim_file,
        backend=args.fim_backend,
        threads=args.threads,
        max_tokens=args.fim_tokens,
        lines=args.fim_lines,
        cursor=args.fim_cursor,
        model=args.fim_model,
        cache_reuse=args.fim_cache_reuse,
    )
    workload, rows = run_autocomplete(settings, log=lambda m: print(m, file=sys.stderr, flush=True))
    print("\n".join(report_lines(workload, rows, settings)))
    return {
        "file": str(workload.file),
        "file_tokens": workload.tokens,
        "suffix_tokens": workload.suffix_tokens,
        "first_line_typed": workload.first_line,
        "requests": len(workload.prefixes) - 1,
        "layouts": [row.as_dict() for row in rows],
    }


def two_models(args: argparse.Namespace) -> dict:
    """The two-model row, against its own server; prints it and returns its figures."""
    from bench.two_models import TwoModelSettings, run_row

    return run_row(TwoModelSettings(bench_model(args), args.second_model, args.threads, args.slots,
                                    args.ctx, args.max_tokens, args.requests_per_client,
                                    args.runs))  # fmt: skip


def bench_model(args: argparse.Namespace) -> Path:
    """--model, else the embedded SmolLM2-135M's GGUF."""
    if args.model:
        return Path(args.model)
    from localinfer.loading.embedded import embedded_model_path

    return embedded_model_path()


def report(args: argparse.Namespace, model: Path, levels: list[int], figures: dict) -> None:
    print(
        f"\nbench-server: {model.name}, {args.threads} threads, greedy chat, "
        f"{args.max_tokens} tokens per answer, {args.requests_per_client} requests per client, "
        f"median of {args.runs} runs; localinfer {args.slots} slots x {args.ctx} ctx"
    )
    names = list(figures)
    head = f"{'clients':>7}"
    for n in names:
        head += f" | {n + ' tok/s':>22} {'TTFT p50/p95/p99 ms':>21}"
    if len(names) == 2:
        head += " | ratio"
    print(head)
    for c in levels:
        row = f"{c:>7}"
        for n in names:
            lv = figures[n][c]
            t = [pct(lv.ttft, q) * 1000 for q in (50, 95, 99)]
            fail = f" ({lv.failures} failed)" if lv.failures else ""
            row += (
                f" | {statistics.median(lv.tps):>22.1f} "
                f"{t[0]:>7.0f}/{t[1]:>6.0f}/{t[2]:>6.0f}{fail}"
            )
        if len(names) == 2:
            a, b = (statistics.median(figures[n][c].tps) for n in names)
            row += f" | {a / b:5.2f}x" if b else " |   n/a"
        print(row)
    if len(names) == 2 and 8 in levels:
        a, b = (statistics.median(figures[n][8].tps) for n in names)
        verdict = "meets" if b and a / b >= TARGET_AT_8 else "misses"
        print(
            f"8 clients: localinfer / llama-cpp-python = {a / b:.2f}x aggregate throughput "
            f"({verdict} the {TARGET_AT_8}x target)"
        )


if __name__ == "__main__":
    sys.exit(main())
