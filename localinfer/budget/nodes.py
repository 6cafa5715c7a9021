"""A model split across machines by llama.cpp's RPC backend: which layers each node holds, its
weights, KV cache and compute, whether each fits, and what the link carries per token.

llama.cpp places layers by index (llama-model.cpp ``load_tensors``): with ``n_gpu_layers = g``
the first ``n + 1 - g`` repeating layers stay on the machine that runs the model (with the token
embeddings, which never leave it), and the rest, the output layer counted as layer ``n``, go to
the offload devices (here the workers) in the cumulative proportions of ``tensor_split``: layer
``i`` to the first device whose running share exceeds ``(i - start) / g``. The plan picks the
local share and the split so that every node's share of the ``n + 1`` layers is proportional to
its free memory (as llama.cpp splits GPUs), or to ``--tensor-split``, and then places the layers
exactly as that rule will.

Per node: weights are its layers' tensors from the GGUF header (offload.layer_bytes), the
embeddings on the first node, the output layer (and a tied model's copy of the embedding table)
on its holder; KV is its layers' cells; compute is the backend profile's share for a node with
layers, the output, or the host's buffers (compute_model.node_compute_bytes); the runtime is the
backend's constant on the first node and WORKER_RUNTIME on a worker.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel

from localinfer.budget.model_facts import ModelFacts
from localinfer.budget.offload import layer_bytes
from localinfer.errors import InvalidParameterError
from localinfer.facts.arch import ArchSpec
from localinfer.facts.kv_dtype import KVDtype

FLOAT = 4  # activations and logits cross the link as float32
# A worker process's own growth beyond the buffers its client allocates: the deserialized
# graph and its ggml context, the CPU backend's work buffer. Measured on the embedded model
# split over three: 3.4 and 5.1 MiB beyond the buffers llama.cpp logged (tests/test_rpc_split.py
# checks each worker's total against its RSS growth).
WORKER_RUNTIME = 4 * 2**20


class NodeProfile(Protocol):
    """What the plan needs of the llama.cpp backend's profile."""

    def kv_cells(self, ctx: int, sequences: int, window: int | None) -> int: ...

    def node_compute_bytes(
        self, arch: ArchSpec, ctx: int, sequences: int, cache: KVDtype | None, *,
        layers: bool, output: bool, host: bool,
    ) -> int: ...  # fmt: skip

    def runtime(self, device_kind: str, vocab_size: int, kept_blocks: bool = False) -> int: ...


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str  # "this machine", a worker's HOST:PORT, or "node N" for --nodes
    available: int  # bytes it may fill


class NodeShare(BaseModel):
    name: str
    first_layer: int  # of the repeating layers it holds (meaningless when it holds none)
    layers: int
    output: bool  # the output norm and LM head (llama.cpp's layer n)
    weights_bytes: int
    kv_cache_bytes: int
    compute_bytes: int
    runtime_bytes: int
    total_bytes: int
    available_bytes: int
    fits: bool

    @property
    def layer_text(self) -> str:
        if not self.layers:
            return "output" if self.output else "-"
        last = self.first_layer + self.layers - 1
        span = f"{self.first_layer}" if last == self.first_layer else f"{self.first_layer}-{last}"
        return span + (" + output" if self.output else "")


class NodePlan(BaseModel):
    model: str
    quant: str
    kv_dtype: str
    ctx: int
    concurrency: int
    n_layers: int
    gpu_layers: int  # llama.cpp's n_gpu_layers: the layers (output included) on the workers
    split: list[float]  # tensor_split: the workers' shares of those
    nodes: list[NodeShare]
    fits: bool
    hops: int  # times a token's hidden state crosses between machines
    round_trips: int  # waits on a worker per forward pass
    bytes_per_token: int  # over the link per decoded token (one sequence, context full)
    bytes_per_chunk: int  # over the link per prefill chunk of `chunk_tokens`
    chunk_tokens: int


def place_layers(n_layers: int, shares: list[float]) -> tuple[int, list[float], list[int]]:
    """(n_gpu_layers, tensor_split, the node of each of the n + 1 layers) for nodes sharing the
    layers as ``shares`` (node 0 runs the model; the others are the workers, in order)."""
    if len(shares) < 2 or any(s < 0 for s in shares) or sum(shares[1:]) <= 0:
        raise InvalidParameterError(
            "a split needs this machine and at least one worker with a share"
        )
    units = n_layers + 1
    local = min(n_layers, max(0, round(units * shares[0] / sum(shares))))
    gpu_layers = units - local
    split = [float(s) for s in shares[1:]]
    total = sum(split)
    running, cumulative = 0.0, []
    for share in split:
        running += share
        cumulative.append(running / total)
    owners = [0] * local
    for layer in range(local, units):  # llama.cpp: upper_bound over the cumulative splits
        device = bisect.bisect_right(cumulative, (layer - local) / gpu_layers)
        owners.append(1 + min(device, len(split) - 1))
    return gpu_layers, split, owners


def plan_nodes(
    facts: ModelFacts,
    profile: NodeProfile,
    weights: int,
    ctx: int,
    sequences: int,
    kv: KVDtype,
    nodes: list[NodeSpec],
    shares: list[float] | None = None,
) -> NodePlan:
    """Where each layer goes and what each node holds (``weights``: the budget's weight bytes
    without a vision projector; ``shares``: --tensor-split, one per node; None: by memory)."""
    if shares is not None and len(shares) != len(nodes):
        raise InvalidParameterError(
            f"--tensor-split has {len(shares)} shares for {len(nodes)} nodes (this machine first)"
        )
    arch = facts.arch
    n = arch.n_layers
    gpu_layers, split, owners = place_layers(n, shares or [float(x.available) for x in nodes])
    parts = layer_bytes(facts, weights)
    kv_layers = _layer_kv(arch, ctx, sequences, kv, profile)
    shares_out = []
    for index, node in enumerate(nodes):
        held = [layer for layer in range(n) if owners[layer] == index]
        output = owners[n] == index
        weight = sum(parts.layers[i] for i in held)
        weight += (parts.head + parts.head_copy if output else 0) + (
            parts.embedding if index == 0 else 0
        )
        kv_bytes = sum(kv_layers[i] for i in held)
        compute = profile.node_compute_bytes(arch, ctx, sequences, kv, layers=bool(held),
                                             output=output, host=index == 0)  # fmt: skip
        runtime = profile.runtime("cpu", arch.vocab_size) if index == 0 else WORKER_RUNTIME
        total = weight + kv_bytes + compute + runtime
        shares_out.append(NodeShare(
            name=node.name, first_layer=held[0] if held else 0, layers=len(held), output=output,
            weights_bytes=weight, kv_cache_bytes=kv_bytes, compute_bytes=compute,
            runtime_bytes=runtime, total_bytes=total, available_bytes=node.available,
            fits=total <= node.available,
        ))  # fmt: skip
    link = _link(arch, ctx, sequences, owners, profile)
    return NodePlan(
        model=facts.name, quant=facts.native_quant, kv_dtype=kv.name, ctx=ctx,
        concurrency=sequences, n_layers=n, gpu_layers=gpu_layers, split=split, nodes=shares_out,
        fits=all(s.fits for s in shares_out), **link,
    )  # fmt: skip


def _layer_kv(
    arch: ArchSpec, ctx: int, sequences: int, kv: KVDtype, profile: NodeProfile
) -> list[int]:
    """Each layer's KV bytes, as budget.planner.kv_cache_bytes counts the whole."""
    out = []
    for layer in range(arch.n_layers):
        window = arch.sliding_window if arch.is_sliding(layer) else None
        cells = profile.kv_cells(ctx, sequences, window)
        if arch.is_mla:
            assert arch.kv_lora_rank is not None and arch.qk_rope_head_dim is not None
            row = kv.row_bytes(arch.kv_lora_rank + arch.qk_rope_head_dim)
        else:
            row = 2 * kv.row_bytes(arch.n_kv_heads * arch.head_dim)
        out.append(row * cells * sequences)
    return out


CHUNK_TOKENS = 512  # the runner's prefill ubatch


def _link(
    arch: ArchSpec, ctx: int, sequences: int, owners: list[int], profile: NodeProfile
) -> dict[str, int]:
    """What crosses the network per forward pass. Each change of node along the layers carries
    the hidden state (float32, a row per token); the output layer's node sends the logits back
    (a row of the vocabulary per sequence asking); each worker gets the attention mask (a row
    of cells per token, f16 under flash attention) and the host waits on each worker segment
    once (ggml's scheduler reads a segment's result before the next one runs)."""
    path = [0, *owners]  # the embeddings run on node 0
    hops = sum(1 for a, b in zip(path, path[1:], strict=False) if a != b)
    segments = sum(1 for i, node in enumerate(path) if node != 0 and path[i - 1] != node)
    workers = len({node for node in owners if node != 0})
    cells = profile.kv_cells(ctx, sequences, None)
    mask_row = cells * 2  # f16 under flash attention (without it f32: twice this)
    logits = arch.vocab_size * FLOAT if owners[-1] != 0 else 0
    hidden = arch.hidden_size * FLOAT
    per_token = hops * hidden + logits + workers * mask_row
    chunk = min(CHUNK_TOKENS, ctx * sequences)
    per_chunk = chunk * (hops * hidden + workers * mask_row) + logits * min(chunk, sequences)
    return {"hops": hops, "round_trips": segments, "bytes_per_token": per_token,
            "bytes_per_chunk": per_chunk, "chunk_tokens": chunk}  # fmt: skip
