"""The torch backend's framework-free facts: what it runs, where it is the faster CPU engine,
its memory model and speculation costs. Importing this never imports torch.

On CPU the runner's native kernels (cpu_kernels.c) read GGUF Q8_0/Q4_0/Q4_1 matrices as stored;
where this machine's calibration (native_plan.py) found them faster and the build has
hand-written SIMD (AVX-512 or AVX2 + FMA), they beat llama.cpp on the same file at prefill,
one-stream and 8-slot decode (scripts/bench-native-kernels, part 3), so selection prefers them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache

from localinfer.backend_profile import BackendProfile, MemoryModel, SpeculationCosts
from localinfer.backends.torch.kquant_rules import GROUP as KQUANT_GROUP
from localinfer.backends.torch.kquant_rules import (
    held_bytes,
    held_form,
    held_source,
    holds_converted,
)
from localinfer.backends.torch.native_build import cpu_flags
from localinfer.backends.torch.native_plan import keeps_blocks, native_f32_tokens, native_plan
from localinfer.facts.arch import ArchSpec
from localinfer.facts.held_weights import HeldWeights, StoredTensor
from localinfer.facts.kv_dtype import DTYPES
from localinfer.facts.quant import TORCH_INT_GROUPS
from localinfer.loading.gguf_weights import STORED_BLOCK_TYPES

TORCH_ARCHS = ("llama", "mistral", "qwen2", "qwen3")
MEASURED_ISAS = (512, 256)  # Calibration.isa of AVX-512 and AVX2 + FMA builds
NATIVE_BLOCK_TYPES = STORED_BLOCK_TYPES  # block_weights.BLOCK_FORMATS covers each

__all__ = [
    "NATIVE_BLOCK_TYPES",
    "PROFILE",
    "TORCH_ARCHS",
    "TorchProfile",
    "cpu_flags",
    "keeps_blocks",
    "native_blocks_preferred",
    "native_f32_tokens",
    "onednn_bf16_expected",
]


# ONEDNN_MAX_CPU_ISA levels at which oneDNN may use the instructions its bf16 packing needs.
_BF16_ISA_LEVELS = ("AVX2_VNNI_2", "AVX512", "AMX", "ALL", "DEFAULT")


@cache
def onednn_bf16_expected() -> bool:
    """Whether torch's oneDNN packs bf16 linear weights on this CPU (AVX-512 BW+VL+DQ, or
    AVX-NE-CONVERT, and not hidden by ONEDNN_MAX_CPU_ISA): the torch-free twin of
    onednn.onednn_available for bf16, which asks oneDNN itself."""
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if limit and not limit.startswith(_BF16_ISA_LEVELS):
        return False
    flags = cpu_flags()
    return {"avx512bw", "avx512vl", "avx512dq"} <= flags or "avx_ne_convert" in flags


def native_blocks_preferred(file_quant: str | None, arch: str | None) -> bool:
    """Whether a GGUF stored mostly as ``file_quant`` with architecture ``arch`` runs faster on
    the native kernels than on llama.cpp here: the kernels keep its blocks on this machine
    (its calibration) and were built with hand-written SIMD, the builds measured against
    llama.cpp. Baseline and NEON builds were not compared: llama.cpp stays their default."""
    if (file_quant or "").upper() not in NATIVE_BLOCK_TYPES or arch not in TORCH_ARCHS:
        return False
    plan = native_plan()
    return plan is not None and plan.isa in MEASURED_ISAS and plan.blocks_faster()


# Verification costs on CPU (scripts/bench-speculative, embedded model, 2 threads): float32 with
# the native kernels 0.14 per extra token; on Q4_1 blocks a one-token step reads 5.6x fewer
# bytes, so each extra token weighs more (0.34), and a second busy slot's tokens are better
# spent on its own step (busy-batch table: 1.95x at 1 slot, 0.92x at 2).
_F32_SPECULATION = SpeculationCosts(per_token=0.14, fixed=0.0, max_busy_slots=2)
_BLOCKS_SPECULATION = SpeculationCosts(per_token=0.34, fixed=0.0, max_busy_slots=1)


# What the runner's quant_layout.parse_quant accepts (that module imports torch): float names and
# int8 / int4 in groups; a GGUF's own block types are run as stored, never asked of the quantizer.
_TORCH_QUANT_RE = re.compile(r"^int(4|8)(?:[-_]?g(\d+))?$")
_FLOAT_NAMES = {"none", "fp32", "f32", "float32", "bf16", "bfloat16", "fp16", "f16", "float16"}


@dataclass(frozen=True, slots=True)
class TorchProfile(BackendProfile):
    def quant_refusal(self, quant: str, file_quant: str | None) -> str | None:
        """parse_quant's refusal, for names the torch runner cannot make (mlx-4bit, ...)."""
        key = quant.strip().lower()
        named = _TORCH_QUANT_RE.match(key)
        if named and named.group(2) and int(named.group(2)) not in TORCH_INT_GROUPS:
            bits, group = named.group(1), int(named.group(2))
            return f"int{bits} group size must be one of {TORCH_INT_GROUPS}: {group}"
        if key in _FLOAT_NAMES or named or quant.upper() == file_quant:
            return None
        if key.upper().startswith(("Q", "IQ")):  # GGUF types: budgeted as their files
            return None
        return f"the torch runner quantizes to int8 or int4 (int4-g32/-g64/-g128), not {quant!r}"

    def speculation(self, device: str, weights: str | None = None) -> SpeculationCosts:
        if not device.startswith(("cuda", "metal")) and weights in NATIVE_BLOCK_TYPES:
            return _BLOCKS_SPECULATION
        return BackendProfile.speculation(self, device, weights)

    def preferred_for_gguf(self, file_quant: str | None, arch: str | None) -> bool:
        """Chosen over llama.cpp on this CPU for a GGUF of this type and architecture."""
        return native_blocks_preferred(file_quant, arch)

    def held_gguf_weights(
        self,
        tensors: Sequence[StoredTensor],
        arch: ArchSpec,
        compute_dtype: str,
        device_kind: str,
    ) -> HeldWeights | None:
        """The matrices of a file the runner converts on load (kquant_rules.holds_converted: a
        K-quant file on any device and dtype, a Q8_0/Q4_0/Q4_1 one where its blocks are not
        kept), in its forms; None for any other file, which the general rules count."""
        matrices = [(t.type_name, t.nbytes) for t in tensors if len(t.shape) == 2]
        if not self._converts(matrices, device_kind, compute_dtype):
            return None
        float_bytes = 4 if compute_dtype == "float32" else 2
        return HeldWeights(held_bytes(tensors, float_bytes, device_kind), held_source(tensors))

    def weight_forms(
        self, stored: Mapping[str, int], device_kind: str, compute_dtype: str
    ) -> dict[str, str]:
        """The forms of a file the runner converts (kquant_rules.holds_converted: a K-quant
        file on any device; a Q8_0/Q4_0/Q4_1 file on CUDA, a planned machine, or a CPU that
        does not keep its blocks): Q4_K, Q4_0, Q4_1 as int4 in groups of 32, other block types
        int8 per row, floats in the compute dtype. Where this CPU's native kernels keep a
        file's Q8_0/Q4_0/Q4_1 blocks (float32, planner.kept_blocks) they stay as stored, the
        rest dequantized; any other file is dequantized into the compute dtype, as a
        safetensors model's matrices are held."""
        floats = DTYPES.get(compute_dtype, compute_dtype)
        if self._converts(list(stored.items()), device_kind, compute_dtype):
            names = {"int4": f"int4-g{KQUANT_GROUP}", "int8": "int8", "dense": floats}
            return {type_name: names[held_form(type_name)] for type_name in stored}
        kept = self._blocks_kept(device_kind, compute_dtype)
        return {t: t if kept and t in NATIVE_BLOCK_TYPES else floats for t in stored}

    def _blocks_kept(self, device_kind: str, compute_dtype: str) -> bool:
        """The runner's native kernels keep a GGUF's Q8_0/Q4_0/Q4_1 blocks (weight_plan.py)."""
        return device_kind == "cpu" and compute_dtype == "float32" and self.keeps_blocks()

    def _converts(self, matrices: list[tuple[str, int]], device_kind: str, dtype: str) -> bool:
        """kquant_rules.holds_converted for this device and dtype. A K-quant file is converted
        whatever the kernels keep, so only another file asks (the runner does the same): this
        machine's calibration, which may measure, is not run for it."""
        if holds_converted(matrices, blocks_kept=True):
            return True
        return holds_converted(matrices, self._blocks_kept(device_kind, dtype))

    def keeps_blocks(self) -> bool:
        """A CPU float32 runner keeps a GGUF's Q8_0/Q4_0/Q4_1 matrices as stored blocks."""
        return keeps_blocks()

    def packs_matrices(self, stored: str) -> bool:
        """Matrices packed for oneDNN on CPU: bf16 where this CPU's oneDNN can; f32 only where
        the native kernels (which read the dense matrices, the tied table itself) will not run."""
        if stored == "bf16":
            return onednn_bf16_expected()
        return stored == "f32" and native_f32_tokens() == 0


PROFILE = TorchProfile(
    name="torch",
    module="torch",
    install_hint="pip install 'localinfer[torch]'",
    formats=("gguf", "safetensors"),
    memory=MemoryModel(
        # RSS growth minus predicted weights + KV + compute, scripts/budget-accuracy --backends
        # torch over 9 cells: 252-279 MiB (the library, 213 MiB alone, plus the loader's
        # tokenizer); 226-243 MiB with a GGUF's blocks kept (docs/measurements.md, "Runtime
        # constants").
        runtime_bytes=268 * 2**20,
        kept_blocks_runtime_bytes=235 * 2**20,
        # UNMEASURED placeholder: CUDA context + cuBLAS workspace.
        accelerator_runtime_bytes=512 * 2**20,
        # SDPA with a boolean mask on CPU runs the flash kernel: no chunk x ctx scores.
        fused_attention=True,
        prefill_chunk=256,  # the engine's prefill chunk: torch allocates per forward pass
        how_measured="CPU: measured RSS growth of load + forward minus weights, KV, compute; "
        "CUDA: UNMEASURED placeholder",
        tied_head_copy_on_cpu=True,  # weights() measured 621.1 MiB = 513.1 + 108.0 (tied head)
    ),
    cpu_speculation=_F32_SPECULATION,
    holds_compute_dtype=True,
    archs=TORCH_ARCHS,
)
