"""torch's int8 / int4 products on CUDA, run by scripts/gpu-check (skipped without CUDA).

The packed kernels (``int8pack``: ``_weight_int8pack_mm``; ``int4pack``: ``_weight_int4pack_mm``,
the tinygemm layout) are picked by KernelChooser only after agreeing with the dequantized
product once; these tests hold them to that on model-sized shapes, check that the chooser really
picks them wherever this torch build has a CUDA kernel for them (a silent fallback to
``dequant`` would keep every parity test green and lose the speed), and run a quantized runner
on CUDA against the same recipe's weights dequantized on the CPU in float32.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from localinfer.backends.base import RunnerConfig, SlotWork  # noqa: E402
from localinfer.backends.torch.quant_kernels import KERNEL_ORDER, KernelChooser  # noqa: E402
from localinfer.backends.torch.quant_layout import quantize_int4, quantize_int8  # noqa: E402
from localinfer.backends.torch.quant_recipe import parse_recipe  # noqa: E402
from localinfer.backends.torch.runner import TorchRunner  # noqa: E402
from tests.test_quant_runner import dequantized_weights  # noqa: E402
from tests.tiny import random_tokens, tiny_model  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.usefixtures("private_cache"),
]

CUDA = torch.device("cuda")
# The packed kernel's op -> the aten op whose CUDA kernel it needs.
_OPS = {"int8pack": "aten::_weight_int8pack_mm", "int4pack": "aten::_weight_int4pack_mm"}
# (out, in): SmolLM2-135M's q|k|v, down and head; Llama-3-8B's o, down and fused gate|up.
SHAPES = [(960, 576), (576, 1536), (49152, 576), (4096, 4096), (4096, 14336), (28672, 4096)]


def has_cuda_kernel(kernel: str) -> bool:
    op = _OPS.get(kernel)
    return op is not None and torch._C._dispatch_has_kernel_for_dispatch_key(op, "CUDA")


def expected_kernel(bits: int, group: int, in_features: int) -> str:
    """The first CUDA kernel KERNEL_ORDER lists that this build has and that takes the matrix:
    int8pack only per-row int8; int4pack only whole groups (and in a multiple of 32)."""
    for kernel in KERNEL_ORDER[("cuda", bits)]:
        if kernel == "dequant":
            return kernel
        takes = not group if kernel == "int8pack" else in_features % max(group, 32) == 0
        if takes and has_cuda_kernel(kernel):
            return kernel
    return "dequant"


@pytest.mark.parametrize("bits, group", [(8, 0), (4, 32), (4, 64), (4, 128)])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_packed_product_matches_the_dequantized_one(bits: int, group: int, shape) -> None:
    out_f, in_f = shape
    gen = torch.Generator().manual_seed(out_f + in_f)
    w = torch.randn(out_f, in_f, generator=gen) * 0.02
    matrix = quantize_int8(w) if bits == 8 else quantize_int4(w, group)
    chooser = KernelChooser(bits, torch.bfloat16, CUDA)
    linear = chooser.build(matrix)
    assert linear.kernel == expected_kernel(bits, group, in_f)
    dense = matrix.to(CUDA).dequantize(torch.float32)
    for tokens in (1, 8, 33):  # a decode step, a small batch, an odd prefill chunk
        x = torch.randn(tokens, in_f, generator=gen).to(CUDA, torch.bfloat16)
        want = F.linear(x.float(), dense)
        got = linear(x).float()
        assert got.shape == want.shape
        rel = float((got - want).norm() / want.norm())
        assert rel < 1e-2, (linear.kernel, tokens, rel)  # bf16 activations and accumulation


@pytest.mark.parametrize("quant", ["int8", "int4", "int4-g64"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # tied head at 8 bits; untied, biases
def test_quantized_runner_on_cuda_tracks_the_recipe_on_cpu(quant: str, arch: str) -> None:
    """bf16 on CUDA through the packed kernels vs float32 on the CPU over the very weights the
    recipe holds (dequantized): the same next tokens, logits within bf16 rounding."""
    model = tiny_model(arch)
    recipe = parse_recipe(quant, model.config.tied_embeddings)
    assert recipe is not None
    cpu = TorchRunner(
        tiny_model(arch, weights=dequantized_weights(model.weights, recipe)),
        RunnerConfig(slots=2, max_ctx=96, dtype="float32"),
    )
    gpu = TorchRunner(
        model, RunnerConfig(slots=2, max_ctx=96, dtype="bfloat16", device="cuda", quant=quant)
    )
    assert gpu.info.quant == recipe.label
    for kernel in ("int8pack", "int4pack"):
        layers = recipe.spec_for("gate_up")
        wanted = expected_kernel(layers.bits, layers.group_size, model.config.hidden_size)
        if wanted == kernel:  # the layer matrices really run on it
            assert gpu.quant_kernels.get(kernel, 0) > 0, gpu.quant_kernels
    tokens = random_tokens(40)
    want = cpu.forward([SlotWork(0, tuple(tokens), 0, "all")])[0]
    got = gpu.forward([SlotWork(0, tuple(tokens), 0, "all")])[0]
    assert got.dtype == np.float32 and np.isfinite(got).all()
    assert np.mean(got.argmax(-1) == want.argmax(-1)) >= 0.9
    assert np.abs(got - want).max() < 0.1 * np.abs(want).max()
    # a decode step after the prefill, and a ragged batch beside it
    step = gpu.forward([SlotWork(0, (7,), 40), SlotWork(1, tuple(tokens[:5]), 0)])
    ref = cpu.forward([SlotWork(0, (7,), 40), SlotWork(1, tuple(tokens[:5]), 0)])
    for g, r in zip(step, ref, strict=True):
        assert np.abs(g - r).max() < 0.1 * np.abs(r).max()
