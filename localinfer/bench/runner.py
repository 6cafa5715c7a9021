"""One benchmark run: warm up, run each concurrency level with a progress bar, report."""

from __future__ import annotations

from collections.abc import Sequence

from localinfer.bench.loadgen import run_levels
from localinfer.bench.prompts import BenchPrompt
from localinfer.bench.records import BenchReport, RequestRecord
from localinfer.bench.targets import HttpTarget, Target


async def bench_target(
    target: Target,
    prompts: Sequence[BenchPrompt],
    levels: Sequence[int],
    requests: int,
    max_tokens: int,
    *,
    warmup: int = 1,
    progress: bool = True,
) -> BenchReport:
    """Run every level against `target` and collect a BenchReport (progress on stderr)."""
    if isinstance(target, HttpTarget):
        await target.resolve_model()
    if not progress:
        results = await run_levels(target, prompts, levels, requests, max_tokens, warmup=warmup)
        return BenchReport(target.name, target.model, max_tokens, results)

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[errors]} errors"), TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        tasks = {
            c: bar.add_task(f"{c:>3} clients", total=max(requests, c), errors=0) for c in levels
        }
        errors = dict.fromkeys(levels, 0)

        def on_record(concurrency: int, record: RequestRecord) -> None:
            errors[concurrency] += 0 if record.ok else 1
            bar.update(tasks[concurrency], advance=1, errors=errors[concurrency])

        results = await run_levels(
            target, prompts, levels, requests, max_tokens, warmup=warmup, on_record=on_record
        )
    return BenchReport(target.name, target.model, max_tokens, results)
