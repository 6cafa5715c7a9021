"""LlamaCppRunner: the Runner protocol on llama-cpp-python's low-level API.

One llama_model and one llama_context with ``n_seq_max = slots``. Each slot is one llama.cpp
sequence (seq id = slot). The context is created with ``kv_unified = false``: in this llama.cpp
every sequence then owns its own KV stream of ``n_ctx / n_seq_max`` cells (padded up to a multiple
of 256), so ``n_ctx = slots x max_ctx`` gives every slot at least ``max_ctx`` cells of its own and
one long slot can never starve the others. ``llama_n_ctx_seq`` is checked after creation.

A ragged batch becomes one ``llama_batch`` (split into several ``llama_decode`` calls only when it
exceeds ``n_batch`` tokens or the logits rows the context reserves, context_shape.py) with a logits
flag on exactly the positions the engine asked for; the logits are copied out of llama.cpp's buffer
as float32 numpy before the next decode overwrites them.
Weights load without llama.cpp's AMX buffers where ggml has them (:func:`native.weight_buffers`:
its AMX matmul segfaults in builds made by GCC 12).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from localinfer.backends.base import (
    MemoryReport,
    Pooling,
    RunnerConfig,
    RunnerInfo,
    SlotWork,
    check_batch,
    embed_all,
)
from localinfer.backends.llamacpp import native
from localinfer.backends.llamacpp.attention_plan import PREFILL_UBATCH as DEFAULT_N_BATCH
from localinfer.backends.llamacpp.attention_plan import check_runs_here, flash_attention
from localinfer.backends.llamacpp.batch import BatchBuffer, decode_spans, flatten_batch
from localinfer.backends.llamacpp.buffers import LlamaCppBuffers, parse_buffers
from localinfer.backends.llamacpp.cache_types import (
    cache_type,
    computed_cache_bytes,
    ggml_type_id,
    is_quantized,
)
from localinfer.backends.llamacpp.context_shape import FULL_SLIDING_CACHE, output_rows
from localinfer.backends.llamacpp.cpu import physical_cores
from localinfer.backends.llamacpp.embedding import EmbeddingContext, LlamaCppEmbeddingPass
from localinfer.backends.llamacpp.image_forward import ImageFeeder
from localinfer.backends.llamacpp.kv_cache import LlamaHandles, kv_cache_for, repeated_cells
from localinfer.backends.llamacpp.mrope import SlotPositions
from localinfer.backends.llamacpp.omp_wait import prepare_omp_wait
from localinfer.backends.llamacpp.output_rows import copy_output_rows
from localinfer.backends.llamacpp.quantize import quant_matches, requantize_advice
from localinfer.backends.llamacpp.rerank import RankScoring
from localinfer.backends.llamacpp.rpc_link import close_link, decode_checked, offload_params
from localinfer.backends.llamacpp.sampling import SlotSamplers
from localinfer.errors import (
    BackendUnavailableError,
    ModelFileError,
    OutOfMemoryBudgetError,
    UnsupportedModelError,
)
from localinfer.loading.model import LoadedModel


class LlamaCppRunner(RankScoring):
    """Runs a GGUF model through llama.cpp with ``config.slots`` independent sequences; KV
    transfers between slots and to host memory, and splices, are ``kv_cache``'s (kv_cache.py).
    Items with ``SlotWork.sample`` take their token here, from the logits in place (sampling.py)."""

    samples_in_runner = True
    seeded_in_runner = False  # its sampler chain is slower than the host's: sampling.py

    def __init__(
        self,
        model: LoadedModel,
        config: RunnerConfig,
        *,
        n_batch: int = DEFAULT_N_BATCH,
        flash_attn: bool | None = None,
    ) -> None:
        self._model_ptr = None
        self._ctx = None
        self._embedding: EmbeddingContext | None = None  # made on the first embedding
        self._embedding_buffers = LlamaCppBuffers(0, 0, 0)
        path = Path(model.path)
        self.model_path = path
        if model.format != "gguf":
            raise UnsupportedModelError(
                f"the llamacpp backend runs GGUF files only; {path} is {model.format} "
                "(use --backend torch, or convert it to GGUF)"
            )
        if config.quant not in (None, "none") and not quant_matches(config.quant, model.file_quant):
            advice = requantize_advice(path, config.quant, model.file_quant)
            raise UnsupportedModelError(
                f"the llamacpp backend runs a GGUF as stored ({model.file_quant}); to use "
                f"{config.quant}, {advice}"
            )
        if not path.is_file():
            raise ModelFileError(path, "file not found")
        check_runs_here()  # in a child first: a build for another CPU dies there, not here
        self._embedding_flash = flash_attn  # embeddings (large batches): as the caller asked
        self.kv_type = cache_type(config.kv_dtype)
        if is_quantized(self.kv_type):
            flash_attn = True  # llama.cpp reads a quantized V cache only in flash attention
        elif flash_attn is None and config.device == "cpu" and model.config is not None:
            flash_attn = flash_attention(model.config, config.max_ctx, max(1, n_batch))
        self.flash_attention = flash_attn  # measured (attention_plan.py); None: llama.cpp's own
        prepare_omp_wait()  # before llama_cpp loads libgomp, which reads it once (omp_wait.py)
        self._llama = native.lib()
        self._config = config
        self._threads = config.threads or physical_cores()
        self._n_batch = max(1, n_batch)
        self._load_model(path, config.device, config.gpu_layers)
        self._rank_setup(model)  # rerank.py: a reranker? llama.cpp tokenizes WordPiece/Unigram
        self._create_context(config)
        vocab_ptr = self._llama.llama_model_get_vocab(self._model_ptr)
        self._vocab = int(self._llama.llama_vocab_n_tokens(vocab_ptr))
        self._memory = self._llama.llama_get_memory(self._ctx)
        self._samplers = SlotSamplers(self._llama, self._vocab)
        self._lengths = SlotPositions(config.slots)  # tokens, and where M-RoPE put them
        self._buffer = BatchBuffer(self._llama, self._n_batch)
        handles = LlamaHandles(self._llama, self._model_ptr, self._ctx, self._memory)
        self.kv_cache = kv_cache_for(
            handles, self._lengths, config.max_ctx, self.kv_type, path, self.forward
        )
        self._max_outputs = 0
        self._images = ImageFeeder.load(config, handles, self._lengths, self._n_batch,  # images
                                        self._threads, self._samplers, self.kv_cache,
                                        on_failure=self.close)  # fmt: skip
        self.vision = None if self._images is None else self._images.vision  # VisionInput
        # dtype: the activations'; weights keep the file's types, KV is kv_type (F16 by default).
        self.info = RunnerInfo.from_config(
            config, "llamacpp", config.device, self._vocab, model.file_quant, dtype="float32"
        )

    # -- construction -----------------------------------------------------------------------

    def _load_model(self, path: Path, device: str, gpu_layers: int | None) -> None:
        llama = self._llama
        params = native.weight_buffers(llama.llama_model_default_params())
        self._rpc = offload_params(params, self._config, llama)  # GPU layers, or RPC workers
        capture = native.LogCapture()
        with native.listen(capture):
            model_ptr = llama.llama_model_load_from_file(str(path).encode(), params)
        if not model_ptr:
            reasons = capture.errors()
            reason = reasons[0] if reasons else "llama.cpp could not load it"
            raise ModelFileError(path, f"not a loadable GGUF model: {reason}")
        self._model_ptr = model_ptr

    def _create_context(self, config: RunnerConfig) -> None:
        llama = self._llama
        params = llama.llama_context_default_params()
        params.n_ctx = config.slots * config.max_ctx
        params.n_seq_max = config.slots
        params.kv_unified = False  # one KV stream per sequence: every slot owns max_ctx cells
        params.n_batch = self._n_batch
        params.n_ubatch = self._n_batch
        params.n_threads = self._threads
        params.n_threads_batch = self._threads
        params.no_perf = True
        params.type_k = params.type_v = ggml_type_id(self.kv_type)
        params.swa_full = FULL_SLIDING_CACHE  # sliding layers keep every cell: context_shape.py
        self._max_rows = self._n_batch
        if hasattr(params, "n_outputs_max"):  # newer llama.cpp: logits rows per decode call
            # Reserved in the graph and the output buffer at vocab x 4 bytes a row; forward()
            # splits a call that asks for more (context_shape.py).
            self._max_rows = params.n_outputs_max = output_rows(config.slots, self._n_batch)
        flash = self.flash_attention
        if flash is not None:
            on, off = llama.LLAMA_FLASH_ATTN_TYPE_ENABLED, llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
            params.flash_attn_type = on if flash else off
        capture = native.LogCapture()
        with native.listen(capture):
            ctx = llama.llama_init_from_model(self._model_ptr, params)
        if not ctx:
            reasons = capture.errors()
            reason = reasons[0] if reasons else "unknown error"
            self.close()
            message = (
                f"llama.cpp could not create a context for {config.slots} slots x "
                f"{config.max_ctx} tokens: {reason}"
            )
            if "alloc" in reason.lower():  # the KV cache or compute buffers did not fit
                raise OutOfMemoryBudgetError(message + "; lower --ctx or --slots")
            raise BackendUnavailableError(message)
        self._ctx = ctx
        self._buffers = parse_buffers(capture.text())
        per_seq = int(llama.llama_n_ctx_seq(ctx))
        if per_seq < config.max_ctx or int(llama.llama_n_seq_max(ctx)) < config.slots:
            self.close()
            raise BackendUnavailableError(
                f"llama.cpp gave {per_seq} cells per sequence, fewer than max_ctx {config.max_ctx}"
            )

    # -- Runner protocol ----------------------------------------------------------------------

    def forward(self, batch: Sequence[SlotWork]) -> list[np.ndarray]:
        self._require_open()
        check_batch(batch, self._lengths, self._config.max_ctx)
        if self._images is not None and any(work.images for work in batch):
            return self._images.forward(batch, self._forward_tokens)
        return self._forward_tokens(batch)

    def _forward_tokens(self, batch: Sequence[SlotWork]) -> list[np.ndarray]:
        flat = flatten_batch(batch, self._vocab)
        tokens, pos, seq, want = flat.tokens, flat.pos, flat.seq, flat.want
        pieces: list[list[np.ndarray]] = [[] for _ in batch]
        for start, end in decode_spans(want, self._n_batch, self._max_rows):
            self._decode(tokens[start:end], pos[start:end], seq[start:end], want[start:end])
            # Sampled items draw in place; the other items' rows come out in one copy, each
            # item a view of its rows (an item's outputs are consecutive, items in slot order).
            copied: list[tuple[int, int]] = []  # (item, rows) in the order of their rows
            rows: list[int] = []
            outputs = 0
            for out in flat.outputs:
                lo, hi = max(out.row, start), min(out.row + out.n, end)
                if hi <= lo:
                    continue
                outputs += hi - lo
                work = batch[out.item]
                if work.sample is not None:
                    token = self._samplers.sample(self._ctx, work.slot, work.sample, lo - start)
                    pieces[out.item].append(np.array([token], dtype=np.int64))
                else:
                    copied.append((out.item, hi - lo))
                    rows.extend(range(lo - start, hi - start))
            self._max_outputs = max(self._max_outputs, outputs)
            if rows:
                block = self._copy_logits(np.asarray(rows, dtype=np.int64))  # [len(rows), vocab]
                row = 0
                for item, n in copied:
                    pieces[item].append(block[row : row + n])
                    row += n
            # Commit lengths chunk by chunk so a failure in a later chunk leaves them truthful.
            for s, last in flat.slot_ends(start, end):
                self._lengths[s] = last + 1

        return [p[0] if len(p) == 1 else np.concatenate(p, axis=0) for p in pieces]

    def start_embedding(
        self, inputs: Sequence[Sequence[int]], pooling: Pooling
    ) -> LlamaCppEmbeddingPass:
        """A pass in the embedding context (backends/llamacpp/embedding.py), made on first use."""
        self._require_open()
        if self._embedding is None:
            self._embedding = EmbeddingContext(
                self._llama, self._model_ptr, self._config.max_ctx, self._threads,
                self._embedding_flash, self.kv_type,
            )  # fmt: skip
            self._embedding_buffers = parse_buffers(self._embedding.log_text)
        return LlamaCppEmbeddingPass(
            self._embedding, inputs, pooling, max_ctx=self._config.max_ctx, vocab=self._vocab
        )

    def embed(self, inputs: Sequence[Sequence[int]], pooling: Pooling) -> np.ndarray:
        return embed_all(self, inputs, pooling, self._config.max_ctx)

    def slot_length(self, slot: int) -> int:
        return self._lengths.checked(slot)

    def truncate(self, slot: int, length: int) -> None:
        self._require_open()
        at = self._lengths.cut_position(slot, length)  # M-RoPE: not inside an image (mrope.py)
        if length == self._lengths[slot]:
            return
        if not self._llama.llama_memory_seq_rm(self._memory, slot, at, -1):
            raise RuntimeError(f"llama.cpp refused to truncate slot {slot} to {length}")
        self._lengths[slot] = length

    def release(self, slot: int) -> None:
        self._require_open()
        self._lengths.checked(slot)
        self._llama.llama_memory_seq_rm(self._memory, slot, -1, -1)
        self._lengths[slot] = 0
        self._samplers.release(slot)

    def memory(self) -> MemoryReport:
        """llama.cpp's own figures.

        weights: ``llama_model_size`` (bytes of all tensors as loaded). kv_cache: the KV buffer
        size llama.cpp logged when it allocated the context: the whole preallocated
        ``n_ctx x layers x (k + v)`` block of the cache's type, resident whatever the slots
        hold (``llama_state_seq_get_size`` would instead measure only the used cells, serialised).
        overhead: llama.cpp's logged compute buffer plus its logits buffer, which grows to the
        largest number of output rows requested so far; once embeddings have run, also the
        embedding context's logged KV, compute and output buffers.
        """
        self._require_open()
        weights = int(self._llama.llama_model_size(self._model_ptr))
        kv = self._buffers.kv or self.kv_cache_bytes_computed()
        logits_now = self._max_outputs * self._vocab * 4
        overhead = self._buffers.compute + max(self._buffers.output, logits_now)
        if self._images is not None:  # the projector's tensors, compute buffer and outputs
            weights, overhead = self._images.add_memory(weights, overhead)
        if self._embedding is not None:
            emb = self._embedding_buffers
            output = max(emb.output, self._embedding.output_bytes(self._vocab))
            overhead += emb.kv + emb.compute + output
        overhead += self.rank_overhead()  # the rerank context (rerank.py), once made
        return MemoryReport(
            weights=weights, kv_cache=kv, overhead=overhead, device=self._config.device
        )

    def kv_cache_bytes_computed(self) -> int:
        """KV bytes from the shapes: cells x layers x (a K row + a V row of the cache's type)."""
        return computed_cache_bytes(self._llama, self._model_ptr, self._ctx, self.kv_type)

    def metadata(self, key: str) -> str | None:
        """A GGUF metadata value as llama.cpp read it, or None when absent."""
        self._require_open()
        return native.model_meta(self._llama, self._model_ptr, key)

    def fill_synthetic(self, slot: int, n_tokens: int) -> None:
        """SyntheticFill: a few real cells computed, then repeated to ``n_tokens`` and restored."""
        self._require_open()
        self.release(slot)
        seed = min(16, n_tokens)
        self.forward([SlotWork(slot, tuple(range(100, 100 + seed)), 0)])
        if n_tokens > seed:
            cells = repeated_cells(self.kv_cache.snapshot(slot, seed), n_tokens)
            self.kv_cache.restore(slot, cells)

    @property
    def threads(self) -> int:
        return self._threads

    @property
    def graphs_reused(self) -> int:
        """Decode calls that ran the previous call's graph again instead of building one (llama.cpp
        counts them since the context was made; batch.py's flatten_batch keeps them coming)."""
        self._require_open()
        return int(self._llama.llama_perf_context(self._ctx).n_reused)

    @property
    def cells_per_slot(self) -> int:
        self._require_open()
        return int(self._llama.llama_n_ctx_seq(self._ctx))

    def close(self) -> None:
        llama = getattr(self, "_llama", None)
        if llama is None:
            return
        if getattr(self, "_embedding", None) is not None:
            self._embedding.free()
            self._embedding = None
        if getattr(self, "_images", None) is not None:
            self._images.close()
        self.free_rank()
        samplers = getattr(self, "_samplers", None)
        if samplers is not None:
            samplers.close()
        kv_cache = getattr(self, "kv_cache", None)  # absent when the context failed to build
        if kv_cache is not None:
            kv_cache.close()
        if getattr(self, "_ctx", None):
            llama.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model_ptr", None):
            llama.llama_model_free(self._model_ptr)
            self._model_ptr = None
        close_link(getattr(self, "_rpc", None))  # after the model: its buffers are freed first

    def __del__(self) -> None:
        # At interpreter shutdown ctypes may already be torn down; never raise from __del__.
        with contextlib.suppress(Exception):
            self.close()

    # -- internals ----------------------------------------------------------------------------

    def _decode(
        self, tokens: np.ndarray, pos: np.ndarray, seq: np.ndarray, want: np.ndarray
    ) -> None:
        n = self._buffer.fill(tokens, self._lengths.text_positions(pos, seq), seq, want)
        rc = decode_checked(self._llama, self._ctx, self._buffer.batch, self._rpc)
        if rc != 0:
            # Whatever llama.cpp kept of this call is dropped, so the caches match _lengths.
            for s in np.unique(seq):
                self._llama.llama_memory_seq_rm(self._memory, int(s), self._lengths.end(s), -1)
            raise RuntimeError(f"llama_decode failed with code {rc} on a batch of {n} tokens")
        self.kv_cache.cells_moved = False  # the decode turned any moved keys first

    def _copy_logits(self, rows: np.ndarray) -> np.ndarray:
        """Logits of the batch rows ``rows`` (flagged as outputs, ascending): float32
        ``[len(rows), vocab]``, copied out of llama.cpp's buffer."""
        return copy_output_rows(
            lambda i: self._llama.llama_get_logits_ith(self._ctx, i), rows, self._vocab, "logits"
        )

    def _require_open(self) -> None:
        if self._ctx is None:
            raise RuntimeError("this LlamaCppRunner is closed")


def create_runner(model: LoadedModel, config: RunnerConfig) -> LlamaCppRunner:
    """Factory used by backend selection."""
    return LlamaCppRunner(model, config)
