"""Turn a WeightSource (Hugging Face names, float32 numpy) into the tensors the model runs on.

Projections that read the same input are fused (q|k|v, gate|up) so a decode step issues one matrix
product per input instead of three or two: fewer kernel launches and Python calls per layer.

CPU fp32 normally keeps the matrices dense: the native kernels (native_forward.py) read that
layout, and larger prefill chunks use F.linear on it. Where the kernels cannot be built, the
matrices are packed once into oneDNN's blocked layout instead (see ``onednn_available``): on the
project's 2-core x86 machine that read the weights about 2x faster than torch's default matmul
for the 4-8 row products of batched decode, and no slower for one row (measured per call,
1 thread, over the 540 MB of SmolLM2's fp32 matrices: 1 row 12.7 vs 9.9 GB/s, 8 rows 11.8 vs
5.6 GB/s, 64 rows 2.9 vs 2.0 GB/s). The native kernels stream one row at about 2x that.

With ``blocks`` (a GGUF source, CPU float32 with the native kernels) matrices stored as Q8_0, Q4_0
or Q4_1 are kept as their blocks instead (block_weights.py): ~5.6x fewer bytes per decode step,
same results. Only the native kernels can multiply by those.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch
import torch.nn.functional as F

from localinfer.backends.torch.block_weights import BlockMatrix, BlockSource, block_matrix
from localinfer.backends.torch.huge_pages import ALIGN, HugePageArena
from localinfer.backends.torch.quant_linear import QuantLinear
from localinfer.backends.torch.support import TORCH_ARCHS
from localinfer.backends.torch.weight_quantizer import WeightQuantizer
from localinfer.errors import ModelFileError, UnsupportedModelError
from localinfer.loading.model import WeightSource
from localinfer.loading.model_config import ModelConfig


def onednn_available(dtype: torch.dtype, device: torch.device) -> bool:
    """oneDNN packed matmul: CPU builds with mkldnn, float32, or bfloat16 where this CPU's
    oneDNN packs it (its fp16 path needs AVX512-FP16, which most x86 CPUs lack)."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return _onednn_packs_bf16()
    return dtype == torch.float32


@cache
def _onednn_packs_bf16() -> bool:
    """Asked of oneDNN itself: its bf16 linear packing needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT
    (an AVX2 laptop CPU has neither, and ONEDNN_MAX_CPU_ISA=AVX2 hides them). Without it bf16
    matrices stay plain and F.linear multiplies them (support.onednn_bf16_expected is the
    budget's torch-free answer to the same question)."""
    try:
        pack_onednn(torch.zeros(16, 16, dtype=torch.bfloat16))
    except RuntimeError:
        return False
    return True


def linear_dense(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, in], w [out, in] -> [T, out]."""
    return F.linear(x, w, b)


def linear_onednn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, in], w packed from [out, in] by pack_onednn -> [T, out]."""
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")


def linear_quant(x: torch.Tensor, w: QuantLinear, b: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, in], w a quantized matrix (quant_kernels.py) -> [T, out]."""
    return w(x, b)


@dataclass(slots=True, frozen=True)
class BlockDequant:
    """How torch ops reach block matrices (the native kernels' decoders): ``matrix(w)`` is all
    of w as float32 in a reused buffer, valid until the next call; ``rows(w, ids)`` a gather."""

    matrix: Callable[[BlockMatrix], torch.Tensor]
    rows: Callable[[BlockMatrix, torch.Tensor], torch.Tensor]


def pack_onednn(w: torch.Tensor) -> torch.Tensor:
    # No batch-size hint: measured as good as a hint of 8 for 1..64 rows.
    return torch.ops.mkldnn._reorder_linear_weight(w, None)


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
    # Dense matrices multiplied with oneDNN all the same (it takes the plain layout too): for
    # prefill chunks on CPU, 676 vs 586 tokens/s for F.linear on a 256-token SmolLM2 prompt
    # (packed: 712; one ad-hoc A/B while choosing, not a committed benchmark).
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


def load_weights(
    config: ModelConfig,
    source: WeightSource,
    dtype: torch.dtype,
    device: torch.device,
    pack: bool = False,
    quantizer: WeightQuantizer | None = None,
    huge_pages: bool = False,
    onednn_dense: bool = False,
    blocks: BlockSource | None = None,
) -> ModelWeights:
    """Copy the source's tensors to ``device`` in ``dtype``; with ``pack`` (CPU, see
    onednn_available) the matrices are packed for oneDNN; with ``quantizer`` every matrix and
    the embedding table are quantized (or taken from its cache without reading the source).
    ``huge_pages``: dense float32 CPU matrices go to a huge-page arena (huge_pages.py) where
    the platform allows; ``onednn_dense``: dense matrices are multiplied with oneDNN;
    ``blocks``: matrices (the embedding table included) whose parts ``blocks`` stores as Q8_0,
    Q4_0 or Q4_1 are kept as BlockMatrix (CPU float32 with the native kernels only)."""
    if config.arch not in TORCH_ARCHS:
        raise UnsupportedModelError(
            f"the torch backend runs {', '.join(TORCH_ARCHS)}; this model is {config.arch!r}"
        )
    arena = None
    dense_f32_cpu = device.type == "cpu" and dtype == torch.float32 and not pack
    if huge_pages and dense_f32_cpu and quantizer is None and blocks is None:
        arena = HugePageArena.create(HugePageArena.padded_bytes(dense_matrix_shapes(config), 4))
    block_arena = None
    if huge_pages and dense_f32_cpu and quantizer is None and blocks is not None:
        # Kept blocks are at most every stored tensor's bytes (+ alignment per matrix); pages
        # of the reservation that stay unused are never touched, so never resident.
        matrices = 4 * config.n_layers + 2
        block_arena = HugePageArena.create(blocks.nbytes() + matrices * ALIGN)

    def block_alloc(shape: tuple[int, int]) -> torch.Tensor:
        if block_arena is not None:
            try:
                return block_arena.empty(shape, torch.uint8)
            except MemoryError:  # not expected; the heap serves as well, a little slower
                pass
        return torch.empty(shape, dtype=torch.uint8)

    def kept_blocks(parts: tuple[str, ...], shape: tuple[int, int], name: str):
        assert blocks is not None
        return block_matrix(blocks, parts, shape, name, block_alloc)

    def get(name: str) -> np.ndarray:
        try:
            return source.get(name)
        except KeyError:
            raise ModelFileError(name, "tensor missing from the model file") from None

    def put(
        array: np.ndarray, shape: tuple[int, ...], name: str, as_dtype: torch.dtype = dtype
    ) -> torch.Tensor:
        if tuple(array.shape) != shape:
            raise ModelFileError(name, f"shape {tuple(array.shape)}, expected {shape}")
        if arena is not None and len(shape) == 2 and as_dtype == torch.float32:
            out = arena.empty(shape, torch.float32)
            np.copyto(out.numpy(), array, casting="same_kind")
            return out
        # torch.tensor copies: the runner never aliases (and so never pins) the source's arrays.
        return torch.tensor(np.ascontiguousarray(array), dtype=as_dtype, device=device)

    def matrix(
        fetch: Callable[[], np.ndarray],
        shape: tuple[int, int],
        name: str,
        parts: tuple[str, ...] = (),
    ) -> Matrix:
        # fetch is lazy: a quantizer with a cache hit never reads (or dequantizes) the source,
        # nor does a matrix kept as blocks.
        if blocks is not None and parts:
            kept = kept_blocks(parts, shape, name)
            if kept is not None:
                return kept
        if quantizer is not None:
            return quantizer.matrix(name, shape, fetch)
        dense = put(fetch(), shape, name)
        return pack_onednn(dense) if pack else dense

    def norm(name: str, size: int) -> torch.Tensor:
        # Norm weights stay float32 whatever the compute dtype: RMSNorm runs in float32.
        return put(get(name), (size,), name, torch.float32)

    h, q, kv, f = config.hidden_size, config.q_size, config.kv_size, config.ffn_size
    sliding = set(config.sliding_layers) if config.sliding_window else set()
    layers = []
    for i in range(config.n_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."

        def qkv(a: str = a) -> np.ndarray:
            return np.concatenate([get(a + f"{n}_proj.weight") for n in "qkv"])

        def gate_up(p: str = p) -> np.ndarray:
            return np.concatenate([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")])

        bias = None
        if config.attention_bias:
            parts = [get(a + f"{n}_proj.bias") for n in "qkv"]
            bias = put(np.concatenate(parts), (q + 2 * kv,), a + "qkv bias")
        layers.append(
            LayerWeights(
                input_norm=norm(p + "input_layernorm.weight", h),
                qkv=matrix(
                    qkv, (q + 2 * kv, h), a + "qkv", tuple(a + f"{n}_proj.weight" for n in "qkv")
                ),
                qkv_bias=bias,
                q_norm=norm(a + "q_norm.weight", config.head_dim) if config.qk_norm else None,
                k_norm=norm(a + "k_norm.weight", config.head_dim) if config.qk_norm else None,
                o=matrix(
                    lambda a=a: get(a + "o_proj.weight"),
                    (h, q),
                    a + "o_proj",
                    (a + "o_proj.weight",),
                ),  # fmt: skip
                post_norm=norm(p + "post_attention_layernorm.weight", h),
                gate_up=matrix(
                    gate_up,
                    (2 * f, h),
                    p + "mlp.gate_up",
                    (p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                ),  # fmt: skip
                down=matrix(
                    lambda p=p: get(p + "mlp.down_proj.weight"),
                    (h, f),
                    p + "mlp.down_proj",
                    (p + "mlp.down_proj.weight",),
                ),  # fmt: skip
                sliding=i in sliding,
            )
        )
    vocab = config.vocab_size
    if quantizer is not None:
        # One quantized table serves the row gather and, when tied, the LM head.
        embed = quantizer.table(
            "model.embed_tokens", (vocab, h), lambda: get("model.embed_tokens.weight")
        )
        if config.tied_embeddings:
            lm_head = embed
        else:
            lm_head = matrix(lambda: get("lm_head.weight"), (vocab, h), "lm_head")
        quantizer.finish()
        return ModelWeights(
            embed=embed,
            layers=layers,
            norm=norm("model.norm.weight", h),
            lm_head=lm_head,
            quantized=True,
        )
    embed_name = "model.embed_tokens.weight"
    embed = kept_blocks((embed_name,), (vocab, h), embed_name) if blocks is not None else None
    if embed is None:
        embed = put(get(embed_name), (vocab, h), "model.embed_tokens")
    if config.tied_embeddings:
        # Tied and packed: the LM head is a packed copy beside the dense table the embedding
        # gathers from (more memory, reported by memory(); the faster LM head is worth it).
        lm_head = pack_onednn(embed) if pack else embed
    else:
        lm_head = matrix(lambda: get("lm_head.weight"), (vocab, h), "lm_head", ("lm_head.weight",))
    return ModelWeights(
        embed=embed,
        layers=layers,
        norm=norm("model.norm.weight", h),
        lm_head=lm_head,
        packed=pack,
        onednn_dense=onednn_dense,
    )


def dense_matrix_shapes(config: ModelConfig) -> list[tuple[int, int]]:
    """Every 2-D tensor load_weights makes for a dense model, in the order it makes them."""
    h, q, kv, f = config.hidden_size, config.q_size, config.kv_size, config.ffn_size
    per_layer = [(q + 2 * kv, h), (h, q), (2 * f, h), (h, f)]
    shapes = per_layer * config.n_layers + [(config.vocab_size, h)]
    if not config.tied_embeddings:
        shapes.append((config.vocab_size, h))
    return shapes
