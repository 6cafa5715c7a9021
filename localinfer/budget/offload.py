"""llama.cpp on a GPU: which layers the GPU holds, and what stays in the host's RAM.

llama.cpp places layers by index: with ``n_gpu_layers = n`` the last ``n`` repeating layers, their
KV cache (offload_kqv) and the compute graph's GPU buffers sit on the GPU; the token embedding
table always stays on the CPU (its rows are gathered there); the output norm and LM head join the
GPU only when every layer does (``n_gpu_layers`` above the layer count; a tied head is then
copied to the GPU beside the embedding table the CPU keeps). Everything else is host memory.

So a model too big for a card still runs, as Ollama and LM Studio run it, with as many layers as
fit on the GPU and the rest on the CPU: the budget sizes ``n`` here (the largest that fits) and
says it, never a silent swap. Per-layer bytes come from the GGUF header's tensors where known,
else from the architecture's share of the weights.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from localinfer.budget.model_facts import ModelFacts
from localinfer.budget.planner import Breakdown

_LAYER = re.compile(r"^blk\.(\d+)\.")
_OUTPUT = ("output.weight", "output_norm.weight")
_EMBEDDING = "token_embd.weight"


@dataclass(frozen=True, slots=True)
class LayerBytes:
    """A model's weights by where llama.cpp can put them."""

    layers: tuple[int, ...]  # each repeating layer's tensors, by index
    embedding: int  # token_embd: stays on the host
    head: int  # output norm, LM head and other tensors outside the layers: GPU with all layers
    head_copy: int = 0  # a tied head: the embedding table copied to the GPU (not in the file)


@dataclass(frozen=True, slots=True)
class OffloadPlan:
    """Where a llama.cpp runner's memory goes with ``gpu_layers`` of ``layers`` on the GPU."""

    gpu_layers: int
    layers: int
    gpu_bytes: int  # weights of those layers (+ the head with all), their KV, compute, runtime
    host_bytes: int  # the rest: embedding table, layers left on the CPU and their KV

    @property
    def full(self) -> bool:
        return self.gpu_layers == self.layers


def layer_bytes(facts: ModelFacts, weights: int) -> LayerBytes:
    """``weights`` (the budget's, the projector excluded) split into layers, embedding, head."""
    arch = facts.arch
    header = facts.header
    if header is not None and header.tensors:
        per_layer = [0] * arch.n_layers
        embedding = output = other = 0
        for tensor in header.tensors:
            match = _LAYER.match(tensor.name)
            if match and int(match.group(1)) < arch.n_layers:
                per_layer[int(match.group(1))] += tensor.nbytes
            elif tensor.name == _EMBEDDING:
                embedding = tensor.nbytes
            elif tensor.name in _OUTPUT:
                output += tensor.nbytes
            else:
                other += tensor.nbytes  # rope factors, MTP layers: kept with the head
        tied = "output.weight" not in {t.name for t in header.tensors}
        return LayerBytes(tuple(per_layer), embedding, output + other, embedding if tied else 0)
    # No header (a catalog estimate): the embedding table's share by parameters.
    table = arch.vocab_size * arch.hidden_size
    params = max(facts.params, 1)
    table_bytes = min(weights * table // params, weights // 3)
    head = 0 if arch.tied_embeddings else table_bytes
    layer = max(weights - table_bytes - head, 0) // arch.n_layers
    copy = table_bytes if arch.tied_embeddings else 0
    return LayerBytes((layer,) * arch.n_layers, table_bytes, head, copy)


def plan_offload(parts: Breakdown, split: LayerBytes, gpu_available: int) -> OffloadPlan:
    """The most layers whose weights and KV fit ``gpu_available`` beside the compute buffers
    and the GPU runtime (all of them when the whole model fits); 0 when not even one does."""
    count = len(split.layers)
    kv_per_layer = parts.kv / count
    fixed = parts.compute + parts.runtime
    for n in range(count, 0, -1):
        weights = sum(split.layers[count - n :]) + (split.head if n == count else 0)
        kv = round(n * kv_per_layer)
        copy = split.head_copy if n == count else 0
        on_gpu = weights + copy + kv + fixed
        if on_gpu <= gpu_available:
            return OffloadPlan(n, count, on_gpu, parts.weights - weights + parts.kv - kv)
    return OffloadPlan(0, count, 0, parts.weights + parts.kv + parts.compute)
