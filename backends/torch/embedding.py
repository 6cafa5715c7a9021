"""Embeddings on the torch runner: the generation forward, run in a scratch KV cache of its own.

A pass allocates ``[inputs, kv_heads, longest, head_dim]`` per layer for its lifetime (at most
one slot's ``max_ctx`` cells: backends/base.plan_embedding_passes), runs its pieces through the
same ``LlamaModel.hidden_states`` as generation (each input in its own scratch slot, causal as in
generation), then the final RMSNorm on the pooled rows only. The slots' caches are never touched.
A feed takes the path a generation forward of its size takes: up to the runner's native limit
the CPU kernels (``NativeForward.bound_to`` the pass's scratch cache), above it the torch ops.
The small pieces an engine feeds beside decoding streams need the kernels: with GGUF blocks
kept, a torch-ops forward dequantizes every matrix, whatever its token count.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from localinfer.backends.base import Pooling, SlotWork
from localinfer.backends.embedding_pass import Piece, PooledPass, pooled_rows, split_pooled
from localinfer.backends.ragged_batch import pack_batch
from localinfer.backends.torch.attention import build_groups
from localinfer.backends.torch.kv_cache import StaticKVCache
from localinfer.backends.torch.model import LlamaModel, rms_norm
from localinfer.backends.torch.native_forward import NativeForward


class TorchEmbeddingPass(PooledPass):
    def __init__(
        self,
        model: LlamaModel,
        inputs: Sequence[Sequence[int]],
        pooling: Pooling,
        *,
        max_ctx: int,
        dtype: torch.dtype,
        device: torch.device,
        native: NativeForward | None = None,
    ) -> None:
        """native: the runner's kernels (bound to the slot cache); the pass binds a copy to its
        own scratch cache. None: every feed runs torch ops."""
        c = model.config
        super().__init__(inputs, pooling, c.hidden_size, max_ctx, c.vocab_size)
        self._model = model
        self._device = device
        self._cache: StaticKVCache | None = StaticKVCache(
            c.n_layers, len(self.inputs), c.n_kv_heads, self.longest, c.head_dim, dtype, device
        )
        self._native = native.bound_to(self._cache) if native is not None else None

    def close(self) -> None:
        super().close()
        self._cache = self._native = None  # the scratch goes back to the allocator

    def scratch_bytes(self) -> int:
        return self._cache.nbytes() if self._cache is not None else 0

    def _run(self, pieces: list[Piece]) -> list[np.ndarray | None]:
        assert self._cache is not None
        model, dev = self._model, self._device
        packed = pack_batch([SlotWork(p.seq, p.tokens, p.start, "all") for p in pieces])
        wanted = pooled_rows(pieces, packed.logit_rows)
        with torch.inference_mode():
            tokens = torch.tensor(packed.tokens, dtype=torch.long, device=dev)  # [T]
            slots = torch.tensor(packed.slots, dtype=torch.long, device=dev)  # [T]
            positions = torch.tensor(packed.positions, dtype=torch.long, device=dev)  # [T]
            if self._native is not None and self._native.handles(len(packed.tokens)):
                hidden = self._native.hidden_states(tokens, slots, positions)  # [T, hidden]
            else:
                groups = build_groups(packed, model.q_per_kv, model.sliding_window, dev)
                hidden = model.hidden_states(tokens, slots, positions, groups, self._cache)
            rows = hidden[torch.tensor(wanted, dtype=torch.long, device=dev)]  # [R, hidden]
            normed = rms_norm(rows, model.weights.norm, model.config.rms_eps)
            out = normed.float().cpu().numpy()
        return split_pooled(pieces, out)
