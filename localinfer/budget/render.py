"""Show a BudgetReport in the terminal: a breakdown table, a stacked bar and a verdict."""

from __future__ import annotations

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from localinfer.budget.memory import human_bytes
from localinfer.budget.report import BudgetReport, MemoryCheck, VisionReport

BAR_WIDTH = 60
_COLORS = {
    "weights": "blue",
    "kv": "magenta",
    "overhead": "yellow",
    "kv ram": "cyan",
    "free": "green",
    "over": "red",
}


def breakdown_table(report: BudgetReport) -> Table:
    table = Table(title=_title(report), title_justify="left")
    table.add_column("part")
    table.add_column("bytes", justify="right")
    table.add_column("how")
    kv_how = f"{report.ctx:,} ctx x {report.concurrency} seq, {report.kv_dtype}"
    vision = report.vision
    encoder = vision.compute_bytes if vision is not None else 0
    rows = [
        ("weights", report.weights_bytes, _weights_how(report)),
        ("KV cache", report.kv_cache_bytes, kv_how),
        ("compute buffers", report.compute_bytes - encoder,
         f"prefill chunk {report.prefill_chunk} + logits"),
    ]  # fmt: skip
    if vision is not None:
        rows.append(("vision encoder", encoder, _vision_how(vision)))
    rows.append(("runtime", report.runtime_bytes, f"{report.backend} library and tokenizer tables"))
    if report.kv_ram_bytes:
        rows.append(("KV RAM tier", report.kv_ram_bytes, _kv_ram_how(report)))
    for name, value, how in rows:
        table.add_row(name, human_bytes(value), how)
    table.add_section()
    share = 100 * report.total_bytes / max(report.available_bytes, 1)
    table.add_row("total", human_bytes(report.total_bytes), f"{share:.0f}% of available")
    table.add_row("available", human_bytes(report.available_bytes), report.device)
    return table


def _vision_how(vision: VisionReport) -> str:
    """The encoder's graph for one image at the projector's size, and what else it holds."""
    size = vision.image_size
    how = f"{vision.projector_type} graph at {size}x{size} ({vision.patches:,} patches)"
    parts = [
        name
        for name, value in (
            ("CPU work buffer", vision.work_bytes),
            ("mtmd's tables", vision.context_bytes),
            ("one image's pixels", vision.image_bytes),
        )
        if value
    ]
    if parts:
        how += " + " + ", ".join(parts)
    return how if vision.modelled else how + "; an estimate for this projector type"


def _kv_ram_how(report: BudgetReport) -> str:
    """The tier is a cap, filled as slots are reused; on a GPU it is host RAM, not the device's."""
    if report.kv_ram_counted:
        return "a cap in this memory, for reused slots' KV (--kv-ram)"
    return "a cap in host RAM, outside the device's total (--kv-ram)"


def _title(report: BudgetReport) -> str:
    title = f"{report.model} on {report.device} ({report.backend})"
    if report.download_bytes is not None and report.model_path is None:
        title += f"; {human_bytes(report.download_bytes)} to download"
    return title


def _weights_how(report: BudgetReport) -> str:
    if report.quant in report.weights_source:
        return report.weights_source
    return f"{report.quant}: {report.weights_source}"


def stacked_bar(report: BudgetReport, width: int = BAR_WIDTH) -> Text:
    """weights | KV | overhead | free, scaled to the larger of available and needed memory."""
    scale = max(report.available_bytes, report.total_bytes, 1)
    parts = [
        ("weights", report.weights_bytes),
        ("kv", report.kv_cache_bytes),
        ("overhead", report.overhead_bytes),
    ]
    if report.kv_ram_counted:
        parts.append(("kv ram", report.kv_ram_bytes))
    free = report.available_bytes - report.total_bytes
    parts.append(("free", free) if free >= 0 else ("over", 0))
    bar = Text()
    used = 0
    for name, value in parts:
        cells = round(width * value / scale)
        cells = min(cells, width - used)
        bar.append("█" * cells, style=_COLORS[name])
        used += cells
    if free < 0:
        # Past the device's end: mark where available memory stops.
        edge = round(width * report.available_bytes / scale)
        bar = Text.assemble(bar[:edge], Text("│", style="bold red"), bar[edge:])
    legend = Text.assemble(
        ("■ weights ", _COLORS["weights"]),
        ("■ KV ", _COLORS["kv"]),
        ("■ overhead ", _COLORS["overhead"]),
        *([("■ KV RAM tier ", _COLORS["kv ram"])] if report.kv_ram_counted else []),
        ("■ free", _COLORS["free"]),
    )
    return Text.assemble(bar, "\n", legend)


def verdict(report: BudgetReport) -> Text:
    offload = report.offload_text
    if report.fits and offload is not None and report.gpu_layers != report.layers:
        host = report.host_bytes or 0
        lines = Text.assemble(
            ("fits with part on the CPU", "bold yellow"),
            f": {offload}. The GPU holds {human_bytes(report.total_bytes - host)} of its "
            f"{human_bytes(report.available_bytes)}; the host's RAM keeps {human_bytes(host)} "
            "(the embedding table, the other layers and their KV cache). Decode runs slower "
            "than wholly on the GPU.",
        )
        for s in report.suggestions:
            lines.append(
                f"\n  wholly on the GPU with {s.change}: {human_bytes(s.total_bytes)} "
                f"({s.quant}, {s.ctx:,} ctx, {s.concurrency} seq, KV {s.kv_dtype})"
            )
        return lines
    if report.fits:
        if offload is not None:
            return Text.assemble(
                ("fits", "bold green"),
                f" with {offload}: {human_bytes(report.total_bytes)} of "
                f"{human_bytes(report.available_bytes)}. Longest context at "
                f"{report.concurrency} seq: {report.max_context:,}; most sequences at "
                f"{report.ctx:,} ctx: {report.max_concurrency}.",
            )
        return Text.assemble(
            ("fits", "bold green"),
            f": {human_bytes(report.total_bytes)} of {human_bytes(report.available_bytes)}, "
            f"{human_bytes(report.free_bytes)} free. Longest context at {report.concurrency} "
            f"seq: {report.max_context:,}; most sequences at {report.ctx:,} ctx: "
            f"{report.max_concurrency}.",
        )
    lines = Text.assemble(
        ("does not fit", "bold red"),
        f": needs {human_bytes(report.total_bytes)}, {human_bytes(-report.free_bytes)} more "
        f"than the {human_bytes(report.available_bytes)} available.",
    )
    for s in report.suggestions:
        lines.append(
            f"\n  try {s.change}: {human_bytes(s.total_bytes)} "
            f"({s.quant}, {s.ctx:,} ctx, {s.concurrency} seq, KV {s.kv_dtype})"
        )
    if report.vllm is not None:
        gpus = "1 x 80 GiB GPU" if report.vllm.gpus == 1 else f"{report.vllm.gpus} x 80 GiB GPUs"
        lines.append(
            f"\n  nothing nearby fits; with vLLM, {gpus} would "
            f"({human_bytes(report.vllm.per_gpu_bytes)} each):"
        )
    elif not report.suggestions:
        lines.append("\n  nothing nearby fits, and no multi-GPU plan up to 64 GPUs either")
    return lines


def projector_note(report: BudgetReport) -> str | None:
    """Vision projectors beside the model that the weights do not count yet."""
    if report.mmproj is not None or not report.mmproj_files:
        return None
    return f"vision projector(s) not counted: {', '.join(report.mmproj_files)} (add --mmproj)"


def vision_note(report: BudgetReport) -> str | None:
    """How much of the context an image takes: its tokens are ordinary KV cells."""
    if report.vision is None:
        return None
    return f"vision: {report.vision.tokens_text} ({report.ctx:,} here), in the KV cache row"


def reranker_note(report: BudgetReport) -> str | None:
    """What a reranker's rows hold beyond a generating model's."""
    if not report.reranker:
        return None
    if report.encoder:
        return (
            "a reranker (an encoder, rank pooling): llama.cpp scores each query-document pair "
            "whole, in a second context counted in the compute rows; it keeps no KV cache"
        )
    return (
        "a reranker (rank pooling): llama.cpp scores its query-document pairs in a second "
        f"context of {report.ctx:,} cells, counted in the KV cache and compute rows"
    )


def print_report(report: BudgetReport, console: Console | None = None) -> None:
    console = console or Console()
    console.print(Group(breakdown_table(report), stacked_bar(report), verdict(report)))
    for note in (projector_note(report), vision_note(report), reranker_note(report)):
        if note is not None:
            console.print("  " + note, highlight=False, markup=False)
    if report.vllm is not None:  # unwrapped, so it pastes as one command
        console.print("  " + report.vllm.command, soft_wrap=True, highlight=False, markup=False)


def check_table(check: MemoryCheck) -> Table:
    """Predicted vs measured, part by part, from `--verify`."""
    table = Table(title=f"--verify: {check.backend} on {check.device}", title_justify="left")
    for column in ("part", "predicted", "measured", "measured / predicted"):
        table.add_column(column, justify="left" if column == "part" else "right")
    rows = [
        ("weights", check.predicted_weights, check.measured_weights),
        ("KV cache", check.predicted_kv_cache, check.measured_kv_cache),
        ("compute buffers", check.predicted_compute, check.measured_overhead),
    ]
    if check.predicted_projector is not None and check.measured_projector is not None:
        rows.append(("projector: weights + encoder", check.predicted_projector,
                     check.measured_projector))  # fmt: skip
    if check.rss_growth is not None:  # everything, library code and tokenizer included
        rows.append(("total vs process RSS growth", check.predicted_total, check.rss_growth))
    for name, predicted, measured in rows:
        ratio = f"{measured / predicted:.3f}" if predicted else "-"
        table.add_row(name, human_bytes(predicted), human_bytes(measured), ratio)
    return table
