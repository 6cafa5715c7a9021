"""What the torch runner can run and where it is the faster CPU engine, answerable without
importing torch (backend selection and the budget ask before any framework loads).

On CPU the torch runner's native kernels (cpu_kernels.c) read GGUF Q8_0/Q4_0/Q4_1 matrices as
stored (block_weights.py). On the project's 2-core AVX-512 machine (AMD EPYC, Zen 4) that beat
llama.cpp on the same embedded Q4_1 file at every step of serving: prefill, one-stream decode and
8-slot batched decode (scripts/bench-native-kernels, part 3). llama.cpp stays the CPU default for
everything else: K-quants and other types (which the torch runner would dequantize to float32),
architectures the torch runner lacks, and CPUs this was not measured on (no AVX-512: llama.cpp's
int8 dot-product kernels there were not compared).
"""

from __future__ import annotations

import platform
from functools import cache
from pathlib import Path

from localinfer.backends.torch.native_build import native_kernels_expected
from localinfer.loading.gguf_weights import STORED_BLOCK_TYPES

TORCH_ARCHS = ("llama", "mistral", "qwen2", "qwen3")
NATIVE_BLOCK_TYPES = STORED_BLOCK_TYPES  # block_weights.BLOCK_FORMATS covers each


@cache
def cpu_has_avx512() -> bool:
    """x86-64 Linux with AVX-512F, read from /proc/cpuinfo (elsewhere: False)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            return "avx512f" in line.split()
    return False


def native_blocks_preferred(file_quant: str | None, arch: str | None) -> bool:
    """Whether a GGUF stored mostly as ``file_quant`` with architecture ``arch`` runs faster on
    the torch runner's native kernels than on llama.cpp, on this CPU."""
    return (
        (file_quant or "").upper() in NATIVE_BLOCK_TYPES
        and arch in TORCH_ARCHS
        and cpu_has_avx512()
        and native_kernels_expected()
    )
