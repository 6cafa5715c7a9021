"""Embeddings on the llama.cpp runner: a second llama_context in llama.cpp's embedding mode.

The generation context keeps every slot's KV; embeddings run in a context of their own, made on
the first embedding request (a server that never embeds never pays for it), with
``embeddings = true``, ``max_ctx`` KV cells shared (``kv_unified``) by up to
``EMBED_PASS_MAX_INPUTS`` sequences, 128-token decode calls and 32-row ubatches, on the
generation context's thread count.

Its pooling type is NONE, and the pooling (mean / last / first token, as the model declares)
happens here in numpy, over the per-token states llama.cpp outputs (``llama_get_embeddings_ith``:
the final hidden state after the output norm, what its pooled modes pool too). The reason: a
pooled context pools each ubatch alone, so an input would have to fit one ubatch, and a
``max_ctx``-token ubatch would reserve a compute buffer of ``max_ctx x vocab`` logits. Per-token
states let a long input run in pieces (the causal KV carries it), like a chunked prefill.
Memory (llama.cpp's own log, SmolLM2-135M at the default 2048 cells): 45.0 MiB KV, 12.8 MiB
compute, an output buffer of logits and states (llama.cpp computes both) of 12.1 MiB at creation
that grows to 24.3 MiB once a decode outputs 128 rows; the process's RSS grew by 102 MiB. The
runner's ``memory()`` reports them as overhead.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import numpy as np

from localinfer.backends.base import EMBED_PASS_MAX_INPUTS, Pooling
from localinfer.backends.embedding_pass import Piece, PooledPass, split_pooled
from localinfer.backends.llamacpp import native
from localinfer.backends.llamacpp.batch import BatchBuffer
from localinfer.backends.llamacpp.cache_types import ggml_type_id, is_quantized
from localinfer.backends.llamacpp.output_rows import copy_output_rows
from localinfer.errors import BackendUnavailableError
from localinfer.facts.kv_dtype import KVDtype

EMBED_N_BATCH = 128  # tokens per llama_decode call of the embedding context (>= n_seq_max)
# Rows per ubatch. llama.cpp's CPU results depend on a ubatch's row count: on the embedded model
# (one thread) every count up to 63 gives the same vectors, 64 and 128 other ones, 65, 96 and
# 127 others again (cosines down to 0.99996). With ubatches of at most 32 rows a job gives the
# same vectors however the engine slices it (small feeds beside decoding streams, whole chunks
# alone: identical over feeds of 1..200 tokens), for 143 tok/s alone against 156 at 128 rows.
EMBED_N_UBATCH = 32


class EmbeddingContext:
    """The embedding context; at most one pass uses it at a time."""

    def __init__(
        self,
        llama: ModuleType,
        model_ptr: object,
        max_ctx: int,
        threads: int,
        flash_attn: bool | None,
        kv_type: KVDtype | None = None,
        pooling_type: int | None = None,
        shape: tuple[int, int] = (EMBED_N_BATCH, EMBED_N_UBATCH),
    ) -> None:
        """``kv_type``: the runner's cache type (--kv-dtype; None: F16), here too: a quantized
        one is read only by flash attention, which it then turns on. ``pooling_type``: llama.cpp's
        (None: NONE, per-token states) and ``shape`` (n_batch, n_ubatch): rerank.py's differ."""
        params = llama.llama_context_default_params()
        params.n_ctx = max_ctx
        # llama.cpp reserves an output row per sequence within n_batch, which it clamps to n_ctx:
        # more sequences than cells abort it (GGML_ASSERT at --ctx 32). A pass never holds more
        # inputs than cells (plan_embedding_passes).
        params.n_seq_max = min(EMBED_PASS_MAX_INPUTS, max_ctx)
        params.kv_unified = True  # a pass's sequences share the cells: their total <= max_ctx
        params.n_batch, params.n_ubatch = shape
        params.n_threads = threads
        params.n_threads_batch = threads
        params.embeddings = True
        none = llama.LLAMA_POOLING_TYPE_NONE
        params.pooling_type = none if pooling_type is None else pooling_type
        params.no_perf = True
        if kv_type is not None:
            params.type_k = params.type_v = ggml_type_id(kv_type)
            flash_attn = True if is_quantized(kv_type) else flash_attn
        if flash_attn is not None:
            params.flash_attn_type = (
                llama.LLAMA_FLASH_ATTN_TYPE_ENABLED
                if flash_attn
                else llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
            )
        capture = native.LogCapture()
        with native.listen(capture):
            ctx = llama.llama_init_from_model(model_ptr, params)
        if not ctx:
            reasons = capture.errors()
            raise BackendUnavailableError(
                "llama.cpp could not create its embedding context: "
                + (reasons[0] if reasons else "unknown error")
            )
        self.log_text = capture.text()  # the runner reads the buffer sizes out of it
        self.cells = int(llama.llama_n_ctx(ctx))
        self.hidden = int(llama.llama_model_n_embd(model_ptr))
        self.width = self.hidden  # floats a pass keeps per sequence
        self._llama = llama
        self._ctx = ctx
        self._memory = llama.llama_get_memory(ctx)
        self._buffer = BatchBuffer(llama, shape[0])
        self.in_use = False
        self.max_outputs = 0  # the most rows one decode has output so far

    def output_bytes(self, vocab: int) -> int:
        """The output buffer as it stands: llama.cpp grows it to the most rows one decode has
        output, each holding logits and a hidden state (it computes both)."""
        return self.max_outputs * (vocab + self.hidden) * 4

    def clear(self) -> None:
        self._llama.llama_memory_clear(self._memory, True)

    def decode(
        self, tokens: np.ndarray, pos: np.ndarray, seq: np.ndarray, want: np.ndarray
    ) -> np.ndarray:
        """One llama_decode of at most EMBED_N_BATCH rows; returns ``[outputs, hidden]`` float32,
        the states of the rows flagged in ``want``, in order."""
        n = self._buffer.fill(tokens, pos, seq, want)
        rc = self._llama.llama_decode(self._ctx, self._buffer.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode (embeddings) failed with code {rc} on {n} tokens")
        rows = np.flatnonzero(want)
        self.max_outputs = max(self.max_outputs, len(rows))
        return self._copy_rows(rows)

    def _copy_rows(self, rows: np.ndarray) -> np.ndarray:
        return copy_output_rows(
            lambda i: self._llama.llama_get_embeddings_ith(self._ctx, i),
            rows,
            self.hidden,
            "embedding",
        )

    def free(self) -> None:
        if self._ctx:
            self._llama.llama_free(self._ctx)
            self._ctx = None


class LlamaCppEmbeddingPass(PooledPass):
    def __init__(
        self,
        context: EmbeddingContext,
        inputs: Sequence[Sequence[int]],
        pooling: Pooling,
        *,
        max_ctx: int,
        vocab: int,
    ) -> None:
        super().__init__(inputs, pooling, context.width, max_ctx, vocab)
        total = sum(len(t) for t in self.inputs)
        if total > context.cells:
            raise ValueError(
                f"an embedding pass of {total} tokens; the embedding context holds "
                f"{context.cells} (plan passes with plan_embedding_passes)"
            )
        if context.in_use:
            raise RuntimeError("another embedding pass is still open on this runner")
        context.clear()
        context.in_use = True
        self._context: EmbeddingContext | None = context

    def close(self) -> None:
        if self._context is not None:
            self._context.clear()
            self._context.in_use = False
            self._context = None
        super().close()

    def _run(self, pieces: list[Piece]) -> list[np.ndarray | None]:
        assert self._context is not None
        tokens = np.concatenate([np.asarray(p.tokens, dtype=np.int32) for p in pieces])
        pos = np.concatenate([np.arange(p.start, p.start + len(p.tokens)) for p in pieces])
        seq = np.concatenate([np.full(len(p.tokens), p.seq, dtype=np.int32) for p in pieces])
        want = np.zeros(len(tokens), dtype=np.int8)
        row = 0
        for p in pieces:
            if p.pooled is not None:
                want[row + p.pooled[0] : row + p.pooled[1]] = 1
            row += len(p.tokens)
        blocks = []
        for start in range(0, len(tokens), EMBED_N_BATCH):
            end = start + EMBED_N_BATCH
            blocks.append(
                self._context.decode(tokens[start:end], pos[start:end], seq[start:end],
                                     want[start:end])
            )  # fmt: skip
        return split_pooled(pieces, np.concatenate(blocks))
