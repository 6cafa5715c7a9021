"""`localinfer pull MODEL [--quant Q]`: download one model's files into the Hugging Face cache,
after the budget says it fits (or `--force`).

A catalog model is budgeted from the catalog; any other Hub repo from its metadata (the GGUF
header over range requests, or config.json + safetensors headers), and then exactly the files
that budget read are fetched, so the model on disk is the one that was budgeted."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from localinfer.command_help import command_parser
from localinfer.model_options import add_mmproj_option

if TYPE_CHECKING:
    from localinfer.budget import BudgetReport
    from localinfer.hub import DownloadPlan


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(subparsers, "pull", run)
    parser.add_argument(
        "model", help="catalog name (see `localinfer models`) or an HF repo id, ORG/REPO[:QUANT]"
    )
    parser.add_argument(
        "--quant",
        default=None,
        help="Q4_K_M, Q8_0, ... or none (original safetensors); default: the catalog's default, "
        "or a GGUF repo's Q4_K_M file",
    )
    add_mmproj_option(
        parser, "also fetch the repo's vision projector (mmproj*.gguf: the F16 one, or FILE)"
    )
    parser.add_argument("--ctx", default=None, help="context the budget plans for (default 2048)")
    parser.add_argument(
        "--concurrency", default="1", help="sequences the budget plans for (default: 1)"
    )
    parser.add_argument(
        "--device", default="auto", help="auto (default) | cpu | cuda[:N] | metal | SIZE"
    )
    parser.add_argument("--backend", default=None, help="torch | llamacpp | mlx (budget only)")
    parser.add_argument(
        "--force", action="store_true", help="download even if the budget or disk space says no"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from localinfer.budget.memory import human_bytes
    from localinfer.hub import (
        cached_file,
        download,
        free_disk_bytes,
        list_remote,
        remove_partial_downloads,
    )

    say = _stderr
    bundled = _bundled_package(args.model)
    if bundled is not None:
        say(f"{args.model} ships with localinfer (pip package {bundled}); nothing to download")
        return 0
    plan = _plan_or_explain(args.model, args.quant)
    if plan.entry is not None:
        report: BudgetReport | None = _budget(plan, args)
    else:
        plan, report = _hub_budget(plan, args)
    if report is not None:
        refused = _refuse_unless_fits(plan, report, args)
        if refused is not None:
            return refused

    cleanup = remove_partial_downloads(plan.repo_id)
    if cleanup.files:
        say(
            f"removed {cleanup.files} partial download(s), {human_bytes(cleanup.freed_bytes)}, "
            "that a stopped pull left in the cache"
        )
    cached = cached_file(plan)
    if cached is not None:  # nothing to ask the Hub: this works offline too
        print(cached)
        say(f"{plan.name}: {plan.patterns[0]} is already in the cache; ready offline")
        return 0
    listing = list_remote(plan)
    missing = [f for f in listing.files if not f.cached]
    if not missing:
        say(f"{plan.name}: all {len(listing.files)} file(s) already in the cache")
    else:
        free = free_disk_bytes()
        need = listing.missing_bytes
        if need > free and not args.force:
            from localinfer.errors import OutOfMemoryBudgetError

            raise OutOfMemoryBudgetError(
                f"{plan.name} needs {human_bytes(need)} of disk but the cache has "
                f"{human_bytes(free)} free; --force tries anyway"
            )
        say(
            f"downloading {len(missing)} file(s), {human_bytes(need)}, from {plan.repo_id} "
            f"@ {listing.commit[:10]}"
        )
    folder = download(plan, progress=not args.quiet)
    where = [folder / f.path for f in listing.files]
    for path in where:
        if not path.is_file():
            from localinfer.hub import HubError

            raise HubError(f"{path.name} did not arrive in the cache ({folder})")
    print(where[0] if len(where) == 1 else folder)
    say(f"{plan.name}: {human_bytes(listing.total_bytes)} in the cache; ready offline")
    return 0


def _refuse_unless_fits(
    plan: DownloadPlan, report: BudgetReport, args: argparse.Namespace
) -> int | None:
    """3 when the model does not fit and --force is not given; None to go on."""
    from localinfer.budget.memory import human_bytes

    what = f"{plan.name} {report.quant}"
    if not report.fits:
        hints = "; ".join(f"try {s.change}" for s in report.suggestions[:3])
        message = (
            f"{what} does not fit: it needs {human_bytes(report.total_bytes)}"
            f" at {report.ctx} ctx x {report.concurrency} seq, {report.device} has "
            f"{human_bytes(report.available_bytes)}" + (f" ({hints})" if hints else "")
        )
        if not args.force:
            _stderr(f"localinfer: {message}; --force downloads it anyway")
            return 3
        _stderr(f"localinfer: warning: {message}; downloading anyway (--force)")
    else:
        _stderr(
            f"budget: {what} needs {human_bytes(report.total_bytes)} of "
            f"{human_bytes(report.available_bytes)} on {report.device}: fits"
        )
    return None


def _hub_budget(
    plan: DownloadPlan, args: argparse.Namespace
) -> tuple[DownloadPlan, BudgetReport | None]:
    """A repo outside the catalog: its budget from the Hub's metadata, and the plan narrowed to
    the files that budget read. A model the budget cannot read (a malformed header, an
    architecture it does not count) is still pulled, with a warning."""
    from localinfer.backend_budget import compute_budget
    from localinfer.budget import BudgetRequest
    from localinfer.budget.model_facts import model_facts
    from localinfer.counts import parse_count
    from localinfer.errors import LocalinferError
    from localinfer.hub import HubError, exact_files
    from localinfer.resolve import ResolvedModel

    tag = plan.quant
    resolved = ResolvedModel(
        plan.repo_id, None, "hub_remote", None, tag, plan.repo_id, picked_by=tag
    )
    try:
        facts = model_facts(resolved, mmproj=args.mmproj)
        request = BudgetRequest(
            model=plan.repo_id,
            ctx=parse_count(args.ctx, "--ctx") if args.ctx is not None else None,
            concurrency=parse_count(args.concurrency, "--concurrency"),
            quant=tag,
            device=args.device,
            backend=args.backend,
            mmproj=args.mmproj,
        )
        report = compute_budget(request, facts=facts)
    except HubError:
        raise
    except LocalinferError as exc:
        _stderr(f"localinfer: warning: no memory budget for {plan.name} before download: {exc}")
        return plan, None
    return exact_files(plan, facts.hub_files, facts.format or ""), report


def _budget(plan: DownloadPlan, args: argparse.Namespace) -> BudgetReport:
    from localinfer.backend_budget import compute_budget
    from localinfer.budget import BudgetRequest
    from localinfer.counts import parse_count

    request = BudgetRequest(
        model=plan.name,
        ctx=parse_count(args.ctx, "--ctx") if args.ctx is not None else None,
        concurrency=parse_count(args.concurrency, "--concurrency"),
        quant="none" if plan.quant == "bf16" else plan.quant,
        device=args.device,
        backend=args.backend,
    )
    return compute_budget(request)


def _bundled_package(spec: str) -> str | None:
    from localinfer.catalog import BundledSource
    from localinfer.hub import catalog_entry_for

    entry = catalog_entry_for(spec)
    if entry is not None and isinstance(entry.source, BundledSource):
        return entry.source.package
    return None


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _plan_or_explain(model: str, quant: str | None) -> DownloadPlan:
    """What to download for MODEL; a path on disk is said to be one (the generic 'unknown
    model: not a catalog name, local file or cached repo' contradicted a file that is there)."""
    from pathlib import Path

    from localinfer.errors import InvalidParameterError, UnknownModelError
    from localinfer.hub import plan_download

    try:
        return plan_download(model, quant)
    except UnknownModelError:
        if not Path(model).expanduser().exists():
            raise
        raise InvalidParameterError(
            f"{model} is on disk: pull downloads catalog models and Hub repos (ORG/REPO[:QUANT]); "
            "a local model needs no download"
        ) from None
