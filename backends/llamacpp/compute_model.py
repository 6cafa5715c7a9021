"""The compute buffers of the runner's llama.cpp context, as the budget costs them.

llama.cpp sizes one compute buffer per device for its worst graph (an n_ubatch-token prefill,
n_outputs_max logits rows) and places every tensor of a forward in it: its allocator frees a
tensor after its last use and puts later ones in the space, so the buffer is the graph's peak,
not the sum of its tensors.

- A layer's peak, per token: the MLP's gate, up and activated outputs (3 x ffn), the residual,
  the normed input and the MLP input (3 x hidden), and the attention's query or one more hidden
  row, whichever is wider (Gemma's query is wider than its hidden size). Checked against the
  buffer llama.cpp reserves with one output row, for the embedded model (llama), Gemma 3 270M
  and random llama / Gemma 3 shapes from 256 to 1,024 hidden and 512 to 2,048 MLP: within 0.2%
  for both models and the wider random shapes, up to 25% over for the smallest ones (where
  the allocator leaves no hole).
- The attention masks, inputs that live until the last attention: cells x tokens, one for the
  full-attention layers and one for the sliding ones (Gemma 3); f16 under flash attention, f32
  without, which then also holds the chunk's scores (tokens x heads x cells) beside the layer,
  and the CPU converts the probabilities to f16 in its work buffer, outside the graph's.
- The logits rows come after the last layer, in memory the layers and masks freed, above one
  chunk-wide activation the allocator placed below them: the graph holds the larger of the two
  stages (llama.cpp's reservation at 33 rows of 262,144: within 0.6% for Gemma 3 270M and the
  random model). A GPU holds the reserved rows whether written or not (the runner's
  n_outputs_max, context_shape.py); on the CPU only the pages written are resident, one row per
  sequence.
- The output buffer the logits are copied to sits in host memory, cleared (so resident) for
  n_seq_max rows at least.
"""

from __future__ import annotations

from localinfer.backends.llamacpp.context_shape import (
    cells_per_sequence,
    output_rows,
    sliding_cells,
)
from localinfer.facts.arch import ArchSpec, active_ffn_width

FLOAT = 4  # activations and logits are float32
# Where the reserved logits rows are held whether written or not: a GPU, and a machine the
# budget plans for without knowing which (a size given with --device).
RESERVED_ROWS_ON = ("cuda", "metal", "planned")
ON_DEVICE = ("cuda", "metal")  # the output buffer is host memory there, not the device's


def activation_floats(arch: ArchSpec) -> int:
    """Float32 values per token at a layer's peak in llama.cpp's graph."""
    hidden, query = arch.hidden_size, arch.n_heads * arch.head_dim
    return 3 * hidden + 3 * active_ffn_width(arch) + max(hidden, query)


def mask_bytes(
    arch: ArchSpec, ctx: int, sequences: int, tokens: int, ubatch: int, fused: bool
) -> int:
    """The attention masks of a ``tokens``-token forward at the end of the context."""
    cells = [cells_per_sequence(ctx, sequences)]
    if arch.sliding_window is not None and arch.n_sliding_layers():
        cells.append(sliding_cells(ctx, sequences, arch.sliding_window, ubatch))
    return sum(cells) * tokens * (2 if fused else 4)


def compute_buffer_bytes(
    arch: ArchSpec, ctx: int, sequences: int, ubatch: int, device_kind: str, fused: bool
) -> int:
    """The compute buffer (resident on the CPU, reserved elsewhere) and the output buffer of
    one ``ubatch``-token prefill step at the end of a ``ctx``-token context."""
    tokens = min(ubatch, ctx * sequences)
    cells = cells_per_sequence(ctx, sequences)
    layer = tokens * activation_floats(arch) * FLOAT
    masks = mask_bytes(arch, ctx, sequences, tokens, ubatch, fused)
    scores = 0 if fused else tokens * arch.n_heads * cells * FLOAT
    copy = scores // 2  # the CPU's f16 copy of the probabilities, in its work buffer
    if device_kind in RESERVED_ROWS_ON:
        rows = min(tokens, output_rows(sequences, ubatch))
    else:
        rows = min(tokens, sequences)
    row = arch.vocab_size * FLOAT
    head = rows * row + tokens * max(arch.hidden_size, arch.n_heads * arch.head_dim) * FLOAT
    graph = max(layer + masks + scores, head)
    output = 0 if device_kind in ON_DEVICE else sequences * row
    return graph + copy + output


def node_compute_bytes(
    arch: ArchSpec,
    ctx: int,
    sequences: int,
    ubatch: int,
    fused: bool,
    *,
    layers: bool,
    output: bool,
    host: bool,
) -> int:
    """One device's share when the model is split by layers (llama.cpp RPC): every device
    holding layers reserves a layer's peak and the masks for its graph split; the one with the
    output layer the logits stage (rows written on a CPU: one per sequence); the host the token
    embeddings' rows and the output buffer the logits are copied to.

    A worker's split peaks lower than a whole graph: the MLP's three rows and two hidden rows a
    token (the embedded model's worker splits reserve exactly that plus the masks, 12.26 MiB at
    a 512-token ubatch); the host's split peaks as the whole graph's layers do."""
    tokens = min(ubatch, ctx * sequences)
    cells = cells_per_sequence(ctx, sequences)
    stage = copy = 0
    if layers:
        scores = 0 if fused else tokens * arch.n_heads * cells * FLOAT
        masks = mask_bytes(arch, ctx, sequences, tokens, ubatch, fused)
        floats = (
            activation_floats(arch) if host else 3 * active_ffn_width(arch) + 2 * arch.hidden_size
        )
        stage, copy = tokens * floats * FLOAT + masks + scores, scores // 2
    if output:
        row = arch.vocab_size * FLOAT
        wide = max(arch.hidden_size, arch.n_heads * arch.head_dim)
        stage = max(stage, min(tokens, sequences) * row + tokens * wide * FLOAT)
    if host:
        stage = max(stage, tokens * arch.hidden_size * FLOAT)  # the embeddings' rows
        copy += sequences * arch.vocab_size * FLOAT  # the output buffer, cleared: resident
    return stage + copy
