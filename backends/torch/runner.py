"""TorchRunner: the Runner protocol (backends/base.py) on PyTorch, CPU or CUDA."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from localinfer.backends.base import (
    MemoryReport,
    Pooling,
    RunnerConfig,
    RunnerInfo,
    SlotWork,
)
from localinfer.backends.ragged_batch import PackedBatch, pack_batch
from localinfer.backends.slot_lengths import InPlaceSlots, SlotLengths, split_logits
from localinfer.backends.torch.attention import build_groups
from localinfer.backends.torch.block_weights import BlockMatrix
from localinfer.backends.torch.cpu_kernels import matrix_decoder
from localinfer.backends.torch.cuda_graphs import DecodeGraphs, graphs_wanted
from localinfer.backends.torch.embedding import TorchEmbeddingPass
from localinfer.backends.torch.kv_cache import StaticKVCache, TorchKVCache
from localinfer.backends.torch.model import LlamaModel
from localinfer.backends.torch.native_forward import NativeForward
from localinfer.backends.torch.quant_linear import QuantLinear
from localinfer.backends.torch.sampling import DeviceSamplers
from localinfer.backends.torch.weight_loading import load_weights
from localinfer.backends.torch.weight_plan import (
    DTYPE_NAMES,
    WeightPlan,
    checked_dtype,
    plan_weights,
    requantization,
    weight_form,
)
from localinfer.backends.torch.weight_quantizer import open_quantizer, save_quantized
from localinfer.backends.torch.weights import BlockDequant, ModelWeights
from localinfer.errors import BackendUnavailableError
from localinfer.loading.model import LoadedModel


class TorchRunner(InPlaceSlots):
    """Runs a Llama-family model with a static ``[slots, kv_heads, max_ctx, head_dim]`` cache.

    Not thread-safe: one engine thread owns it. Items with ``SlotWork.sample`` get their token
    drawn on the device (sampling.py); pure decode steps on CUDA replay CUDA graphs
    (cuda_graphs.py).
    """

    samples_in_runner = True

    def __init__(
        self,
        model: LoadedModel,
        config: RunnerConfig,
        native_max_tokens: int | None = None,
        stored_blocks: bool | None = None,
    ) -> None:
        """native_max_tokens, stored_blocks: overrides of what this machine's calibration
        decided (weight_plan.plan_weights says what each means); None: as calibrated."""
        checked_dtype(config)
        self.quant_spec = requantization(model, config)
        self.device = _resolve_device(config.device)
        if config.threads:
            torch.set_num_threads(config.threads)
        plan = plan_weights(
            model, config, self.quant_spec, self.device, native_max_tokens, stored_blocks
        )
        self.config = config
        self.model_config = mc = model.config
        self.dtype = plan.dtype
        self.packed_weights = plan.packed
        weights = self._load_weights(model, plan)
        self._model = LlamaModel(mc, weights, config.max_ctx, self.dtype, self.device)
        self._cache = StaticKVCache(
            mc.n_layers, config.slots, mc.n_kv_heads, config.max_ctx, mc.head_dim,
            self.dtype, self.device,
        )  # fmt: skip
        self._native = self._native_forward(plan, weights)
        self._samplers = DeviceSamplers(self.device)
        # Seeded draws in the runner only where they save the host a copy of the logits: on
        # CUDA. On a CPU the row is already in host memory, and the host's sampler
        # (engine/sampling_dist.py) cuts the vocabulary to candidates without sorting it where
        # the runner's draw sorts the row (sampling.py): for the embedded model's 49,152 entries
        # on one thread here, 83-148 us a row on the host against 4.5-4.9 ms in the runner.
        self.seeded_in_runner = self.device.type == "cuda"
        self._graphs: DecodeGraphs | None = None  # CUDA only: the code path a CPU never enters
        if graphs_wanted(self.device):
            self._graphs = DecodeGraphs(self._model, self._cache, config.slots)
        self._peak_activations = 0  # bytes of the largest forward's main intermediates
        self._peak_scratch = 0  # bytes of the largest embedding pass's scratch KV
        self._lengths = SlotLengths(config.slots)
        self._closed = False
        self.info = RunnerInfo.from_config(
            config, "torch", str(self.device), mc.vocab_size, self._quant_label(model, weights)
        )
        # Prefix copies, snapshots and splices (backends/base.py's KVCache) on the same tensors.
        self.kv_cache = TorchKVCache(
            self._cache, weights.norm, self.info.quant, mc, self._lengths, self.forward
        )

    @property
    def native_max_tokens(self) -> int:
        """Forwards up to this many tokens run the native kernels (0: they are not in use)."""
        return self._native.max_tokens if self._native is not None else 0

    # -- Runner protocol -------------------------------------------------------------------

    def forward(self, batch: Sequence[SlotWork]) -> list[np.ndarray]:
        self._check_forward(batch, self.config.max_ctx, self.model_config.vocab_size)
        if not batch:
            return []
        packed = pack_batch(batch)
        with torch.inference_mode():
            logits = self._logits(batch, packed)  # [R, vocab] float32, the wanted rows
            out = self._outputs(batch, packed, logits)
        self._advance(batch)
        return out

    def release(self, slot: int) -> None:
        super().release(slot)
        self._samplers.release(slot)  # the slot's request is over: its generator too

    def start_embedding(
        self, inputs: Sequence[Sequence[int]], pooling: Pooling
    ) -> TorchEmbeddingPass:
        """An embedding pass in a scratch cache of its own (backends/torch/embedding.py)."""
        self._check_open()
        embedding = TorchEmbeddingPass(
            self._model, inputs, pooling,
            max_ctx=self.config.max_ctx, dtype=self.dtype, device=self.device,
            native=self._native,
        )  # fmt: skip
        self._peak_scratch = max(self._peak_scratch, embedding.scratch_bytes())
        return embedding

    def decode_bytes_per_step(self) -> int:
        """Weight bytes one decode step reads: every matrix once (the embedding table only when
        it doubles as the LM head). The bandwidth model behind scripts/bench-runner."""
        weights = self._model.weights
        total = weights.nbytes()
        if not weights.lm_head_shares_embed():
            # The gather table is separate from the LM head: a step reads one row per token.
            embed = weights.embed
            total -= (
                embed.nbytes()
                if isinstance(embed, (QuantLinear, BlockMatrix))
                else (embed.untyped_storage().nbytes())
            )
        return total

    def memory(self) -> MemoryReport:
        self._check_open()
        weights = self._model.weights.nbytes()
        kv = self._cache.nbytes()
        if self.device.type == "cuda":
            # Everything torch holds on the device beyond weights + cache: activations,
            # allocator blocks kept for reuse, RoPE tables.
            reserved = torch.cuda.memory_reserved(self.device)
            overhead = max(0, reserved - weights - kv)
        else:
            tables = sum(t.untyped_storage().nbytes() for t in (self._model.cos, self._model.sin))
            overhead = tables + self._peak_activations + self._peak_scratch
            if self._dequant_buffer is not None:  # scratch the quantized matmuls expand into
                overhead += self._dequant_buffer.nbytes()
        return MemoryReport(
            weights=weights, kv_cache=kv, overhead=overhead, device=str(self.device)
        )

    # -- internals ------------------------------------------------------------------------

    def _logits(self, batch: Sequence[SlotWork], packed: PackedBatch) -> torch.Tensor:
        """The forward itself: K/V written, the wanted rows' logits [R, vocab] float32 on the
        device, in batch order (packed.wanted_rows)."""
        dev, model = self.device, self._model
        flat_rows = packed.wanted_rows()
        pick = None
        if flat_rows != list(range(len(packed.tokens))):
            pick = torch.tensor(flat_rows, dtype=torch.long, device=dev)
        window = model.sliding_window
        graphs = self._graphs
        if graphs is not None and graphs.handles(batch):
            groups = build_groups(packed, model.q_per_kv, window, dev)
            logits = graphs.logits(packed, groups)  # every row: a decode wants each
            return logits if pick is None else logits[pick]
        tokens = torch.tensor(packed.tokens, dtype=torch.long, device=dev)  # [T]
        slots = torch.tensor(packed.slots, dtype=torch.long, device=dev)  # [T]
        positions = torch.tensor(packed.positions, dtype=torch.long, device=dev)  # [T]
        native = self._native
        if native is not None and native.handles(len(packed.tokens)):
            hidden = native.hidden_states(tokens, slots, positions)
        else:
            groups = build_groups(packed, model.q_per_kv, window, dev)
            hidden = model.hidden_states(tokens, slots, positions, groups, self._cache)
        wanted = hidden if pick is None else hidden[pick]
        if native is not None and native.handles_logits(len(flat_rows)):
            logits = native.logits(wanted)
        else:
            logits = model.logits(wanted)
        self._note_activations(hidden, logits)
        return logits

    def _outputs(
        self, batch: Sequence[SlotWork], packed: PackedBatch, logits: torch.Tensor
    ) -> list[np.ndarray]:
        """Per item, its drawn token (int64 [1]) where it asked the runner to sample, else its
        logits rows: only what the host needs crosses from the device."""
        sampled = [i for i, work in enumerate(batch) if work.sample is not None]
        if not sampled:
            return split_logits(logits.cpu().numpy(), packed.logit_rows)
        first = np.cumsum([0] + [len(rows) for rows in packed.logit_rows])
        # A sampling item has exactly one row (SlotWork: logits="last").
        rows = torch.tensor(first[sampled], dtype=torch.long, device=self.device)
        specs = [batch[i].sample for i in sampled]
        slots = [batch[i].slot for i in sampled]
        drawn = self._samplers.draw(logits[rows], slots, specs)  # type: ignore[arg-type]
        out: list[np.ndarray] = [np.empty(0)] * len(batch)
        for i, token in zip(sampled, drawn.cpu().numpy().reshape(-1, 1), strict=True):
            out[i] = token  # int64 [1]
        rest = [i for i, work in enumerate(batch) if work.sample is None]
        if rest:
            kept = [r for i in rest for r in range(first[i], first[i + 1])]
            index = torch.tensor(kept, dtype=torch.long, device=self.device)
            host = logits[index].cpu().numpy()
            parts = split_logits(host, [packed.logit_rows[i] for i in rest])
            for i, rows in zip(rest, parts, strict=True):
                out[i] = rows
        return out

    def _free_device_memory(self) -> None:
        self._graphs = None  # the captured graphs' pool, and their hold on the model and cache
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _quant_label(self, model: LoadedModel, weights: ModelWeights) -> str:
        """What the weights are held as: the int8/int4 label, the GGUF type most of the block
        bytes are in (the file's own where it is one of them), else the float dtype."""
        if self.quant_spec is not None:
            return self.quant_spec.label
        if self._kquant:  # held as converted from the file's own blocks
            return model.file_quant or DTYPE_NAMES[self.config.dtype]
        kept = weights.block_types()
        if kept:
            return model.file_quant if model.file_quant in kept else max(kept, key=kept.get)
        return DTYPE_NAMES[self.config.dtype]

    def _load_weights(self, model: LoadedModel, plan: WeightPlan) -> ModelWeights:
        quantizer = None
        if plan.quant is not None:
            quantizer = open_quantizer(plan.quant, plan.dtype, plan.device, Path(model.path))
        self._kquant = plan.kquant
        form = weight_form(plan, model, quantizer)
        chooser = form.chooser
        self._dequant_buffer = chooser.buffer if chooser is not None else None
        weights = load_weights(model.config, model.weights, form)
        self.quant_cache_hit = False  # the quantized weights came from the on-disk cache
        # kernel name -> matrices using it
        self.quant_kernels: dict[str, int] = chooser.kernels_used if chooser is not None else {}
        if quantizer is not None:
            self.quant_cache_hit = quantizer.cache_hits > 0 and not quantizer.new_entries
            save_quantized(quantizer, Path(model.path))
        # Every weight is copied out of the model file by now (blocks, float32 or re-quantized):
        # the file pages the load read need not stay resident (~93 MB for the embedded model).
        release_pages = getattr(model.weights, "release_pages", None)
        if release_pages is not None:
            release_pages()
        if plan.kernels is not None and weights.has_blocks():
            # Long prefill chunks run torch ops (faster there, by the calibration): each block
            # matrix is dequantized into one reused buffer as it is used.
            threads = self.config.threads or torch.get_num_threads()
            weights.dequant = BlockDequant(
                matrix=matrix_decoder(plan.kernels, threads), rows=plan.kernels.dequant_rows
            )
        return weights

    def _native_forward(self, plan: WeightPlan, weights: ModelWeights) -> NativeForward | None:
        if plan.kernels is None:
            return None
        model = self._model
        return NativeForward(
            plan.kernels, self.model_config, weights, self._cache, model.cos, model.sin,
            max_tokens=plan.native_max_tokens, threads=self.config.threads,
        )  # fmt: skip

    def _note_activations(self, hidden: torch.Tensor, logits: torch.Tensor) -> None:
        # CPU has no allocator statistics, so overhead counts the bytes of the largest live
        # intermediates of the biggest forward so far, from the shapes that forward had: per
        # token the residual stream, a normed copy, the fused q|k|v and gate|up outputs and the
        # attention output; plus the logits tensor itself.
        c = self.model_config
        n = hidden.shape[0]
        per_token = (c.hidden_size * 3 + 2 * c.ffn_size + c.q_size + 2 * c.kv_size) * (
            hidden.element_size()
        )
        size = n * per_token + logits.untyped_storage().nbytes()
        self._peak_activations = max(self._peak_activations, size)


def _resolve_device(name: str) -> torch.device:
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailableError(f"device {name!r} requested but CUDA is not available")
    if device.type not in ("cpu", "cuda"):
        raise BackendUnavailableError(f"the torch runner runs on cpu or cuda, not {name!r}")
    return device


def create_runner(model: LoadedModel, config: RunnerConfig) -> TorchRunner:
    return TorchRunner(model, config)
