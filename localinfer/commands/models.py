"""`localinfer models`: the catalog and the models already on this machine, in one table."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localinfer.budget.memory import DeviceMemory


@dataclass(frozen=True, slots=True)
class ModelRow:
    name: str
    source: str  # embedded | bundled | hf cache | catalog | local
    quant: str
    size_bytes: int
    on_disk: bool  # False: size_bytes is the download size
    fits: bool | None  # at the default context on this device; None: could not tell
    max_context: int
    description: str


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "models",
        help="list catalog models and local models, with size and whether they fit",
        description="Catalog models and models on this machine (embedded, Hugging Face cache): "
        "size on disk (or download size), quantization, and whether each fits at the default "
        "context (2048 tokens per sequence, what chat and serve allocate by default).",
    )
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda[:N] | metal | SIZE")
    parser.add_argument("--json", action="store_true", help="print a JSON list")
    parser.set_defaults(func=run)


def collect_rows(device: str = "auto") -> list[ModelRow]:
    from localinfer.budget.memory import device_memory
    from localinfer.catalog import BundledSource, load_catalog
    from localinfer.errors import LocalinferError
    from localinfer.resolve import list_cached_repos, resolve_model

    memory = device_memory(device)
    rows: list[ModelRow] = []
    seen_paths: set[Path] = set()
    for entry in load_catalog().entries.values():
        resolved = resolve_model(entry.name, assemble=False)
        fit = _fit(entry.name, memory)
        if resolved.path is not None:
            seen_paths.add(resolved.path)
            size, on_disk = _size_on_disk(resolved.path), True
        else:
            size, on_disk = fit.weights_bytes, False
        if isinstance(entry.source, BundledSource):
            source = "embedded" if entry.name == "smollm2-135m" else "bundled"
        else:
            source = "hf cache" if on_disk else "catalog"
        rows.append(
            ModelRow(
                entry.name,
                source,
                fit.quant,
                size,
                on_disk,
                fit.fits,
                fit.max_context,
                entry.description,
            )
        )
    for repo in list_cached_repos():
        try:
            resolved = resolve_model(repo.repo_id)
        except LocalinferError:
            continue  # a cached repo that holds no model weights (a tokenizer, a dataset card)
        if resolved.path in seen_paths or resolved.entry is not None:
            continue  # already listed as a catalog model
        fit = _fit(repo.repo_id, memory)
        row = ModelRow(
            repo.repo_id,
            "hf cache",
            fit.quant,
            repo.size_on_disk,
            True,
            fit.fits,
            fit.max_context,
            "cached Hugging Face repo",
        )
        rows.append(row)
    return rows


@dataclass(frozen=True, slots=True)
class _Fit:
    quant: str
    weights_bytes: int
    fits: bool | None
    max_context: int


def _fit(spec: str, memory: DeviceMemory) -> _Fit:
    """The default-context budget of one model; a broken file shows as '?' instead of failing
    the whole listing."""
    from localinfer.budget import BudgetRequest, compute_budget
    from localinfer.errors import LocalinferError

    try:
        report = compute_budget(BudgetRequest(spec), memory)
    except LocalinferError:
        return _Fit("?", 0, None, 0)
    return _Fit(report.quant, report.weights_bytes, report.fits, report.max_context)


def _size_on_disk(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run(args: argparse.Namespace) -> int:
    rows = collect_rows(args.device)
    if args.json:
        print(json.dumps([asdict(r) for r in rows]))
        return 0
    from rich.console import Console
    from rich.table import Table

    from localinfer.budget.compute import DEFAULT_CTX
    from localinfer.budget.memory import human_bytes

    cells: list[tuple[str, ...]] = []
    for r in rows:
        # "~" marks a download size worked out from the catalog, not a file on disk.
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
