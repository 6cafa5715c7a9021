"""Rerank scores on the llama.cpp runner: llama.cpp's rank pooling in an embedding-mode context.

A reranker GGUF declares ``{arch}.pooling_type`` = 4 (RANK) and carries a classifier head
(``cls.output``, and for BERT-style models ``cls`` before it). In a context made with
``LLAMA_POOLING_TYPE_RANK``, llama.cpp runs the head on each sequence's pooled state (its last
token in a causal model such as Qwen3-Reranker, whose head is then soft-maxed; its first token in
a BERT) and ``llama_get_embeddings_seq`` returns the head's ``n_cls_out`` outputs. A pair's score
is the first of them, as llama-server's ``send_rerank`` takes it.

The context is made on the first rerank request, beside the generation context and the pooled
embedding context (embedding.py), with the same shape: ``max_ctx`` cells shared by up to
``EMBED_PASS_MAX_INPUTS`` sequences, 128-token decode calls in 32-row ubatches. A causal model's
KV carries a pair across decode calls, so a pass is fed in pieces, paced by the engine like an
embedding job; the head reads the last token, so a sequence's scores are read after the decode
call that holds its last token. A non-causal (BERT) reranker would need each pair whole in one
ubatch; it is refused here (localinfer's loader does not read BERT GGUFs either).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import numpy as np

from localinfer.backends.base import RunnerConfig
from localinfer.backends.embedding_pass import Piece
from localinfer.backends.llamacpp.buffers import LlamaCppBuffers, parse_buffers
from localinfer.backends.llamacpp.embedding import (
    EMBED_N_BATCH,
    EmbeddingContext,
    LlamaCppEmbeddingPass,
)
from localinfer.errors import UnsupportedModelError
from localinfer.facts.kv_dtype import KVDtype


class RankContext(EmbeddingContext):
    """The rank-pooling context; ``width`` is the head's output count (n_cls_out)."""

    def __init__(
        self,
        llama: ModuleType,
        model_ptr: object,
        max_ctx: int,
        threads: int,
        flash_attn: bool | None,
        kv_type: KVDtype | None = None,
    ) -> None:
        rank = llama.LLAMA_POOLING_TYPE_RANK
        super().__init__(llama, model_ptr, max_ctx, threads, flash_attn, kv_type, rank)
        if not llama.llama_get_causal_attn(self._ctx):
            self.free()
            raise UnsupportedModelError(
                "a non-causal reranker (BERT-style) needs each pair in one ubatch; the llama.cpp "
                "runner scores causal rerankers only"
            )
        self.width = max(1, int(llama.llama_model_n_cls_out(model_ptr)))

    def run(self, tokens: np.ndarray, pos: np.ndarray, seq: np.ndarray) -> None:
        """One llama_decode of at most EMBED_N_BATCH rows (every row is an output: llama.cpp
        pools over them)."""
        want = np.ones(len(tokens), dtype=np.int8)
        n = self._buffer.fill(tokens, pos, seq, want)
        rc = self._llama.llama_decode(self._ctx, self._buffer.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode (rerank) failed with code {rc} on {n} tokens")
        self.max_outputs = max(self.max_outputs, n)

    def scores(self, seq: int) -> np.ndarray:
        """The head's outputs for sequence ``seq`` after the decode that held its last token:
        float32 ``[width]``."""
        ptr = self._llama.llama_get_embeddings_seq(self._ctx, seq)
        if not ptr:
            raise RuntimeError(f"llama.cpp returned no rank scores for sequence {seq}")
        return np.ctypeslib.as_array(ptr, shape=(self.width,)).astype(np.float32)


class LlamaCppRankPass(LlamaCppEmbeddingPass):
    """A pass whose per-sequence result is the head's outputs, not a unit vector."""

    def __init__(
        self, context: RankContext, inputs: Sequence[Sequence[int]], *, max_ctx: int, vocab: int
    ) -> None:
        # "last": the pass keeps one row per sequence, taken with its last piece.
        super().__init__(context, inputs, "last", max_ctx=max_ctx, vocab=vocab)
        self._rank = context

    def vectors(self) -> np.ndarray:
        """``[n, width]`` float32: each sequence's head outputs (column 0 is the score)."""
        if not self.done:
            raise RuntimeError("the rank pass has tokens left to run")
        return self._sums.astype(np.float32)

    def _run(self, pieces: list[Piece]) -> list[np.ndarray | None]:
        tokens = np.concatenate([np.asarray(p.tokens, dtype=np.int32) for p in pieces])
        pos = np.concatenate([np.arange(p.start, p.start + len(p.tokens)) for p in pieces])
        seq = np.concatenate([np.full(len(p.tokens), p.seq, dtype=np.int32) for p in pieces])
        ends = np.cumsum([len(p.tokens) for p in pieces])  # the row after each piece's last
        out: list[np.ndarray | None] = [None] * len(pieces)
        for start in range(0, len(tokens), EMBED_N_BATCH):
            end = min(start + EMBED_N_BATCH, len(tokens))
            self._rank.run(tokens[start:end], pos[start:end], seq[start:end])
            for k, piece in enumerate(pieces):
                if piece.pooled is not None and start < ends[k] <= end:
                    out[k] = self._rank.scores(piece.seq)[None, :]
        return out


class RankScoring:
    """LlamaCppRunner's rank pooling (a mixin: it reads the runner's handles), made on first
    use; its KV, compute and output buffers count in the runner's overhead."""

    # The runner's (LlamaCppRunner sets them).
    _llama: ModuleType
    _model_ptr: object
    _ctx: object
    _config: RunnerConfig
    _threads: int
    _vocab: int
    _embedding_flash: bool | None
    kv_type: KVDtype
    _rank: RankContext | None = None
    _rank_buffers: LlamaCppBuffers = LlamaCppBuffers(0, 0, 0)

    def start_rank(self, inputs: Sequence[Sequence[int]]) -> LlamaCppRankPass:
        """A pass scoring ``inputs`` (each a formatted query-document pair) with the model's
        classifier head; UnsupportedModelError when the model has none to run."""
        self._require_open()
        max_ctx = self._config.max_ctx
        if self._rank is None:
            llama = self._llama
            if llama.llama_pooling_type(self._ctx) != llama.LLAMA_POOLING_TYPE_RANK:
                raise UnsupportedModelError(
                    "the model declares no rank pooling (it is not a reranker)"
                )
            self._rank = RankContext(
                llama, self._model_ptr, max_ctx, self._threads, self._embedding_flash, self.kv_type
            )
            self._rank_buffers = parse_buffers(self._rank.log_text)
        return LlamaCppRankPass(self._rank, inputs, max_ctx=max_ctx, vocab=self._vocab)

    def rank_overhead(self) -> int:
        """Bytes the rank context holds (0 before the first rerank)."""
        if self._rank is None:
            return 0
        b = self._rank_buffers
        return b.kv + b.compute + max(b.output, self._rank.output_bytes(self._vocab))

    def free_rank(self) -> None:
        if self._rank is not None:
            self._rank.free()
            self._rank = None

    def _require_open(self) -> None:  # LlamaCppRunner's
        raise NotImplementedError
