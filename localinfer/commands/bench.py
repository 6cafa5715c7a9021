"""`localinfer bench [--url URL | MODEL]`: load-test an OpenAI-compatible server or the engine.

Streams every request and reports TTFT, TPOT and end-to-end latency (mean, p50/p95/p99), output
tokens/s, requests/s and errors per concurrency level, as a table, JSON and/or a PNG plot.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import TYPE_CHECKING

from localinfer.command_help import command_parser
from localinfer.errors import InvalidParameterError
from localinfer.model_options import add_model_options, model_settings

if TYPE_CHECKING:
    from localinfer.bench.prompts import BenchPrompt
    from localinfer.bench.records import BenchReport
    from localinfer.bench.targets import EngineTarget


def register(subparsers: argparse._SubParsersAction) -> None:
    p = command_parser(subparsers, "bench", run)
    p.add_argument("model", nargs="?", help="in-process model (catalog name or file); no --url")
    p.add_argument("--url", help="server base URL, e.g. http://127.0.0.1:8000 (or .../v1)")
    p.add_argument("--model-name", help="model id to request (default: the server's first)")
    p.add_argument("--api-key", default=None, help="bearer token (default: $OPENAI_API_KEY)")
    p.add_argument(
        "--concurrency", default="1,4,8", help="levels, comma-separated (default: 1,4,8)"
    )
    p.add_argument("--requests", type=int, default=16, help="requests per level (default 16)")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens per answer (default 128)")
    p.add_argument("--prompts", help="JSONL prompt file (default: the shipped set)")
    p.add_argument(
        "--sizes", default="", help="only these prompt sizes: short,medium,long (default: all)"
    )
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="make every answer --max-tokens long (localinfer, vLLM: ignore_eos)",
    )
    p.add_argument("--warmup", type=int, default=1, help="unmeasured requests first (default 1)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="write latency/throughput plot (matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    engine = p.add_argument_group("in-process engine (MODEL, no --url)")
    engine.add_argument("--slots", type=int, default=None, help="default: the largest level")
    add_model_options(engine)
    engine.add_argument(
        "--no-prefix-reuse",
        action="store_true",
        help="prefill every prompt cold (repeated bench prompts otherwise hit the slot cache)",
    )


def run(args: argparse.Namespace) -> int:
    from localinfer.bench.loadgen import parse_levels
    from localinfer.bench.prompts import SIZES, load_prompts

    levels = parse_levels(args.concurrency)
    if args.requests < 1:
        raise InvalidParameterError(f"--requests must be at least 1, got {args.requests}")
    if args.max_tokens < 1:
        raise InvalidParameterError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    if args.slots is not None and args.slots < 1:
        raise InvalidParameterError(f"--slots must be at least 1, got {args.slots}")
    if args.warmup < 0:
        raise InvalidParameterError(f"--warmup must be 0 or more, got {args.warmup}")
    if args.url and args.model:
        raise InvalidParameterError("give either --url (a server) or MODEL (in-process), not both")
    sizes = tuple(s.strip() for s in args.sizes.split(",") if s.strip())
    unknown = [s for s in sizes if s not in SIZES]
    if unknown and not args.prompts:
        raise InvalidParameterError(f"--sizes: unknown {', '.join(unknown)} (known: short, "
                                    "medium, long)")  # fmt: skip
    prompts = load_prompts(args.prompts, sizes)
    report = asyncio.run(_bench(args, prompts, levels))

    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        from rich.console import Console

        from localinfer.bench.render import bench_table

        # Piped output has no terminal width; keep the table on one line per level anyway.
        Console(width=None if sys.stdout.isatty() else 120).print(bench_table(report))
    if args.plot:
        from localinfer.bench.plot import write_plot

        path = write_plot([report], args.plot)
        print(f"plot: {path}", file=sys.stderr)
    return 0 if all(lv.errors == 0 for lv in report.levels) else 4


async def _bench(
    args: argparse.Namespace, prompts: list[BenchPrompt], levels: list[int]
) -> BenchReport:
    from localinfer.bench.loadgen import LoadPlan
    from localinfer.bench.runner import bench_target
    from localinfer.bench.targets import EngineTarget, HttpTarget

    plan = LoadPlan(prompts, levels, args.requests, args.max_tokens, warmup=args.warmup)
    progress = not args.no_progress
    if args.url:
        api_key = args.api_key or os.environ.get("OPENAI_API_KEY")
        extra = {"ignore_eos": True} if args.ignore_eos else {}
        target = HttpTarget(args.url, model=args.model_name, api_key=api_key, extra_body=extra,
                            concurrency=max(levels))  # fmt: skip
        try:
            return await bench_target(target, plan, progress=progress)
        finally:
            await target.aclose()

    from localinfer.session import open_session

    session = open_session(
        args.model,
        slots=args.slots or max(levels),
        max_queue=max(64, 2 * max(levels)),
        prefix_reuse=not args.no_prefix_reuse,
        **model_settings(args),
    )
    try:
        print(f"localinfer: {session.runner_notice}", file=sys.stderr)
        target = EngineTarget(session, ignore_eos=args.ignore_eos)
        _check_context(target, prompts, args.max_tokens)
        return await bench_target(target, plan, progress=progress)
    finally:
        session.close()


def _check_context(target: EngineTarget, prompts: list[BenchPrompt], max_tokens: int) -> None:
    """A prompt plus its answer must fit one slot, or answers would be cut short and the
    figures would not compare with a server's."""
    from localinfer.bench.targets import longest_prompt

    longest = longest_prompt(target, prompts)
    ctx = target.session.engine.max_ctx
    if longest + max_tokens > ctx:
        raise InvalidParameterError(
            f"the longest prompt ({longest} tokens) plus --max-tokens {max_tokens} is more than "
            f"the {ctx}-token context per slot; raise --ctx or lower --max-tokens"
        )
