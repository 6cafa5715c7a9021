"""How each weight form holds a matrix: one small class per form, asked by load_weights.

* DenseForm: the compute dtype, on the device; packed once for oneDNN (``pack``, see onednn.py)
  or, for the native kernels, float32 on a huge-page arena (huge_pages.py).
* BlockForm: matrices the GGUF file stores as Q8_0, Q4_0 or Q4_1 kept as their blocks
  (block_weights.py: ~5.6x fewer bytes per decode step, same results; only the native kernels
  multiply by them); the others float32, as DenseForm holds them.
* QuantizedForm: int8 / int4 in this runner's own layout (quant_layout.py), each matrix from
  the quant cache or quantized from the file (weight_quantizer.py).
* KQuantForm (kquant_form.py): a K-quant GGUF's matrices converted from the stored bytes.

A matrix's ``fetch`` is lazy: a quantizer with a cache hit never reads (or dequantizes) the source,
nor does a matrix kept as blocks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from localinfer.backends.torch.block_weights import BlockSource, block_matrix
from localinfer.backends.torch.huge_pages import ALIGN, HugePageArena
from localinfer.backends.torch.onednn import pack_onednn
from localinfer.backends.torch.quant_kernels import KernelChooser
from localinfer.backends.torch.weight_quantizer import WeightQuantizer
from localinfer.backends.torch.weights import Matrix
from localinfer.errors import ModelFileError
from localinfer.loading.model_config import ModelConfig

Fetch = Callable[[], np.ndarray]


@dataclass(frozen=True, slots=True)
class StoredMatrix:
    """A matrix of the checkpoint: the row concatenation of the stored tensors ``parts``."""

    name: str  # in messages and as the quant cache's key
    shape: tuple[int, int]  # [out, in]
    parts: tuple[str, ...]
    fetch: Fetch  # reads it as float32 [out, in] (lazily: see the module docstring)


class TensorCopier:
    """Copies source arrays into tensors of the compute dtype on the device; 2-D float32 ones
    into ``arena`` when there is one."""

    def __init__(
        self, dtype: torch.dtype, device: torch.device, arena: HugePageArena | None = None
    ) -> None:
        self.dtype = dtype
        self.device = device
        self.arena = arena

    def put(
        self,
        array: np.ndarray,
        shape: tuple[int, ...],
        name: str,
        as_dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        as_dtype = as_dtype or self.dtype
        if tuple(array.shape) != shape:
            raise ModelFileError(name, f"shape {tuple(array.shape)}, expected {shape}")
        if self.arena is not None and len(shape) == 2 and as_dtype == torch.float32:
            out = self.arena.empty(shape, torch.float32)
            np.copyto(out.numpy(), array, casting="same_kind")
            return out
        # torch.tensor copies: the runner never aliases (and so never pins) the source's arrays.
        return torch.tensor(np.ascontiguousarray(array), dtype=as_dtype, device=self.device)


class WeightForm:
    """One form of weights. ``tensors`` copies what every form keeps plain (norms, biases);
    the flags say how ModelWeights multiplies by the matrices."""

    packed = False
    quantized = False
    onednn_dense = False
    chooser: KernelChooser | None = None  # builds the quantized kernels, where the form has any

    def __init__(self, tensors: TensorCopier) -> None:
        self.tensors = tensors

    def matrix(self, m: StoredMatrix) -> Matrix:
        raise NotImplementedError

    def table(self, m: StoredMatrix) -> Matrix:
        """The embedding table (its rows are gathered)."""
        raise NotImplementedError

    def tied_head(self, table: Matrix) -> Matrix:
        """The LM head when it is the embedding table."""
        return table

    def finish(self) -> None:
        """Called once every matrix is made."""


class DenseForm(WeightForm):
    def __init__(self, tensors: TensorCopier, pack: bool, onednn_dense: bool) -> None:
        super().__init__(tensors)
        self.packed = pack
        # Dense matrices multiplied with oneDNN all the same (it takes the plain layout too).
        self.onednn_dense = onednn_dense

    def matrix(self, m: StoredMatrix) -> Matrix:
        dense = self.tensors.put(m.fetch(), m.shape, m.name)
        return pack_onednn(dense) if self.packed else dense

    def table(self, m: StoredMatrix) -> Matrix:
        return self.tensors.put(m.fetch(), m.shape, m.name)

    def tied_head(self, table: Matrix) -> Matrix:
        # Tied and packed: the LM head is a packed copy beside the dense table the embedding
        # gathers from (more memory, reported by memory(); the faster LM head is worth it).
        return pack_onednn(table) if self.packed else table


class BlockForm(WeightForm):
    def __init__(
        self,
        blocks: BlockSource,
        arena: HugePageArena | None,
    ) -> None:
        """Long chunks multiply each block matrix, dequantized into one reused buffer, with
        F.linear (below)."""
        # Matrices not kept as blocks stay float32 on the CPU, off the arena.
        super().__init__(TensorCopier(torch.float32, torch.device("cpu")))
        self.blocks = blocks
        self.arena = arena
        # F.linear (MKL) rather than oneDNN on a freshly dequantized plain matrix: measured
        # (scripts/bench-native-kernels --only-prefill, embedded model, 1 thread, CPU time) a
        # 512-token prefill 0.97x torch ops on the float32 weights through oneDNN, 1.00x through
        # F.linear (64 tokens 0.95x vs 0.98x, 256: 0.96x vs 0.99x). The non-block matrices of
        # such a model are few and multiply as fast either way at these sizes.
        self.onednn_dense = False

    def matrix(self, m: StoredMatrix) -> Matrix:
        kept = block_matrix(self.blocks, m.parts, m.shape, m.name, self._alloc)
        return kept if kept is not None else self.tensors.put(m.fetch(), m.shape, m.name)

    def table(self, m: StoredMatrix) -> Matrix:
        # Its block messages name the stored tensor itself.
        kept = block_matrix(self.blocks, m.parts, m.shape, m.parts[0], self._alloc)
        return kept if kept is not None else self.tensors.put(m.fetch(), m.shape, m.name)

    def _alloc(self, shape: tuple[int, int]) -> torch.Tensor:
        if self.arena is not None:
            try:
                return self.arena.empty(shape, torch.uint8)
            except MemoryError:  # not expected; the heap serves as well, a little slower
                pass
        return torch.empty(shape, dtype=torch.uint8)


class QuantizedForm(WeightForm):
    quantized = True

    def __init__(self, tensors: TensorCopier, quantizer: WeightQuantizer) -> None:
        super().__init__(tensors)
        self.quantizer = quantizer
        self.chooser = quantizer.chooser

    def matrix(self, m: StoredMatrix) -> Matrix:
        return self.quantizer.matrix(m.name, m.shape, m.fetch)

    def table(self, m: StoredMatrix) -> Matrix:
        # One quantized table serves the row gather and, when tied, the LM head.
        return self.quantizer.table(m.name, m.shape, m.fetch)

    def finish(self) -> None:
        self.quantizer.finish()


def dense_form(
    config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    *,
    pack: bool,
    huge_pages: bool,
    onednn_dense: bool,
) -> DenseForm:
    """``huge_pages``: float32 CPU matrices (not packed) go to an arena where the platform
    allows."""
    arena = None
    if huge_pages and device.type == "cpu" and dtype == torch.float32 and not pack:
        arena = HugePageArena.create(HugePageArena.padded_bytes(dense_matrix_shapes(config), 4))
    return DenseForm(TensorCopier(dtype, device, arena), pack, onednn_dense)


def block_form(config: ModelConfig, blocks: BlockSource, *, huge_pages: bool) -> BlockForm:
    """``huge_pages``: the kept blocks go to an arena where the platform allows."""
    arena = None
    if huge_pages:
        # Kept blocks are at most every stored tensor's bytes (+ alignment per matrix); pages
        # of the reservation that stay unused are never touched, so never resident.
        matrices = 4 * config.n_layers + 2
        arena = HugePageArena.create(blocks.nbytes() + matrices * ALIGN)
    return BlockForm(blocks, arena)


def quantized_form(
    quantizer: WeightQuantizer, dtype: torch.dtype, device: torch.device
) -> QuantizedForm:
    return QuantizedForm(TensorCopier(dtype, device), quantizer)


def dense_matrix_shapes(config: ModelConfig) -> list[tuple[int, int]]:
    """Every 2-D tensor load_weights makes for a dense model, in the order it makes them."""
    h, q, kv, f = config.hidden_size, config.q_size, config.kv_size, config.ffn_size
    per_layer = [(q + 2 * kv, h), (h, q), (2 * f, h), (h, f)]
    shapes = per_layer * config.n_layers + [(config.vocab_size, h)]
    if not config.tied_embeddings:
        shapes.append((config.vocab_size, h))
    return shapes
