"""`localinfer models`: the catalog and the models already on this machine, in one table."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from localinfer.command_help import command_parser

if TYPE_CHECKING:
    from localinfer.budget.report import BudgetReport


@dataclass(frozen=True, slots=True)
class ModelRow:
    name: str
    source: str  # embedded | bundled | hf cache | catalog | hub | local
    quant: str
    size_bytes: int
    on_disk: bool  # False: size_bytes is the download size
    fits: bool | None  # at the default context on this device; None: could not tell
    max_context: int
    description: str


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(subparsers, "models", run)
    parser.add_argument(
        "--device", default="auto", help="auto (default) | cpu | cuda[:N] | metal | SIZE"
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list")


def collect_rows(device: str = "auto") -> list[ModelRow]:
    from localinfer.budget.memory import device_memory
    from localinfer.model_listing import BudgetAsk, list_models

    rows = []
    for model in list_models(BudgetAsk(), device_memory(device)):
        report = model.report  # None: a broken file shows as '?' in its row
        size = model.size_on_disk if model.on_disk else _download_size(report)
        rows.append(
            ModelRow(
                model.name,
                model.source,
                report.quant if report else "?",
                size or 0,
                model.on_disk,
                report.fits if report else None,
                report.max_context if report else 0,
                model.description,
            )
        )
    return rows


def _download_size(report: BudgetReport | None) -> int:
    """What a model not on disk downloads: its files' size on the Hub where its metadata says,
    else its parameters at the file's bits per weight (catalog numbers). Not the budget's
    weights: those are what the backend holds in memory (torch's float32 copy of a Q8_0 file is
    3.8 times the file)."""
    from localinfer.errors import LocalinferError
    from localinfer.facts.quant import bytes_for_params

    if report is None:
        return 0
    if report.download_bytes:
        return report.download_bytes
    try:
        return bytes_for_params(report.params, report.quant)
    except LocalinferError:  # a type without a bits figure: the budget's own weights
        return report.weights_bytes


def run(args: argparse.Namespace) -> int:
    rows = collect_rows(args.device)
    if args.json:
        print(json.dumps([asdict(r) for r in rows]))
        return 0
    from rich.console import Console
    from rich.table import Table

    from localinfer.budget.memory import human_bytes
    from localinfer.budget.report import DEFAULT_CTX

    cells: list[tuple[str, ...]] = []
    for r in rows:
        # "~" marks a download size (the Hub's or the catalog's), not a file on disk.
        size = human_bytes(r.size_bytes) if r.on_disk else f"~{human_bytes(r.size_bytes)}"
        fits = {True: "yes", False: "no", None: "?"}[r.fits]
        cells.append((r.name, r.source, r.quant, size, fits, f"{r.max_context:,}", r.description))
    headers = ("name", "source", "quant", "size", "fits", "max ctx", "description")
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers[:-1])]
    console = Console()
    # Fixed columns keep their full width; the description takes what is left (or goes).
    room = console.width - sum(widths) - 3 * len(headers) - 1
    shown = headers if room >= 12 else headers[:-1]
    table = Table(title=f"models (fits: at {DEFAULT_CTX} ctx, 1 sequence, on this device)")
    for header, width in zip(shown, [*widths, room], strict=False):
        justify = "right" if header in ("size", "max ctx") else "left"
        table.add_column(header, no_wrap=True, overflow="ellipsis", width=width, justify=justify)
    styles = {"yes": "[green]yes[/]", "no": "[red]no[/]", "?": "?"}
    for c in cells:
        table.add_row(*c[:4], styles[c[4]], *c[5 : len(shown)])
    console.print(table)
    return 0
