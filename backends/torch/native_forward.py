"""The torch runner's CPU fast path: a small batch's whole forward in one native call.

Decode steps, speculative verification and small prefill chunks (up to ``max_tokens`` packed
tokens) go through cpu_kernels.c over the runner's own tensors: the weight matrices in Hugging
Face layout (float32, or GGUF blocks: block_weights.py), the static KV cache and the RoPE tables.
Larger prefill chunks, where the products are compute-bound and MKL/oneDNN are the better GEMM,
stay on the torch ops in model.py. Both paths write the same cache, so a slot can move between
them from one forward to the next. With block matrices the torch ops cannot run: every forward
comes here, a long one in chunks of ``CHUNK_TOKENS`` (scratch stays bounded; each token's result
does not depend on the batch, so chunked equals one-shot).
"""

from __future__ import annotations

import copy
import ctypes
import math

import torch

from localinfer.backends.torch.block_weights import BlockMatrix
from localinfer.backends.torch.cpu_kernels import Dims, LayerPointers, NativeKernels, mat
from localinfer.backends.torch.kv_cache import StaticKVCache
from localinfer.backends.torch.native_plan import DEFAULT_MAX_TOKENS
from localinfer.backends.torch.weights import ModelWeights
from localinfer.loading.model_config import ModelConfig

# DEFAULT_MAX_TOKENS: above about this many tokens in one forward the torch GEMMs catch up
# (scripts/bench-native-kernels part 2: at 64 tokens 476 vs 487 tokens/s); each machine's own
# limit comes from its calibration (native_plan.py), at most this.

MAX_HEAD_DIM = 512  # the kernels rotate a head in a stack buffer of this size
# Tokens per native call when every forward must run natively (block weights): scratch is about
# 7 MB at this size for the embedded model, and chunks this long are compute-bound anyway.
CHUNK_TOKENS = 256


def _addr(t: torch.Tensor | None) -> int | None:
    if t is None:
        return None
    if t.dtype != torch.float32 or not t.is_contiguous():
        raise ValueError("native forward needs contiguous float32 tensors")
    return t.data_ptr()


class NativeForward:
    def __init__(
        self,
        kernels: NativeKernels,
        config: ModelConfig,
        weights: ModelWeights,
        cache: StaticKVCache,
        cos: torch.Tensor,
        signed_sin: torch.Tensor,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        threads: int | None = None,
        chunk_tokens: int = CHUNK_TOKENS,
    ) -> None:
        """max_tokens: forwards of up to this many tokens come here (``chunk_tokens`` at a time);
        longer ones run torch ops, on block matrices dequantized one at a time as they are used
        (weights.dequant). Logits always come here when the LM head is blocks."""
        self.kernels = kernels
        # The runner's thread count (RunnerConfig.threads, else torch's setting when built),
        # passed to every OpenMP region explicitly.
        self.threads = threads or torch.get_num_threads()
        self.config = config
        self.max_tokens = max_tokens
        self.chunk_tokens = chunk_tokens
        # A block LM head is never dequantized whole (49152 x 576 floats for the embedded
        # model): every logits product comes here.
        self.block_head = isinstance(weights.lm_head, BlockMatrix)
        # The kernels hold raw addresses: keep every tensor they point into alive here.
        self._weights = weights
        self._cos, self._sin = cos.contiguous(), signed_sin.contiguous()
        self._bind(cache)
        self._lm_head = mat(weights.lm_head)
        self._scratch = torch.empty(0, dtype=torch.float32)

    def bound_to(self, cache: StaticKVCache) -> NativeForward:
        """The same kernels and weights over another cache of the same layout (an embedding
        pass's scratch KV): forwards through it read and write only that cache."""
        other = copy.copy(self)
        other._bind(cache)
        other._scratch = torch.empty(0, dtype=torch.float32)
        return other

    def _bind(self, cache: StaticKVCache) -> None:
        config, weights = self.config, self._weights
        self._cache = cache  # the kernels hold raw addresses into it: kept alive here
        self.dims = Dims(
            hidden=config.hidden_size, n_heads=config.n_heads, n_kv_heads=config.n_kv_heads,
            head_dim=config.head_dim, ffn=config.ffn_size, max_ctx=cache.max_ctx,
            eps=config.rms_eps, attn_scale=1.0 / math.sqrt(config.head_dim),
        )  # fmt: skip
        window = config.sliding_window or 0
        layers = (LayerPointers * config.n_layers)()
        for i, lw in enumerate(weights.layers):
            layers[i] = LayerPointers(
                input_norm=_addr(lw.input_norm), qkv=mat(lw.qkv), qkv_bias=_addr(lw.qkv_bias),
                q_norm=_addr(lw.q_norm), k_norm=_addr(lw.k_norm), o=mat(lw.o),
                post_norm=_addr(lw.post_norm), gate_up=mat(lw.gate_up), down=mat(lw.down),
                kcache=_addr(cache.keys[i]), vcache=_addr(cache.values[i]),
                window=window if lw.sliding else 0,
            )  # fmt: skip
        self._layers = layers

    def handles(self, tokens: int) -> bool:
        return tokens <= self.max_tokens

    def handles_logits(self, rows: int) -> bool:
        return self.block_head or rows <= self.max_tokens

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """[T] ids -> a fresh [T, hidden] float32 tensor (the kernels update it in place)."""
        table = self._weights.embed
        if isinstance(table, BlockMatrix):
            return self.kernels.dequant_rows(table, tokens)
        return table[tokens].contiguous()

    def _scratch_for(self, floats: int) -> torch.Tensor:
        if self._scratch.numel() < floats:
            self._scratch = torch.empty(floats, dtype=torch.float32)
        return self._scratch

    def hidden_states(
        self, tokens: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """tokens, slots, positions: [T] long (CPU). Writes K/V into the cache; returns
        [T, hidden] before the final norm, as LlamaModel.hidden_states."""
        x = self.embed(tokens)
        slots = slots.contiguous()
        positions = positions.contiguous()
        n = tokens.shape[0]
        # In order: a chunk's tokens see the K/V every earlier chunk wrote.
        for start in range(0, n, self.chunk_tokens):
            end = min(n, start + self.chunk_tokens)
            self._run(x[start:end], slots[start:end], positions[start:end])
        return x

    def _run(self, x: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor) -> None:
        """One native call over contiguous row slices; updates x [n, hidden] in place."""
        n, threads = x.shape[0], self.threads
        scratch = self._scratch_for(self.kernels.scratch_floats(self.dims, n, threads))
        rc = self.kernels.forward(
            ctypes.byref(self.dims), self._layers, self.config.n_layers, x.data_ptr(), n,
            slots.data_ptr(), positions.data_ptr(), self._cos.data_ptr(), self._sin.data_ptr(),
            scratch.data_ptr(), threads,
        )  # fmt: skip
        if rc != 0:
            raise ValueError(f"native forward refused head_dim {self.config.head_dim}")

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[R, hidden] -> [R, vocab] float32: final norm + LM head."""
        hidden = hidden.contiguous()
        rows, h = hidden.shape
        vocab = self._weights.lm_head.shape[0]
        out = torch.empty(rows, vocab, dtype=torch.float32)
        normed = self._scratch_for(rows * h)
        self.kernels.norm_linear(
            hidden.data_ptr(), rows, h, self._weights.norm.data_ptr(), self.config.rms_eps,
            normed.data_ptr(), ctypes.byref(self._lm_head), vocab, out.data_ptr(), self.threads,
        )  # fmt: skip
        return out
