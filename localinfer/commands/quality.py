"""`localinfer quality MODEL [--quant int8,int4] [--backend torch]`: what quantization costs."""

from __future__ import annotations

import argparse

from localinfer.command_help import command_parser
from localinfer.threads_option import add_threads_option


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(subparsers, "quality", run)
    parser.add_argument("model", nargs="?", default=None, help="default: the embedded model")
    parser.add_argument(
        "--quant", default="int8,int4", help="comma-separated quantizations (default: int8,int4)"
    )
    parser.add_argument(
        "--backend",
        default="torch",
        help="torch | llamacpp | mlx | all (every backend this machine runs, one table); "
        "default: torch",
    )
    parser.add_argument(
        "--tokens",
        type=int,
        default=None,
        help="score only the first N tokens of the text (default: all of it; MLX rows on a CPU: "
        "the first 256)",
    )
    parser.add_argument(
        "--window", type=int, default=512, help="tokens per scored window (default: 512)"
    )
    parser.add_argument(
        "--speed-steps", type=int, default=32, help="decode steps timed; 0: skip (default: 32)"
    )
    add_threads_option(parser)


def run(args: argparse.Namespace) -> int:
    from localinfer.errors import InvalidParameterError
    from localinfer.quality.run import QualityOptions, measure_quality
    from localinfer.session import open_model

    quants = [q.strip() for q in args.quant.split(",") if q.strip()]
    if not quants:
        raise InvalidParameterError("--quant needs at least one quantization")
    if args.tokens is not None and args.tokens < 2:
        raise InvalidParameterError("--tokens must be at least 2")
    if args.window < 2:  # a window scores its tokens after the first: one token scores nothing
        raise InvalidParameterError(f"--window must be at least 2 tokens, got {args.window}")
    if args.speed_steps < 0:
        raise InvalidParameterError(
            f"--speed-steps must be 0 (skip) or more, got {args.speed_steps}"
        )
    model = open_model(args.model).model
    opts = QualityOptions(
        quants=quants, backend=args.backend, max_tokens=args.tokens, window=args.window,
        speed_steps=args.speed_steps, threads=args.threads,
    )  # fmt: skip
    report = measure_quality(model, opts)
    print(report.render())
    return 0
