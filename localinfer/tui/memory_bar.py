"""Memory: the budget's prediction and the measurement side by side, as stacked bars.

Both are the same quantity, the process's growth from loading the model, in the same parts:
weights, KV cache, and the overhead (compute buffers as written + the backend's runtime). What the
backend reserved beyond weights + KV (written or not: llama.cpp sizes its compute buffers for its
worst graph) is a line of its own, outside the bars and the total.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from localinfer.tui.memory_figures import MemoryFigures, MemoryParts

PART_STYLES = (("weights", "bold blue"), ("kv_cache", "bold magenta"), ("overhead", "bold yellow"))
BAR_WIDTH = 20


def human_bytes(n: int | None) -> str:
    if n is None:
        return "—"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit in ("B", "KiB") else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _bar(parts: MemoryParts, scale: int, width: int) -> Text:
    """One stacked bar; ``scale`` bytes span the whole width, the rest is free (dim)."""
    text = Text()
    used = 0
    for name, style in PART_STYLES:
        cells = round(getattr(parts, name) / scale * width) if scale else 0
        cells = min(cells, width - used)
        text.append("█" * cells, style=style)
        used += cells
    text.append("░" * (width - used), style="dim")
    return text


def render_memory(figures: MemoryFigures, width: int = BAR_WIDTH) -> Text:
    """Budget and measured bars on one scale (the larger total), then the machine's share.
    A model served by another process: what its server says, if anything, under its name."""
    if figures.served_by:
        return _render_served(figures)
    rows = [("budget", figures.predicted), ("measured", figures.measured)]
    scale = max((p.total for _, p in rows if p is not None), default=0)
    out = Text()
    for label, parts in rows:
        out.append(f"{label:<9}")
        if parts is None:
            out.append("unavailable\n", style="dim")
            continue
        out.append_text(_bar(parts, scale, width))
        out.append(f" {human_bytes(parts.total)}\n")
    for name, style in PART_STYLES:
        pred = getattr(figures.predicted, name) if figures.predicted else None
        meas = getattr(figures.measured, name) if figures.measured else None
        out.append("■ ", style=style)
        out.append(f"{name.replace('_', ' '):<9}{human_bytes(pred):>10} {human_bytes(meas):>10}\n")
    if figures.reserved is not None:
        out.append("□ ", style="dim")
        out.append(f"{'reserved':<9}{'':>10} {human_bytes(figures.reserved):>10}\n")
        out.append("  held by the backend, not all written\n", style="dim")
    if figures.library_preloaded:
        out.append(
            "  the backend's library loaded earlier:\n  not in the measured growth\n", style="dim"
        )
    # The machine: what the model takes out of the memory the budget says is available.
    reference = figures.measured or figures.predicted
    out.append(f"{'machine':<9}")
    if figures.available and reference is not None:
        used = min(reference.total, figures.available)
        cells = max(1, round(used / figures.available * width)) if used else 0
        out.append("█" * cells, style="bold green")
        out.append("░" * (width - cells), style="dim")
        out.append(f" {used / figures.available:.0%}\n")
        free = figures.available - used
        out.append("░ ", style="dim")
        out.append(f"{'free':<9}{human_bytes(free):>10}")
    else:
        out.append("unavailable", style="dim")
    if figures.device:
        out.append(f" on {figures.device}", style="dim")
    return out


def _render_served(figures: MemoryFigures) -> Text:
    """A model in another process: what its server lists of it (nothing is measured here)."""
    out = Text(figures.served_by or "", style="bold")
    if figures.served_budget is None:
        out.append("\nthe server publishes no memory figures", style="dim")
        return out
    out.append(f"\n{'budget':<9}{human_bytes(figures.served_budget):>10}")
    if figures.served_state:
        out.append(f" ({figures.served_state})", style="dim")
    if figures.device:
        out.append(f" on {figures.device}", style="dim")
    return out


class MemoryBar(Static):
    DEFAULT_CSS = """
    MemoryBar { height: auto; }
    """

    def __init__(self, id: str | None = None) -> None:
        super().__init__(render_memory(MemoryFigures()), id=id)
        self.figures = MemoryFigures()

    def show(self, figures: MemoryFigures) -> None:
        self.figures = figures
        self.update(render_memory(figures))
