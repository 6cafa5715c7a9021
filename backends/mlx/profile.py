"""The MLX backend's framework-free facts. Importing this never imports mlx."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from localinfer.backend_profile import BackendProfile, MemoryModel, SpeculationCosts
from localinfer.backends.mlx.gguf_forms import (
    CONFIG_ONLY,
    FLOAT_BYTES,
    GGUF_FORMS,
    GROUP,
    describe_forms,
    held_tensor_bytes,
)
from localinfer.facts.arch import ArchSpec, AttentionHeads
from localinfer.facts.held_weights import HeldWeights, StoredTensor
from localinfer.facts.kv_dtype import DTYPES
from localinfer.facts.quant import mlx_recipe_layout

FLOAT32_BYTES = 4
# GGUF file types whose LM head the runner holds in affine groups (Q4_K_M keeps it Q6_K, ...).
GGUF_FILE_TYPE = re.compile(r"^Q[2-8]_(K(_[SML])?|[01])$")
MLX_ARCHS = ("llama", "mistral", "qwen2", "qwen3")  # what model.py implements


@dataclass(frozen=True, slots=True)
class MLXProfile(BackendProfile):
    def fused_attention(
        self, device_kind: str, heads: AttentionHeads, ctx: int, chunk: int
    ) -> bool:
        """mx.fast.scaled_dot_product_attention is a fused kernel on Metal only; on a CPU it runs
        the composed fallback, which holds the chunk's float32 scores against every cell
        (measured: the peak grows 2.25 MiB per 256 cells for a 256-token chunk of the embedded
        model's 9 heads, exactly one chunk x heads x cells x 4 bytes)."""
        return device_kind != "cpu"

    def held_gguf_weights(
        self,
        tensors: Sequence[StoredTensor],
        arch: ArchSpec,
        compute_dtype: str,
        device_kind: str,
    ) -> HeldWeights | None:
        """Every tensor in the form the runner converts it to (gguf_forms.py: block types as
        affine groups of 32 with 16-bit scales and biases, the rest in the compute dtype). None
        for a file of float tensors only (the general rule)."""
        if all(t.type_name not in GGUF_FORMS for t in tensors):
            return None
        float_bytes = FLOAT_BYTES.get(compute_dtype, 4)
        held = [
            t
            for t in tensors
            if t.name not in CONFIG_ONLY
            # A tied model's runner uses the table as its head, whatever else the file holds.
            and not (arch.tied_embeddings and t.name == "output.weight")
        ]
        total = sum(held_tensor_bytes(t.type_name, t.shape, float_bytes) for t in held)
        form = describe_forms((t.type_name for t in held), compute_dtype)
        return HeldWeights(total, f"MLX {form} (GGUF header)")

    def weight_forms(
        self, stored: Mapping[str, int], device_kind: str, compute_dtype: str
    ) -> dict[str, str]:
        """A GGUF block type in the affine groups gguf_forms.py maps it to (Q4_K 4-bit, Q6_K and
        Q8_0 8-bit, in groups of 32), any other type (floats, IQ*) in the compute dtype."""
        floats = DTYPES.get(compute_dtype, compute_dtype)
        forms = {}
        for type_name in stored:
            form = GGUF_FORMS[type_name][0] if type_name in GGUF_FORMS else None
            forms[type_name] = floats if form is None else f"mlx-{form.bits}bit-g{form.group}"
        return forms

    def promoted_weight_bytes(self, arch: ArchSpec, quant: str, compute_dtype: str) -> int:
        """A quantized matrix's float16 scales and biases (backends/mlx/weights.py keeps them
        16-bit beside float32 activations) are promoted to float32 for each product: the LM
        head's, vocab x groups x 2 x 4 bytes, is the largest (measured 7.5 MiB of the embedded
        Q4_1 model's one-token forward, 6.75 of it the head's; 0.2 with float weights). A GGUF
        of block types keeps its head in groups of 32 (gguf_forms.py), whatever its bits."""
        layout = mlx_recipe_layout(quant, arch.tied_embeddings)
        if compute_dtype != "float32":
            return 0
        if layout is not None:
            group = layout["head"].group
        elif GGUF_FILE_TYPE.match(quant.strip().upper()):
            group = GROUP
        else:
            return 0
        if arch.hidden_size % group:  # a matrix of partial groups stays float (weights.py)
            return 0
        return 2 * arch.vocab_size * (arch.hidden_size // group) * FLOAT32_BYTES


PROFILE = MLXProfile(
    name="mlx",
    module="mlx",
    install_hint="pip install 'localinfer[mlx]'",
    formats=("gguf", "safetensors"),
    memory=MemoryModel(
        # CPU (mlx-cpu 0.32.4, embedded model, fresh process): RSS growth minus the runner's
        # weights, KV and overhead (the largest forward's peak, which MLX's buffer cache keeps
        # after it) = 39.5 MiB (512 x 4 slots) and 40.4 (2,048 x 1), `budget --verify` at the
        # context's last chunk; 38.2 after a prefill to 2,048 cells in chunks of 256 (the RSS
        # itself peaks there): the library, the loader's tokenizer, the session's modules. The
        # file's pages and the load's freed buffers are not in it: the runner drops them
        # (runner.py); kept, they made the growth 1.33-1.55x the predicted total.
        runtime_bytes=40 * 2**20,
        # UNMEASURED placeholder: mx.get_active_memory() + mx.get_cache_memory() of an idle
        # runner minus its weights and KV cache, on an Apple Silicon Mac.
        accelerator_runtime_bytes=128 * 2**20,
        fused_attention=True,  # on Metal: mx.fast.scaled_dot_product_attention (see above)
        prefill_chunk=256,  # the engine's prefill chunk
        how_measured="CPU: measured RSS growth of load + forward minus weights, KV, overhead; "
        "Metal: UNMEASURED placeholder",
        score_copy_bytes=0,  # the fallback's float32 scores are the only copy
        # MLX evaluates a layer's graph lazily and holds its intermediates until their last use:
        # around the MLP x, the normed input, the down output and the new residual (4 x hidden),
        # the fused gate|up output, gate, up, silu's parts and the gated input (7-8 x ffn).
        # Measured on CPU (runner.memory(), embedded model, last 256-token chunk): float32
        # weights 19.1 MiB at 512 cells, predicted 18.8; Q4_1 37.7 MiB at 2,048, predicted 39.0.
        activation_width=(4, 8),
    ),
    cpu_speculation=SpeculationCosts(per_token=0.1, fixed=0.0, max_busy_slots=2),
    # The runner allocates its cache in the compute dtype: float32 on a CPU (twice the f16 the
    # budget assumed: 90 MiB measured for 45 predicted), bfloat16 on Metal.
    kv_in_compute_dtype=True,
    archs=MLX_ARCHS,
)
