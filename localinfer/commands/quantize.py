"""`localinfer quantize SRC --to q8_0|q4_0|q4_k_m|int8|int4 [-o OUT]`: a smaller GGUF."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from localinfer.command_help import command_parser

if TYPE_CHECKING:
    from localinfer.gguf_quantize import QuantizeProgress

TARGET_CHOICES = ("int8", "int4", "q8_0", "q4_0", "q4_k_m")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(subparsers, "quantize", run)
    parser.add_argument("source", metavar="SRC", help="GGUF file with F32, F16 or BF16 weights")
    parser.add_argument(
        "--to", required=True, type=str.lower, choices=TARGET_CHOICES, help="target type"
    )
    parser.add_argument(
        "-o", "--output", default=None, help="output file (default: SRC's name with the type)"
    )
    parser.add_argument("--threads", type=int, default=None, help="default: physical cores")
    parser.add_argument(
        "--allow-requantize",
        action="store_true",
        help="accept an already-quantized SRC (quality suffers: quantize from F16/BF16 if you can)",
    )


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from localinfer.gguf_quantize import quantize_gguf

    console = Console(stderr=True)
    columns = (
        TextColumn("quantizing"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
    )
    # The bar is for people watching a terminal; piped output gets only the final line.
    with Progress(
        *columns, console=console, transient=True, disable=not console.is_terminal
    ) as progress:
        task = progress.add_task("", total=None)

        def on_progress(event: QuantizeProgress) -> None:
            progress.update(
                task, total=event.total, completed=event.done - 1, description=event.tensor
            )

        result = quantize_gguf(
            Path(args.source),
            Path(args.output) if args.output else None,
            args.to,
            threads=args.threads,
            allow_requantize=args.allow_requantize,
            on_progress=on_progress,
        )
    mib = 1024 * 1024
    print(
        f"wrote {result.output} ({result.quant}): {result.source_bytes / mib:.1f} MiB -> "
        f"{result.output_bytes / mib:.1f} MiB in {result.seconds:.1f} s"
    )
    return 0
