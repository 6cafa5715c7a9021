"""A PNG of the benchmark: latency percentiles and throughput against concurrency.

matplotlib is an optional dependency (``pip install 'localinfer[plot]'``), imported only here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from localinfer.bench.records import BenchReport
from localinfer.errors import LocalinferError


def write_plot(reports: Sequence[BenchReport], path: str | Path) -> Path:
    """Two panels: TTFT and end-to-end latency p50/p95/p99 (log scale), output tok/s and
    requests/s; one line per report, so two servers can share a figure."""
    try:
        import matplotlib
    except ImportError:
        raise LocalinferError(
            "--plot needs matplotlib: pip install 'localinfer[plot]' (or matplotlib)"
        ) from None
    matplotlib.use("Agg")  # no display needed; must precede pyplot
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, (lat, thr) = plt.subplots(1, 2, figsize=(12, 4.8), constrained_layout=True)
    rps = thr.twinx()  # requests/s on the right axis of the throughput panel
    styles = {"p50": "-", "p95": "--", "p99": ":"}
    for n, report in enumerate(reports):
        levels = [lv.concurrency for lv in report.levels]
        label = report.target if len(reports) > 1 else ""
        for metric, color in (("ttft", f"C{2 * n}"), ("e2e", f"C{2 * n + 1}")):
            for q, style in styles.items():
                ys = [getattr(getattr(lv, metric), q) for lv in report.levels]
                pts = [(x, y) for x, y in zip(levels, ys, strict=True) if y is not None]
                if pts:
                    name = "TTFT" if metric == "ttft" else "latency"
                    lat.plot(*zip(*pts, strict=True), style, marker="o", color=color,
                             label=f"{label} {name} {q}".strip())  # fmt: skip
        thr.plot(levels, [lv.output_tps for lv in report.levels], "-", marker="o",
                 color=f"C{2 * n}", label=f"{label} output tok/s".strip())  # fmt: skip
        rps.plot(levels, [lv.requests_per_s for lv in report.levels], "--", marker="s",
                 color=f"C{2 * n + 1}", label=f"{label} requests/s".strip())  # fmt: skip
    lat.set(xlabel="concurrent clients", ylabel="seconds", title="latency percentiles")
    lat.set_yscale("log")
    lat.legend(fontsize="x-small", ncol=2 if len(reports) > 1 else 1)
    thr.set(xlabel="concurrent clients", ylabel="output tokens/s", title="throughput")
    rps.set_ylabel("requests/s")
    handles = thr.get_legend_handles_labels()
    extra = rps.get_legend_handles_labels()
    thr.legend(handles[0] + extra[0], handles[1] + extra[1], fontsize="x-small", loc="best")
    all_levels = sorted({lv.concurrency for r in reports for lv in r.levels})
    for ax in (lat, thr):
        ax.set_xticks(all_levels)
        ax.grid(True, alpha=0.3)
    model = reports[0].model if reports else ""
    fig.suptitle(f"localinfer bench: {model}, up to {reports[0].max_tokens} tokens per answer")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
