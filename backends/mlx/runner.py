"""MLXRunner: the Runner protocol (backends/base.py) on MLX — Metal on Apple Silicon, CPU elsewhere.

Weights are float (fp32/bf16/fp16), quantized on load (int4/int8, group 32/64/128) or kept as
stored: a GGUF's Q4_0..Q8_0 and K-quant blocks in MLX's affine groups, MLX-format (mlx-community)
repos (see quant_spec.py, gguf_forms.py and native.py). Memory figures come from MLX's own
allocator counters. ``RunnerConfig.threads`` is ignored: MLX has no thread-count setting.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from localinfer.backends.base import (
    MemoryReport,
    Pooling,
    RunnerConfig,
    RunnerInfo,
    SlotWork,
)
from localinfer.backends.mlx.batch_layout import layout_batch
from localinfer.backends.mlx.device import device_label, recommended_working_set, resolve_device
from localinfer.backends.mlx.embedding import MLXEmbeddingPass
from localinfer.backends.mlx.kv_cache import MLXKVCache, SlotKVCache
from localinfer.backends.mlx.model import MLX_ARCHS, LlamaModel
from localinfer.backends.mlx.quant_spec import parse_quant
from localinfer.backends.mlx.weights import load_weights
from localinfer.backends.slot_lengths import InPlaceSlots, SlotLengths, split_logits
from localinfer.errors import UnsupportedModelError
from localinfer.loading.model import LoadedModel

__all__ = ["MLXRunner", "create_runner", "recommended_working_set"]

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


class MLXRunner(InPlaceSlots):
    """Runs a Llama-family model with a ``[slots, kv_heads, max_ctx, head_dim]`` cache per layer;
    KV transfers between slots and to host memory, and splices, are ``kv_cache``'s (kv_cache.py).

    Not thread-safe: one engine thread owns it.
    """

    def __init__(self, model: LoadedModel, config: RunnerConfig) -> None:
        if config.dtype not in DTYPES:
            raise UnsupportedModelError(
                f"mlx runner dtype must be one of {', '.join(DTYPES)}, got {config.dtype!r}"
            )
        mc = model.config
        if mc.arch not in MLX_ARCHS:
            raise UnsupportedModelError(
                f"the mlx runner supports {', '.join(MLX_ARCHS)}, not {mc.arch!r}; "
                "use --backend torch or llamacpp"
            )
        spec = parse_quant(config.quant, model.file_quant)
        self.config = config
        self.model_config = mc
        self.device = resolve_device(config.device)
        dtype = DTYPES[config.dtype]
        with mx.stream(self.device):
            # Allocator deltas around each allocation are what memory() reports: the process-wide
            # counters cannot tell runners apart, so each part is measured as it is built.
            start = mx.get_active_memory()
            weights = load_weights(model, spec, dtype)
            after_weights = mx.get_active_memory()
            self._cache = SlotKVCache(
                mc.n_layers, config.slots, mc.n_kv_heads, config.max_ctx, mc.head_dim, dtype
            )
            mx.eval(self._cache.arrays())
            after_cache = mx.get_active_memory()
            self._model = LlamaModel(mc, weights, config.max_ctx, dtype)
            after_tables = mx.get_active_memory()
        _drop_load_leftovers(model)
        # Counters that do not move (an allocator without accounting) fall back to array sizes.
        self._weights_bytes = _measured(after_weights - start, weights.nbytes())
        self._kv_bytes = _measured(after_cache - after_weights, self._cache.nbytes())
        self._static_overhead = max(0, after_tables - after_cache)  # RoPE tables
        self._peak_transient = 0  # the largest forward's activations + logits, in bytes
        self._lengths = SlotLengths(config.slots)
        self._closed = False
        self.info = RunnerInfo.from_config(
            config, "mlx", device_label(self.device), mc.vocab_size, weights.quant_label
        )
        # Prefix copies, snapshots and splices (backends/base.py's KVCache) on the same arrays.
        self.kv_cache = MLXKVCache(
            self._cache, weights.norm, self.device, self.info.quant, mc, self._lengths, self.forward
        )

    # -- Runner protocol -------------------------------------------------------------------

    def forward(self, batch: Sequence[SlotWork]) -> list[np.ndarray]:
        self._check_forward(batch, self.config.max_ctx, self.model_config.vocab_size)
        if not batch:
            return []
        window = self.model_config.sliding_window if self.model_config.sliding_layers else None
        layout = layout_batch(batch, window)
        # The counters are process-wide, so the forward's own use is the peak above what was
        # active when it started (another runner freeing memory meanwhile cannot skew it).
        before = mx.get_active_memory()
        mx.reset_peak_memory()
        with mx.stream(self.device):
            hidden = self._model.hidden_states(layout, self._cache)  # [T, hidden]
            flat_rows = [r for rows in layout.logit_rows for r in rows]
            if flat_rows != list(range(hidden.shape[0])):
                hidden = hidden[mx.array(flat_rows, dtype=mx.int32)]
            logits = self._model.logits(hidden)  # [R, vocab] float32
            # The cache is evaluated with the logits so no graph outlives this step.
            mx.eval(logits, self._cache.arrays())
        self._peak_transient = max(self._peak_transient, mx.get_peak_memory() - before)
        out = np.asarray(logits)  # [R, vocab] float32
        self._advance(batch)
        return split_logits(out, layout.logit_rows)

    def fill_synthetic(self, slot: int, n_tokens: int) -> None:
        """SyntheticFill: the slot holds ``n_tokens`` cells of whatever its preallocated cache
        has there (zeros, or an earlier tenant's cells). A forward after them attends over every
        one, so `budget --verify` measures a chunk's scores at the context's depth, as budgeted."""
        self._check_open()
        self._lengths.checked(slot)
        if not 0 <= n_tokens <= self.config.max_ctx:
            raise ValueError(f"slot {slot}: {n_tokens} cells do not fit {self.config.max_ctx}")
        self._lengths[slot] = n_tokens

    def start_embedding(
        self, inputs: Sequence[Sequence[int]], pooling: Pooling
    ) -> MLXEmbeddingPass:
        """An embedding pass in a scratch cache of its own (backends/mlx/embedding.py)."""
        self._check_open()
        embedding = MLXEmbeddingPass(
            self._model, inputs, pooling, max_ctx=self.config.max_ctx, device=self.device
        )
        self._peak_transient = max(self._peak_transient, embedding.scratch_bytes())
        return embedding

    def decode_bytes_per_step(self) -> int:
        """Weight bytes one decode step reads: every matrix once (the embedding table only when
        it doubles as the LM head; a lookup reads a few rows)."""
        w = self._model.weights
        total = w.nbytes()
        if w.lm_head is not w.embed:
            total -= sum(a.nbytes for a in w.embed.arrays())
        return total

    def memory(self) -> MemoryReport:
        self._check_open()
        return MemoryReport(
            weights=self._weights_bytes,
            kv_cache=self._kv_bytes,
            overhead=self._static_overhead + self._peak_transient,
            device=self.info.device,
        )

    # -- internals ------------------------------------------------------------------------

    def _free_device_memory(self) -> None:
        mx.clear_cache()


def _drop_load_leftovers(model: LoadedModel) -> None:
    """What the load read or freed but nothing runs on, out of the process's resident memory.

    Every array is a copy by now (mx.array copies numpy memory; a GGUF's blocks were converted to
    affine groups, gguf_blocks.py), yet the file pages the load touched stay resident in the map
    the LoadedModel keeps open: the whole file, 100 MiB of the embedded model requantized to
    Q4_K_M and 766 MiB of a Llama-3.2-1B Q4_K_M, on top of the weights' own copy (`budget
    --verify` measured 1.36x and 1.55x the predicted total). torch's runner drops them likewise.
    MLX's allocator also keeps every buffer the load freed (the float32 scales and biases before
    their 16-bit cast, dequantized or requantized matrices) in its cache for reuse: 32 MiB for
    the embedded model, never the size a forward asks for again, so it is handed back too.
    """
    release_pages = getattr(model.weights, "release_pages", None)
    if release_pages is not None:
        release_pages()
    mx.clear_cache()


def _measured(delta: int, nbytes: int) -> int:
    return delta if delta > 0 else nbytes


def create_runner(model: LoadedModel, config: RunnerConfig) -> MLXRunner:
    return MLXRunner(model, config)
