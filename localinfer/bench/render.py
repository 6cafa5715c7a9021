"""The benchmark's results as a rich table."""

from __future__ import annotations

from rich.table import Table

from localinfer.bench.records import BenchReport, LevelResult
from localinfer.bench.stats import Summary


def _ms(s: Summary) -> str:
    if s.count == 0:
        return "-"
    return f"{s.p50 * 1e3:.0f} / {s.p95 * 1e3:.0f} / {s.p99 * 1e3:.0f}"


def _sec(s: Summary) -> str:
    if s.count == 0:
        return "-"
    return f"{s.mean:.2f} | {s.p50:.2f} / {s.p95:.2f} / {s.p99:.2f}"


def level_row(lv: LevelResult) -> list[str]:
    return [
        str(lv.concurrency),
        f"{len(lv.ok)}",
        f"[red]{lv.errors}[/]" if lv.errors else "0",
        f"{lv.output_tps:.1f}",
        f"{lv.requests_per_s:.2f}",
        _ms(lv.ttft),
        _ms(lv.tpot),
        _sec(lv.e2e),
    ]


def bench_table(report: BenchReport) -> Table:
    table = Table(
        title=f"bench: {report.target}, model {report.model}, up to {report.max_tokens} tokens",
        title_justify="left",
    )
    for header in ("conc", "ok", "err", "out tok/s", "req/s"):
        table.add_column(header, justify="right")
    table.add_column("TTFT ms p50/p95/p99", justify="right")
    table.add_column("TPOT ms p50/p95/p99", justify="right")
    table.add_column("latency s mean | p50/p95/p99", justify="right")
    for lv in report.levels:
        table.add_row(*level_row(lv))
    sources = sorted({s for lv in report.levels for s in lv.token_sources})
    notes = []
    if "chunks" in sources:
        notes.append("output tokens counted as streamed text chunks (the server sent no usage)")
    for lv in report.levels:
        for error in lv.first_errors(1):
            notes.append(f"errors at {lv.concurrency}: {error}")
    if notes:
        table.caption = "; ".join(notes)
        table.caption_justify = "left"
    return table
