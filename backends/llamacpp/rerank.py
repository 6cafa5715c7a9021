"""Rerank scores on the llama.cpp runner: llama.cpp's rank pooling in an embedding-mode context.

A reranker GGUF carries a classifier head (``cls.output``, and for BERT-style models ``cls``
before it) and declares ``{arch}.pooling_type`` = 4 (RANK), or, an encoder, no pooling at all
(facts/pooling.py). In a context made with
``LLAMA_POOLING_TYPE_RANK``, llama.cpp runs the head on each sequence's pooled state (its last
token in a causal model such as Qwen3-Reranker, whose head is then soft-maxed; its first token in
a BERT) and ``llama_get_embeddings_seq`` returns the head's ``n_cls_out`` outputs. A pair's score
is the first of them, as llama-server's ``send_rerank`` takes it.

The context is made on the first rerank request, beside the generation context and the pooled
embedding context (embedding.py): ``max_ctx`` cells shared by up to ``EMBED_PASS_MAX_INPUTS``
sequences. Its decode calls are shaped as llama-server's with one slot: one pair per call, in
chunks of ``RANK_UBATCH`` tokens (llama-server's default ubatch), each chunk one ubatch. llama.cpp's
CPU results move with a ubatch's row count (flash attention takes another kernel path for larger
ubatches; embedding.py), by 3e-4 in a score on the tiny test model between 32-row ubatches and a
whole pair, so chunks of llama-server's shape are what makes its scores come out here. A feed runs
whole chunks, at least one, beyond its token budget when a chunk is larger: the engine's pacer then
repays the time from the steps that follow. A causal model's KV carries a long pair from one chunk
to the next. A non-causal (BERT) reranker attends to the whole pair at once and llama.cpp keeps no
KV for it: each pair runs in one decode call of one ubatch, as llama-server runs it, so a pair
longer than the chunk is refused (loading/rerank_spec.py refuses it first, naming the document).
Its vocabulary, WordPiece or Unigram, is tokenized by llama.cpp (vocab.py).

Every row of a decode is an output (llama.cpp pools over them), and llama.cpp's output buffer
holds logits and a state for each: ``RANK_UBATCH x (vocab + hidden) x 4`` bytes once a full chunk
has run (310 MB at Qwen3's 151,936-token vocabulary; llama-server reserves its 2048-token batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import numpy as np

from localinfer.backends.base import RunnerConfig
from localinfer.backends.llamacpp.buffers import LlamaCppBuffers, parse_buffers
from localinfer.backends.llamacpp.embedding import EmbeddingContext, LlamaCppEmbeddingPass
from localinfer.backends.llamacpp.vocab import lend_vocab
from localinfer.errors import UnsupportedModelError
from localinfer.facts.kv_dtype import KVDtype
from localinfer.loading.bert_gguf import BERT
from localinfer.loading.model import LoadedModel
from localinfer.loading.rerank_spec import is_reranker

RANK_UBATCH = 512  # llama-server's default n_ubatch


class RankContext(EmbeddingContext):
    """The rank-pooling context; ``width`` is the head's output count (n_cls_out), ``chunk``
    the tokens of one decode call."""

    def __init__(
        self,
        llama: ModuleType,
        model_ptr: object,
        max_ctx: int,
        threads: int,
        flash_attn: bool | None,
        kv_type: KVDtype | None = None,
    ) -> None:
        chunk = min(RANK_UBATCH, max_ctx)
        rank = llama.LLAMA_POOLING_TYPE_RANK
        super().__init__(
            llama, model_ptr, max_ctx, threads, flash_attn, kv_type, rank, (chunk, chunk)
        )
        self.width = max(1, int(llama.llama_model_n_cls_out(model_ptr)))
        self.chunk = chunk
        # An encoder's pair runs whole: its attention spans the pair and no KV carries a chunk.
        self.whole = not llama.llama_get_causal_attn(self._ctx)

    def score(self, tokens: Sequence[int], start: int, seq: int, last: bool) -> np.ndarray | None:
        """Run ``tokens`` (at most ``chunk``) of sequence ``seq`` at positions from ``start`` in
        one decode call; when they end the sequence's pair (``last``), the head's outputs
        (float32 ``[width]``), else None."""
        n = len(tokens)
        self._buffer.fill(
            np.asarray(tokens, dtype=np.int32), np.arange(start, start + n),
            np.full(n, seq, dtype=np.int32),
            np.ones(n, dtype=np.int8),  # every row is an output: llama.cpp pools over them
        )  # fmt: skip
        rc = self._llama.llama_decode(self._ctx, self._buffer.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode (rerank) failed with code {rc} on {n} tokens")
        self.max_outputs = max(self.max_outputs, n)
        if not last:
            return None
        ptr = self._llama.llama_get_embeddings_seq(self._ctx, seq)
        if not ptr:
            raise RuntimeError(f"llama.cpp returned no rank scores for sequence {seq}")
        return np.ctypeslib.as_array(ptr, shape=(self.width,)).astype(np.float32)


class LlamaCppRankPass(LlamaCppEmbeddingPass):
    """A pass whose per-sequence result is the head's outputs, not a unit vector; fed pair by
    pair in whole chunks (module docstring)."""

    def __init__(
        self, context: RankContext, inputs: Sequence[Sequence[int]], *, max_ctx: int, vocab: int
    ) -> None:
        longest = max((len(t) for t in inputs), default=0)
        if context.whole and longest > context.chunk:  # before the pass takes the context
            raise ValueError(
                f"a pair of {longest} tokens; this encoder scores a pair whole, in one ubatch "
                f"of {context.chunk}"
            )
        super().__init__(context, inputs, "last", max_ctx=max_ctx, vocab=vocab)
        self._rank = context

    def feed(self, max_tokens: int) -> int:
        """Whole chunks, pair after pair, while they fit ``max_tokens``; at least one."""
        if self._closed:
            raise RuntimeError("this rank pass is closed")
        ran = 0
        for i, tokens in enumerate(self.inputs):
            while self._fed[i] < len(tokens):
                start = self._fed[i]
                piece = tokens[start : start + self._rank.chunk]
                if ran and ran + len(piece) > max_tokens:
                    return ran
                scores = self._rank.score(piece, start, i, start + len(piece) == len(tokens))
                if scores is not None:
                    self._sums[i] = scores
                self._fed[i] += len(piece)
                ran += len(piece)
        return ran

    def vectors(self) -> np.ndarray:
        """``[n, width]`` float32: each sequence's head outputs (column 0 is the score)."""
        if not self.done:
            raise RuntimeError("the rank pass has tokens left to run")
        return self._sums.astype(np.float32)


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
    _reranker = False

    def _rank_setup(self, model: LoadedModel) -> None:
        """Once the model is loaded: whether it is a reranker, and llama.cpp's tokenizer lent
        to a vocabulary localinfer does not tokenize (vocab.py)."""
        self._reranker = is_reranker(model)
        # An encoder (BERT) attends both ways and has no LM head: it scores, it does not write.
        self.generates_text = model.config is None or model.config.arch != BERT
        lend_vocab(model.tokenizer, self)

    def start_rank(self, inputs: Sequence[Sequence[int]]) -> LlamaCppRankPass:
        """A pass scoring ``inputs`` (each a formatted query-document pair) with the model's
        classifier head; UnsupportedModelError when the model has none to run."""
        self._require_open()
        max_ctx = self._config.max_ctx
        if self._rank is None:
            llama = self._llama
            if not self._reranker:
                raise UnsupportedModelError(
                    "the model declares no rank pooling and has no encoder's classifier head "
                    "(it is not a reranker)"
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
