"""The MLX backend: Metal on Apple Silicon, ``mlx[cpu]`` elsewhere (tests, CI).

runner.py (MLXRunner, create_runner, recommended_working_set) over: model.py (the decoder),
kv_cache.py (per-slot cache), batch_layout.py (ragged batch -> packed tokens + attention groups),
weights.py / native.py / gguf_forms.py / gguf_blocks.py / layers.py / quant_spec.py (float,
quantized-on-load and as-stored weights), rope.py and device.py. Nothing outside backends/
imports this package at module load.
"""
