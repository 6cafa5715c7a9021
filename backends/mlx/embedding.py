"""Embeddings on the MLX runner: the generation forward, run in a scratch KV cache of its own.

As on torch (backends/torch/embedding.py): a pass allocates ``[inputs, kv_heads, longest,
head_dim]`` per layer for its lifetime, runs its pieces through the same
``LlamaModel.hidden_states`` as generation, and applies the final RMSNorm to the pooled rows only.
The slots' caches are never touched.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from localinfer.backends.base import Pooling, SlotWork
from localinfer.backends.embedding_pass import Piece, PooledPass, pooled_rows, split_pooled
from localinfer.backends.mlx.batch_layout import layout_batch
from localinfer.backends.mlx.kv_cache import SlotKVCache
from localinfer.backends.mlx.model import LlamaModel


class MLXEmbeddingPass(PooledPass):
    def __init__(
        self,
        model: LlamaModel,
        inputs: Sequence[Sequence[int]],
        pooling: Pooling,
        *,
        max_ctx: int,
        device: mx.Device,
    ) -> None:
        c = model.config
        super().__init__(inputs, pooling, c.hidden_size, max_ctx, c.vocab_size)
        self._model = model
        self._device = device
        self._window = c.sliding_window if c.sliding_layers else None
        with mx.stream(device):
            self._cache: SlotKVCache | None = SlotKVCache(
                c.n_layers, len(self.inputs), c.n_kv_heads, self.longest, c.head_dim, model.dtype
            )

    def close(self) -> None:
        super().close()
        self._cache = None

    def scratch_bytes(self) -> int:
        return self._cache.nbytes() if self._cache is not None else 0

    def _run(self, pieces: list[Piece]) -> list[np.ndarray | None]:
        assert self._cache is not None
        model = self._model
        layout = layout_batch(
            [SlotWork(p.seq, p.tokens, p.start, "all") for p in pieces], self._window
        )
        wanted = pooled_rows(pieces, layout.logit_rows)
        with mx.stream(self._device):
            hidden = model.hidden_states(layout, self._cache)  # [T, hidden]
            rows = hidden[mx.array(wanted, dtype=mx.int32)] if wanted else hidden[:0]
            normed = mx.fast.rms_norm(rows, model.weights.norm, model.config.rms_eps)
            normed = normed.astype(mx.float32)
            # The scratch cache is evaluated with the rows so no graph outlives this feed.
            mx.eval(normed, self._cache.arrays())
        out = np.asarray(normed)  # [R, hidden] float32
        return split_pooled(pieces, out)
