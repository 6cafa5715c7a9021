"""The tensors the torch model runs on (ModelWeights), whatever form each matrix is held in.

Projections that read the same input are fused (q|k|v, gate|up) so a decode step issues one matrix
product per input instead of three or two: fewer kernel launches and Python calls per layer.
A matrix is dense (the compute dtype; oneDNN-packed where that is faster, see onednn.py),
quantized (QuantLinear: int8 / int4, quant_layout.py) or a GGUF block matrix (BlockMatrix,
block_weights.py: the native kernels multiply by it). weight_loading.load_weights makes them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from localinfer.backends.torch.block_weights import BlockMatrix
from localinfer.backends.torch.onednn import (  # re-exported: calibrate.py imports them here
    linear_onednn,
    onednn_available,
    pack_onednn,
)
from localinfer.backends.torch.quant_linear import QuantLinear

__all__ = [
    "BlockDequant",
    "LayerWeights",
    "Matrix",
    "ModelWeights",
    "linear_onednn",
    "onednn_available",
    "pack_onednn",
]


def linear_dense(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, in], w [out, in] -> [T, out]."""
    return F.linear(x, w, b)


def linear_quant(x: torch.Tensor, w: QuantLinear, b: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, in], w a quantized matrix (quant_kernels.py) -> [T, out]."""
    return w(x, b)


@dataclass(slots=True, frozen=True)
class BlockDequant:
    """How torch ops reach block matrices (the native kernels' decoders): ``matrix(w)`` is all
    of w as float32 in a reused buffer, valid until the next call; ``rows(w, ids)`` a gather."""

    matrix: Callable[[BlockMatrix], torch.Tensor]
    rows: Callable[[BlockMatrix, torch.Tensor], torch.Tensor]


Matrix = torch.Tensor | QuantLinear | BlockMatrix


@dataclass(slots=True)
class LayerWeights:
    input_norm: torch.Tensor  # [hidden] float32
    qkv: Matrix  # [q_size + 2 * kv_size, hidden]
    qkv_bias: torch.Tensor | None  # [q_size + 2 * kv_size] (qwen2)
    q_norm: torch.Tensor | None  # [head_dim] float32 (qwen3)
    k_norm: torch.Tensor | None  # [head_dim] float32 (qwen3)
    o: Matrix  # [hidden, q_size]
    post_norm: torch.Tensor  # [hidden] float32
    gate_up: Matrix  # [2 * ffn, hidden]
    down: Matrix  # [hidden, ffn]
    sliding: bool  # this layer uses the sliding-window mask


@dataclass(slots=True)
class ModelWeights:
    """Matrices are [out, in] (Hugging Face layout), dense, oneDNN-packed (``packed``),
    quantized (``quantized``: QuantLinear objects, the embedding table included) or some of them
    GGUF blocks (BlockMatrix, native kernels only: ``has_blocks``); use ``linear`` and
    ``lm_linear`` to multiply by the others whichever they are."""

    embed: Matrix  # [vocab, hidden]; rows are gathered with embed[ids] (blocks: the kernels)
    layers: list[LayerWeights]
    norm: torch.Tensor  # [hidden] float32
    lm_head: Matrix  # [vocab, hidden]; the embed itself when tied and dense (or blocks)
    packed: bool = False
    quantized: bool = False
    # Dense matrices multiplied with oneDNN all the same (it takes the plain layout too): faster
    # than F.linear for the prefill chunks that run torch ops beside the native kernels.
    onednn_dense: bool = False
    # With block matrices: their decoders, set by the runner once the native kernels are loaded,
    # so a long prefill chunk can run on torch ops (each block matrix dequantized as it is used).
    dequant: BlockDequant | None = None

    @property
    def linear(self):  # -> Callable[[Tensor, Tensor, Tensor | None], Tensor]
        if self.quantized:
            return linear_quant
        plain = linear_onednn if self.packed or self.onednn_dense else linear_dense
        if self.dequant is None:
            return plain
        dequantize = self.dequant.matrix

        def linear_any(x: torch.Tensor, w: Matrix, b: torch.Tensor | None = None) -> torch.Tensor:
            return plain(x, dequantize(w) if isinstance(w, BlockMatrix) else w, b)

        return linear_any

    @property
    def lm_linear(self):  # -> Callable[[Tensor, Tensor, Tensor | None], Tensor]
        if isinstance(self.lm_head, QuantLinear):
            return linear_quant
        if isinstance(self.lm_head, BlockMatrix):
            return self.linear
        return linear_onednn if self.lm_head.is_mkldnn or self.onednn_dense else linear_dense

    def embed_rows(self, tokens: torch.Tensor) -> torch.Tensor:
        """[T] ids -> [T, hidden]: the embedding lookup, whatever the table is stored as."""
        if isinstance(self.embed, BlockMatrix):
            if self.dequant is None:
                raise RuntimeError("a block embedding table needs the native kernels' decoder")
            return self.dequant.rows(self.embed, tokens)
        return self.embed[tokens]

    def has_blocks(self) -> bool:
        return any(isinstance(t, BlockMatrix) for t in self.tensors())

    def block_types(self) -> dict[str, int]:
        """GGUF type -> bytes of the matrices kept as blocks of that type."""
        out: dict[str, int] = {}
        for t in {id(t): t for t in self.tensors() if isinstance(t, BlockMatrix)}.values():
            out[t.qtype] = out.get(t.qtype, 0) + t.nbytes()
        return out

    def tensors(self) -> list[Matrix]:
        out = [self.embed, self.norm, self.lm_head]
        for layer in self.layers:
            out += [
                t
                for t in (
                    layer.input_norm,
                    layer.qkv,
                    layer.qkv_bias,
                    layer.q_norm,
                    layer.k_norm,
                    layer.o,
                    layer.post_norm,
                    layer.gate_up,
                    layer.down,
                )
                if t is not None
            ]
        return out

    def nbytes(self) -> int:
        """Bytes held, counting shared storage (tied dense embeddings) once. oneDNN-packed
        tensors are opaque: counted as elements x element size (the blocked layout pads at most
        a block per row, well under 1% for these shapes)."""
        seen: dict[int, int] = {}
        for t in self.tensors():
            if isinstance(t, (QuantLinear, BlockMatrix)):
                seen[id(t)] = t.nbytes()
            elif t.is_mkldnn:
                seen[id(t)] = t.numel() * t.element_size()
            else:
                storage = t.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
        return sum(seen.values())

    def lm_head_shares_embed(self) -> bool:
        if not isinstance(self.lm_head, torch.Tensor) or not isinstance(self.embed, torch.Tensor):
            return self.lm_head is self.embed
        return not self.lm_head.is_mkldnn and (
            self.lm_head.untyped_storage().data_ptr() == self.embed.untyped_storage().data_ptr()
        )
