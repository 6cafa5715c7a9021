"""Show a NodePlan in the terminal: one row per machine (layers, weights, KV, compute, total
against its free memory), then a verdict and what the link carries per token."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from localinfer.budget.memory import human_bytes
from localinfer.budget.nodes import NodePlan

GIGABIT = 125_000_000  # bytes a second on 1 Gb/s Ethernet
LAN_ROUND_TRIP = 0.0005  # seconds: a switched LAN's typical ping


def node_table(plan: NodePlan) -> Table:
    title = (f"{plan.model} ({plan.quant}) over {len(plan.nodes)} machines, llama.cpp RPC; "
             f"{plan.ctx:,} ctx x {plan.concurrency} seq, KV {plan.kv_dtype}")  # fmt: skip
    table = Table(title=title, title_justify="left")
    for name, justify in (("node", "left"), ("layers", "left"), ("weights", "right"),
                          ("KV", "right"), ("compute", "right"), ("runtime", "right"),
                          ("total", "right"), ("free", "right"), ("", "left")):  # fmt: skip
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for node in plan.nodes:
        table.add_row(
            node.name, node.layer_text, human_bytes(node.weights_bytes),
            human_bytes(node.kv_cache_bytes), human_bytes(node.compute_bytes),
            human_bytes(node.runtime_bytes), human_bytes(node.total_bytes),
            human_bytes(node.available_bytes), "fits" if node.fits else "[red]over[/red]",
        )  # fmt: skip
    return table


def verdict(plan: NodePlan) -> str:
    over = [n.name for n in plan.nodes if not n.fits]
    head = (f"fits: {plan.n_layers} layers + output on {len(plan.nodes)} machines"
            if plan.fits else f"does not fit: {', '.join(over)} over its free memory")  # fmt: skip
    total = sum(plan.split) or 1.0
    split = ",".join(f"{s / total:.3g}" for s in plan.split)
    return f"{head} (llama.cpp: --n-gpu-layers {plan.gpu_layers} --tensor-split {split})"


def link_text(plan: NodePlan) -> str:
    """The link's cost per decoded token and per prefill chunk, with what 1 GbE makes of it."""
    seconds = plan.bytes_per_token / GIGABIT + plan.round_trips * LAN_ROUND_TRIP
    return (
        f"link per token: {human_bytes(plan.bytes_per_token)} ({_count(plan.hops, 'hop')} of the "
        f"hidden state, the logits back, the attention mask to each worker) and "
        f"{_count(plan.round_trips, 'round trip')}: about {seconds * 1000:.1f} ms a token on "
        f"1 Gb/s Ethernet beside the compute; a {plan.chunk_tokens}-token prefill chunk moves "
        f"{human_bytes(plan.bytes_per_chunk)}"
    )


def print_node_plan(plan: NodePlan, console: Console) -> None:
    console.print(node_table(plan))
    console.print(verdict(plan), highlight=False)
    console.print(link_text(plan), highlight=False)


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")
