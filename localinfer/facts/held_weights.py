"""The seam between a GGUF's tensors as stored and the bytes a runner holds for them.

The budget reads a GGUF header's tensors (no data) as :class:`StoredTensor` entries and hands them
to the planned backend's profile (``BackendProfile.held_gguf_weights``), which answers in its
runner's own form: llama.cpp holds every tensor as stored; MLX and torch convert some block types
to their own quantized layouts on load. A profile that has no rule answers None and the budget
keeps its older estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StoredTensor:
    """One tensor of a GGUF header, as stored."""

    name: str  # the GGUF name: "blk.0.attn_q.weight", "token_embd.weight", "output.weight"
    type_name: str  # ggml type: "Q4_K", "Q6_K", "Q8_0", "F32", "F16", ...
    shape: tuple[int, ...]  # numpy order, outermost first: (rows, row length) for a matrix
    nbytes: int  # bytes as stored

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True, slots=True)
class HeldWeights:
    """What a runner holds for a model's weights: bytes, and one line on the form they take."""

    bytes: int
    source: str
