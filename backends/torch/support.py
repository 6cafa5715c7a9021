"""What the torch runner can run and where it is the faster CPU engine, answerable without
importing torch (backend selection and the budget ask before any framework loads).

On CPU the torch runner's native kernels (cpu_kernels.c) read GGUF Q8_0/Q4_0/Q4_1 matrices as
stored (block_weights.py), with long prefill chunks on torch ops over matrices dequantized as
they are used. On the project's 2-core AVX-512 machine, and in its AVX2 build, that beat
llama.cpp on the same embedded Q4_1 file at every step of serving: prefill, one-stream decode
and 8-slot batched decode (scripts/bench-native-kernels, part 3). llama.cpp stays the CPU default
for everything else: K-quants and other types (which the torch runner would dequantize to
float32), architectures the torch runner lacks, and builds this was not measured on (baseline
x86-64, ARM).
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

from localinfer.backends.torch.native_plan import native_plan
from localinfer.loading.gguf_weights import STORED_BLOCK_TYPES

TORCH_ARCHS = ("llama", "mistral", "qwen2", "qwen3")
MEASURED_ISAS = (512, 256)  # Calibration.isa of AVX-512 and AVX2 + FMA builds
NATIVE_BLOCK_TYPES = STORED_BLOCK_TYPES  # block_weights.BLOCK_FORMATS covers each


@cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (x86 "flags", ARM "Features"; elsewhere
    none)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[-1].split())
    return frozenset()


# ONEDNN_MAX_CPU_ISA levels at which oneDNN may use the instructions its bf16 packing needs.
_BF16_ISA_LEVELS = ("AVX2_VNNI_2", "AVX512", "AMX", "ALL", "DEFAULT")


@cache
def onednn_bf16_expected() -> bool:
    """Whether torch's oneDNN packs bf16 linear weights on this CPU (AVX-512 BW+VL+DQ, or
    AVX-NE-CONVERT, and not hidden by ONEDNN_MAX_CPU_ISA): the budget's torch-free version of
    weights.onednn_available for bf16, which asks oneDNN itself."""
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if limit and not limit.startswith(_BF16_ISA_LEVELS):
        return False
    flags = cpu_flags()
    return {"avx512bw", "avx512vl", "avx512dq"} <= flags or "avx_ne_convert" in flags


def native_blocks_preferred(file_quant: str | None, arch: str | None) -> bool:
    """Whether a GGUF stored mostly as ``file_quant`` with architecture ``arch`` runs faster on
    the torch runner's native kernels than on llama.cpp, on this CPU: the kernels keep its
    blocks here (this machine's calibration: native_plan.py) and were built with hand-written
    SIMD (AVX-512 or AVX2 + FMA), the builds that beat llama.cpp on the same file at prefill,
    single-stream and 8-slot decode (scripts/bench-native-kernels, part 3, prints this
    machine's build and its AVX2 build beside llama.cpp). Baseline and NEON builds were not
    compared: llama.cpp stays their default."""
    if (file_quant or "").upper() not in NATIVE_BLOCK_TYPES or arch not in TORCH_ARCHS:
        return False
    plan = native_plan()
    return plan is not None and plan.isa in MEASURED_ISAS and plan.blocks_faster()
