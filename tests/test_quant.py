"""backends/torch/quant_*.py on random matrices: layout, round-trip error bounds, kernels."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from localinfer.backends.torch import quant_dequant, quant_kernels
from localinfer.backends.torch.quant_dequant import DequantBuffer, DequantLinear
from localinfer.backends.torch.quant_kernels import KernelChooser
from localinfer.backends.torch.quant_layout import QuantMatrix, QuantSpec, parse_quant, quantize
from localinfer.backends.torch.quant_linear import QuantLinear
from localinfer.errors import UnsupportedModelError

AWKWARD_SHAPES = [(1, 1), (3, 7), (5, 33), (17, 130), (2, 257), (40, 64)]
SPECS = [QuantSpec(8, 0), QuantSpec(8, 32), QuantSpec(4, 32), QuantSpec(4, 64), QuantSpec(4, 128)]


def rand(shape: tuple[int, int], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * torch.rand(shape[0], 1, generator=g) * 3


def test_parse_quant() -> None:
    assert parse_quant(None) is None
    assert parse_quant("none") is None and parse_quant("bf16") is None
    assert parse_quant("int8") == QuantSpec(8, 0)
    assert parse_quant("int4") == QuantSpec(4, 64)
    assert parse_quant("INT4-g128") == QuantSpec(4, 128)
    assert parse_quant("int4_g32").label == "int4-g32"
    assert parse_quant("int8-g64") == QuantSpec(8, 64)
    assert QuantSpec(8, 0).for_table() == QuantSpec(8, 32)
    assert QuantSpec(4, 64).for_table() == QuantSpec(4, 64)
    for bad in ("int4-g48", "int8-g16", "Q4_K_M", "int3"):
        with pytest.raises(UnsupportedModelError):
            parse_quant(bad)


@pytest.mark.parametrize("shape", AWKWARD_SHAPES)
def test_int8_round_trip_within_half_a_step(shape: tuple[int, int]) -> None:
    w = rand(shape)
    m = quantize(w, QuantSpec(8, 0))
    assert m.qweight.dtype == torch.int8 and tuple(m.qweight.shape) == shape
    assert m.qweight.abs().max() <= 127
    err = (m.dequantize() - w).abs()
    assert torch.all(err <= m.scales[:, None] * 0.5 + 1e-6)
    # the largest magnitude of each row is exactly representable
    assert torch.allclose(m.dequantize().abs().amax(1), w.abs().amax(1), rtol=1e-6)


@pytest.mark.parametrize("shape", AWKWARD_SHAPES)
@pytest.mark.parametrize("group", [32, 64, 128])
def test_grouped_int8_round_trip_within_half_a_step(shape: tuple[int, int], group: int) -> None:
    w = rand(shape, seed=7)
    m = quantize(w, QuantSpec(8, group))
    groups = -(-shape[1] // group)
    assert tuple(m.qweight.shape) == (shape[0], groups * group)
    assert tuple(m.scales.shape) == (shape[0], groups) and m.scales.dtype == torch.float16
    step = m.scales.float().repeat_interleave(group, dim=1)[:, : shape[1]]
    assert torch.all((m.dequantize() - w).abs() <= step * 0.5 + 1e-6)
    # Q8_0 round trip: a table already on a per-32 int8 grid comes back exactly
    if group == 32:
        again = quantize(m.dequantize(), QuantSpec(8, 32))
        assert torch.equal(again.dequantize(), m.dequantize())


@pytest.mark.parametrize("shape", AWKWARD_SHAPES)
@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_round_trip_within_half_a_step(shape: tuple[int, int], group: int) -> None:
    w = rand(shape, seed=1)
    m = quantize(w, QuantSpec(4, group))
    out_f, in_f = shape
    groups = -(-in_f // group)
    assert m.qweight.dtype == torch.uint8
    assert tuple(m.qweight.shape) == (out_f, groups * group // 2)
    assert tuple(m.scales.shape) == (out_f, groups) and m.scales.dtype == torch.float16
    d = m.dequantize()
    assert tuple(d.shape) == shape
    step = m.scales.float().repeat_interleave(group, dim=1)[:, :in_f]
    # half a step, plus float16 rounding of the stored minimum
    assert torch.all((d - w).abs() <= step * 0.5 + w.abs().amax() * 2e-3 + 1e-6)


def test_int4_packed_layout_is_low_nibble_first() -> None:
    w = rand((6, 64), seed=2)
    m = quantize(w, QuantSpec(4, 32))
    q = m.qweight.to(torch.int64)
    codes = torch.stack([q & 15, q >> 4], dim=-1).view(6, 64)  # even column in the low nibble
    expect = codes.view(6, 2, 32).float() * m.scales.float()[..., None]
    expect = (expect + m.minimum.float()[..., None]).view(6, 64)
    assert torch.equal(m.dequantize(), expect)
    # codes span the whole 0..15 range of each group (min and max map to the ends)
    assert int(codes.max()) == 15 and int(codes.min()) == 0


def test_padding_columns_hold_code_zero() -> None:
    m = quantize(rand((4, 40), seed=3), QuantSpec(4, 32))
    q = m.qweight
    codes = torch.stack([q & 15, q >> 4], dim=-1).view(4, 64)
    assert torch.all(codes[:, 40:] == 0)


@pytest.mark.parametrize("spec", SPECS)
def test_constant_and_zero_rows(spec: QuantSpec) -> None:
    w = torch.zeros(3, 70)
    w[1] = 2.5
    w[2, 5] = -1.0
    d = quantize(w, spec).dequantize()
    assert torch.all(torch.isfinite(d))
    assert torch.allclose(d, w, atol=1e-3)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("shape", [(5, 33), (130, 70)])
def test_dequant_linear_matches_dense_product(
    spec: QuantSpec, shape: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A tiny block forces the blocked path (several row blocks through one shared buffer).
    m = quantize(rand(shape, seed=4), spec)
    monkeypatch.setattr(quant_dequant, "DEQUANT_BLOCK_ELEMENTS", 3 * m.padded_in)
    buf = DequantBuffer(torch.float32, torch.device("cpu"))
    ql = DequantLinear(m, torch.float32, buf)
    assert ql.block_rows == 3
    x = rand((4, shape[1]), seed=5)
    bias = rand((1, shape[0]), seed=6)[0]
    expect = F.linear(x, m.dequantize(), bias)
    assert torch.allclose(ql(x, bias), expect, atol=1e-5, rtol=1e-5)
    ids = torch.tensor([0, shape[0] - 1, 2, 2])
    assert torch.equal(ql[ids], m.dequantize()[ids])


def test_bf16_compute_dtype() -> None:
    m = quantize(rand((16, 64)), QuantSpec(4, 32))
    ql = DequantLinear(m, torch.bfloat16, DequantBuffer(torch.bfloat16, torch.device("cpu")))
    x = rand((2, 64)).bfloat16()
    y = ql(x)
    assert y.dtype == torch.bfloat16
    ref = F.linear(x.float(), m.dequantize())
    assert torch.allclose(y.float(), ref, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("spec", SPECS)
def test_arrays_round_trip_and_validation(spec: QuantSpec) -> None:
    m = quantize(rand((9, 100)), spec)
    arrays = m.to_arrays()
    assert all(isinstance(a, np.ndarray) for a in arrays.values())
    back = QuantMatrix.from_arrays(arrays)
    assert torch.equal(back.dequantize(), m.dequantize())
    assert back.nbytes() == m.nbytes()
    broken = dict(arrays, qweight=arrays["qweight"][:, :-1])
    with pytest.raises(ValueError):
        QuantMatrix.from_arrays(broken)


def test_nbytes_counts_bits_per_weight() -> None:
    m8 = quantize(rand((64, 576)), QuantSpec(8, 0))
    assert m8.nbytes() == 64 * 576 + 64 * 4
    m4 = quantize(rand((64, 576)), QuantSpec(4, 64))
    assert m4.nbytes() == 64 * 576 // 2 + 2 * 2 * 64 * 9  # 4.5 bits per weight


def test_chooser_defaults_to_weight_only_dequant_on_cpu() -> None:
    ch = KernelChooser(8, torch.float32, torch.device("cpu"))
    ql = ch.build(quantize(rand((32, 64)), QuantSpec(8, 0)))
    assert ql.kernel == "dequant"
    assert ch.kernels_used == {"dequant": 1}


@pytest.mark.skipif(not quant_kernels.kernel_available("fbgemm"), reason="no fbgemm")
def test_fbgemm_kernel_agrees_on_random_input() -> None:
    ch = KernelChooser(8, torch.float32, torch.device("cpu"), force="fbgemm")
    m = quantize(rand((96, 128)), QuantSpec(8, 0))
    ql = ch.build(m)
    assert ql.kernel == "fbgemm"
    x = rand((3, 128), seed=9)
    ref = F.linear(x, m.dequantize())
    assert ((ql(x) - ref).norm() / ref.norm()) < 0.05


def test_chooser_falls_back_when_a_fast_kernel_is_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    class Wrong(QuantLinear):
        kernel = "wrong"

        def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
            return torch.zeros(x.shape[0], self.out_features)

    monkeypatch.setattr(quant_kernels, "kernel_available", lambda name: True)
    monkeypatch.setattr(quant_kernels, "_make_fast", lambda name, m, dtype: Wrong(m, dtype))
    ch = KernelChooser(8, torch.float32, torch.device("cpu"), force="wrong")
    ch.candidates = ["wrong", "dequant"]
    ql = ch.build(quantize(rand((8, 16)), QuantSpec(8, 0)))
    assert ql.kernel == "dequant"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("spec", [QuantSpec(8, 0), QuantSpec(4, 64), QuantSpec(4, 128)])
def test_cuda_kernels_match_dequant(spec: QuantSpec) -> None:
    dev = torch.device("cuda")
    ch = KernelChooser(spec.bits, torch.bfloat16, dev)
    m = quantize(rand((256, 512)), spec)
    ql = ch.build(m)
    x = rand((4, 512)).to(dev, torch.bfloat16)
    ref = F.linear(x.float(), m.to(dev).dequantize())
    assert ((ql(x).float() - ref).norm() / ref.norm()) < 0.02
