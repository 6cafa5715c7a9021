"""How a TorchRunner holds its weights and which forwards run on the native kernels: decided once,
from the model, the RunnerConfig and this machine's calibration (native_plan.py).

* int8 / int4 asked by name: the weights are re-quantized in this runner's layout (quant_layout.py),
  torch ops multiply; the file's own type or a float name means no quantization.
* A GGUF's own type asked or none, as kquant_rules.holds_converted decides: a K-quant file on
  any device and dtype, a Q8_0 / Q4_0 / Q4_1 file wherever the native kernels do not keep its
  blocks (CUDA, a CPU in bf16/fp16 or where they lost): its matrices held quantized as
  converted from the stored bytes (kquant_form.py: int4 groups of 32, int8 per row),
  multiplied by torch's packed kernels. A float name (``--quant f32``, ``bf16``, ``none``) asks
  for the whole model dequantized instead, as the rules below hold it.
* CPU float32: the native kernels (native_forward.py) where they build and measured faster here,
  on the file's GGUF blocks where those measured faster still (block_weights.py); dense matrices
  multiplied with oneDNN beside them.
* Elsewhere (safetensors or a float name on CUDA or in bf16/fp16, or the kernels not in use):
  dense matrices, oneDNN-packed on a CPU whose oneDNN takes this dtype (onednn.py), plain
  F.linear otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from localinfer.backends.base import RunnerConfig
from localinfer.backends.torch.cpu_kernels import NativeKernels, load_kernels
from localinfer.backends.torch.kquant_form import held_converted, kquant_form
from localinfer.backends.torch.native_forward import MAX_HEAD_DIM
from localinfer.backends.torch.native_plan import (
    keeps_blocks,
    native_block_tokens,
    native_f32_tokens,
)
from localinfer.backends.torch.onednn import onednn_available
from localinfer.backends.torch.quant_recipe import QuantRecipe, parse_recipe
from localinfer.backends.torch.weight_forms import (
    WeightForm,
    block_form,
    dense_form,
    quantized_form,
)
from localinfer.backends.torch.weight_quantizer import WeightQuantizer
from localinfer.errors import UnsupportedModelError
from localinfer.loading.model import LoadedModel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@dataclass(frozen=True, slots=True)
class WeightPlan:
    dtype: torch.dtype
    device: torch.device
    quant: QuantRecipe | None  # re-quantize to int8 / int4; None: keep the file's numbers
    kernels: NativeKernels | None  # the native CPU kernels, where they run
    native_max_tokens: int  # forwards up to this many tokens run the kernels
    keep_blocks: bool  # hold the file's GGUF blocks (with the kernels only)
    onednn: bool  # oneDNN multiplies this dtype on this device
    kquant: bool = False  # hold a GGUF's matrices converted from its blocks (kquant_form.py)

    @property
    def packed(self) -> bool:
        """Dense matrices packed once for oneDNN (CPU without the native kernels)."""
        return self.kernels is None and self.onednn


def checked_dtype(config: RunnerConfig) -> torch.dtype:
    if config.dtype not in DTYPES:
        raise UnsupportedModelError(
            f"torch runner dtype must be one of {', '.join(DTYPES)}, got {config.dtype!r}"
        )
    return DTYPES[config.dtype]


def requantization(model: LoadedModel, config: RunnerConfig) -> QuantRecipe | None:
    """int8 / int4 requantize the (dequantized) weights in this runner's own layout, each
    matrix as the recipe says for its role (quant_recipe.py). The file's own type or a float
    name means: no requantization (the file's own type may be held converted: plan_weights)."""
    keep = config.quant in (None, model.file_quant, DTYPE_NAMES[config.dtype])
    return None if keep else parse_recipe(config.quant, model.config.tied_embeddings)


def plan_weights(
    model: LoadedModel,
    config: RunnerConfig,
    quant: QuantRecipe | None,
    device: torch.device,
    native_max_tokens: int | None,
    stored_blocks: bool | None,
) -> WeightPlan:
    """native_max_tokens: forwards of up to this many tokens run the native CPU kernels
    (native_forward.py; 0 = never, torch ops only). None: as this machine's calibration
    decided (native_plan.py: up to DEFAULT_MAX_TOKENS where the kernels measured faster
    than torch ops, none where they did not).
    stored_blocks: where the native kernels run (CPU, float32) and the file keeps matrices
    as GGUF Q8_0/Q4_0/Q4_1 blocks, hold those blocks instead of float32 (block_weights.py:
    same results, ~5x fewer bytes; every forward then runs natively). None: where the
    calibration found a product on blocks faster than on float32, else such a file is held
    converted (int4 / int8, as a K-quant file). Never when the config asks for float weights
    by name (quant "none", "fp32" ...); False: float32 as before, not converted."""
    dtype = DTYPES[config.dtype]
    own = quant is None and config.quant in (None, model.file_quant)  # the file's own numbers
    native_fits = (
        quant is None
        and device.type == "cpu"
        and dtype == torch.float32
        and model.config.head_dim <= MAX_HEAD_DIM
    )
    # Converted even where the kernels would keep blocks (a K-quant file): they never run it,
    # so this machine's calibration is not asked.
    always = own and held_converted(model.weights, blocks_kept=True)
    floats_asked = stored_blocks is False  # the caller's, before the calibration's answer
    if stored_blocks is None:  # an explicit 0 native tokens means torch ops only
        stored_blocks = native_fits and not always and native_max_tokens != 0 and keeps_blocks()
    # Only a source that hands out stored block rows (GGUF), and only as the file stores them.
    blocks_kept = bool(stored_blocks) and native_fits and own
    blocks_kept = blocks_kept and hasattr(model.weights, "stored_rows")
    # Held converted from its blocks (kquant_rules.holds_converted): a K-quant file always; a
    # Q8_0/Q4_0/Q4_1 one unless the kernels keep its blocks or stored_blocks=False asked for
    # its float32 matrices by name (benchmarks and tests comparing against them).
    stays = blocks_kept or floats_asked
    kquant = always or (own and held_converted(model.weights, blocks_kept=stays))
    native_here = native_fits and not kquant
    keep_blocks = blocks_kept and not kquant
    if native_max_tokens is None:  # as calibrated for what the kernels will multiply by
        tokens = native_block_tokens if keep_blocks else native_f32_tokens
        native_max_tokens = tokens() if native_here else 0
    kernels = None
    if native_here and (native_max_tokens or keep_blocks):
        kernels = load_kernels()
    return WeightPlan(
        dtype=dtype,
        device=device,
        quant=quant,
        kernels=kernels,
        native_max_tokens=native_max_tokens,
        keep_blocks=keep_blocks,
        onednn=quant is None and not kquant and onednn_available(dtype, device),
        kquant=kquant,
    )


def weight_form(
    plan: WeightPlan, model: LoadedModel, quantizer: WeightQuantizer | None
) -> WeightForm:
    """The form the plan's weights load in (``quantizer``: the plan's int8 / int4 one)."""
    if quantizer is not None:
        return quantized_form(quantizer, plan.dtype, plan.device)
    if plan.kquant:
        return kquant_form(model.config, model.weights, plan.dtype, plan.device)  # type: ignore[arg-type]
    native = plan.kernels is not None
    if native and plan.keep_blocks:
        # Every forward then runs natively (long ones on block matrices decoded as used).
        return block_form(model.config, model.weights, huge_pages=True)
    return dense_form(
        model.config, plan.dtype, plan.device, pack=plan.packed, huge_pages=native,
        onednn_dense=native and plan.onednn,
    )  # fmt: skip
