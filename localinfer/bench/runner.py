"""One benchmark run: warm up, run each concurrency level with a progress bar, report."""

from __future__ import annotations

from localinfer.bench.loadgen import LoadPlan, run_levels
from localinfer.bench.records import BenchReport, RequestRecord
from localinfer.bench.targets import HttpTarget, Target


async def bench_target(target: Target, plan: LoadPlan, *, progress: bool = True) -> BenchReport:
    """Run every level of ``plan`` against `target` and collect a BenchReport (progress on
    stderr)."""
    if isinstance(target, HttpTarget):
        await target.resolve_model()
    if not progress:
        results = await run_levels(target, plan)
        return BenchReport(target.name, target.model, plan.max_tokens, results)

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[errors]} errors"), TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        tasks = {
            c: bar.add_task(f"{c:>3} clients", total=max(plan.requests, c), errors=0)
            for c in plan.levels
        }
        errors = dict.fromkeys(plan.levels, 0)

        def on_record(concurrency: int, record: RequestRecord) -> None:
            errors[concurrency] += 0 if record.ok else 1
            bar.update(tasks[concurrency], advance=1, errors=errors[concurrency])

        results = await run_levels(target, plan, on_record)
    return BenchReport(target.name, target.model, plan.max_tokens, results)
