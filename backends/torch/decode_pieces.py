"""A decode step cut at attention, over static buffers: what cuda_graphs.py captures.

A pure decode batch (every item one token) of B items runs the same kernels every step except
attention, whose key views grow by one each step and whose mask-free runs (attention.py) change
with the streams' lengths. So the step is cut into ``n_layers + 1`` pieces that hold everything
else: the embedding and layer 0 up to attention; each layer's second half with the next layer's
first half; the last layer's second half with the LM head. Attention runs between the pieces,
reading the queries a piece left in a static buffer and writing its output into the buffer the
next piece reads. Every batch size uses the first B rows of the same buffers, sized for every
slot, so a piece reads and writes the same addresses every time it runs: the condition for
replaying it from a CUDA graph. Run eagerly (``run``), the pieces are the model's forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from localinfer.backends.base import SlotWork
from localinfer.backends.ragged_batch import PackedBatch
from localinfer.backends.torch.attention import GroupTensors, grouped_attention
from localinfer.backends.torch.kv_cache import StaticKVCache
from localinfer.backends.torch.model import LlamaModel


def is_decode_batch(batch: Sequence[SlotWork], max_batch: int) -> bool:
    """Every item one token (and no image), at most ``max_batch`` of them: a step the pieces
    can run."""
    return 0 < len(batch) <= max_batch and all(len(w.tokens) == 1 and not w.images for w in batch)


@dataclass(slots=True)
class StepBuffers:
    """The static tensors the pieces read and write; a step of B items uses rows [:B]."""

    inputs: torch.Tensor  # [3, slots] long: token ids, slots, positions
    x: torch.Tensor  # [slots, hidden]: the residual stream between pieces
    q: torch.Tensor  # [slots, heads, head_dim]: a layer's queries, for attention
    attn: torch.Tensor  # [slots, heads * head_dim]: that attention's output
    logits: torch.Tensor  # [slots, vocab] float32


class DecodePieces:
    """The pieces of a decode step of ``model`` over ``cache`` (module doc)."""

    def __init__(self, model: LlamaModel, cache: StaticKVCache, slots: int) -> None:
        c, dev = model.config, model.cos.device
        dtype = cache.keys[0].dtype
        self.model, self.cache = model, cache
        self.max_batch = slots
        self.n_layers = len(cache.keys)
        self.buffers = StepBuffers(
            inputs=torch.zeros(3, slots, dtype=torch.long, device=dev),
            x=torch.zeros(slots, c.hidden_size, dtype=dtype, device=dev),
            q=torch.zeros(slots, c.n_heads, c.head_dim, dtype=dtype, device=dev),
            attn=torch.zeros(slots, c.n_heads * c.head_dim, dtype=dtype, device=dev),
            logits=torch.zeros(slots, c.vocab_size, dtype=torch.float32, device=dev),
        )

    def load(self, packed: PackedBatch) -> int:
        """Copy a decode batch's token ids, slots and positions in; returns its size B."""
        b = len(packed.tokens)
        if not 0 < b <= self.max_batch or len(packed.groups) != 1:
            raise ValueError(f"not a decode batch of 1 to {self.max_batch} items")
        host = torch.tensor((packed.tokens, packed.slots, packed.positions), dtype=torch.long)
        self.buffers.inputs[:, :b].copy_(host)
        return b

    def logits(self, b: int) -> torch.Tensor:
        """The last step's logits [B, vocab] float32 in packed order: a view of the buffer,
        valid until the next step."""
        return self.buffers.logits[:b]

    def run(self, b: int, groups: list[GroupTensors]) -> torch.Tensor:
        """The loaded step, every piece and attention eagerly; returns ``logits(b)``."""
        self.piece(b, 0)
        for i in range(self.n_layers):
            self.attend(b, i, groups)
            self.piece(b, i + 1)
        return self.logits(b)

    def piece(self, b: int, j: int) -> None:
        """Piece ``j`` (0 to n_layers) of a step of ``b`` items."""
        model, buf = self.model, self.buffers
        tokens, slots, positions = buf.inputs[0, :b], buf.inputs[1, :b], buf.inputs[2, :b]
        if j == 0:
            x = model.weights.embed_rows(tokens)
        else:
            x = model.layer_output(j - 1, buf.x[:b], buf.attn[:b])
        if j == self.n_layers:
            buf.logits[:b].copy_(model.logits(x))
            return
        buf.x[:b].copy_(x)
        rope = model.rope_rows(positions)
        buf.q[:b].copy_(model.attention_inputs(j, x, rope, slots, positions, self.cache))

    def attend(self, b: int, i: int, groups: list[GroupTensors]) -> None:
        """Layer ``i``'s attention, between the pieces of its two halves."""
        cache, buf = self.cache, self.buffers
        sliding = self.model.weights.layers[i].sliding
        out = grouped_attention(buf.q[:b], cache.keys[i], cache.values[i], groups, sliding)
        buf.attn[:b].copy_(out)
