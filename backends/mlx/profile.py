"""The MLX backend's framework-free facts. Importing this never imports mlx."""

from __future__ import annotations

from localinfer.backends.profile import BackendProfile, MemoryModel, SpeculationCosts

PROFILE = BackendProfile(
    name="mlx",
    module="mlx",
    install_hint="pip install 'localinfer[mlx]'",
    formats=("gguf", "safetensors"),
    memory=MemoryModel(
        # UNMEASURED placeholders: mx.get_active_memory() + mx.get_cache_memory() of an idle
        # runner minus its weights and KV cache, on an Apple Silicon Mac.
        runtime_bytes=128 * 2**20,
        accelerator_runtime_bytes=128 * 2**20,
        fused_attention=True,  # mx.fast.scaled_dot_product_attention
        prefill_chunk=256,  # the engine's prefill chunk
        how_measured="UNMEASURED placeholder",
    ),
    cpu_speculation=SpeculationCosts(per_token=0.1, fixed=0.0, max_busy_slots=2),
)
