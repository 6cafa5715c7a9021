"""The MLX runner's quantization recipes: the min/max quantizer in MLX's packed layout, which
matrix gets which bits (the role table shared with torch in facts/quant.py), and the budget
predicting the runner's bytes exactly."""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from localinfer.backends.mlx.quant_affine import affine_quantize  # noqa: E402
from localinfer.backends.mlx.quant_spec import QuantSpec, parse_quant  # noqa: E402
from localinfer.errors import UnsupportedModelError  # noqa: E402
from localinfer.facts.quant import (  # noqa: E402
    MIXED_INT4,
    MatrixQuant,
    mlx_quant_bytes,
    mlx_recipe_layout,
    torch_recipe_layout,
)
from tests.mlx_helpers import make_runner  # noqa: E402
from tests.test_quant_recipe import arch_of  # noqa: E402
from tests.tiny import tiny_model  # noqa: E402

pytestmark = [pytest.mark.mlx, pytest.mark.usefixtures("private_cache")]

Q8, Q4 = MatrixQuant(8, 32), MatrixQuant(4, 32)


def _dequantized(w: mx.array, bits: int, group: int) -> np.ndarray:
    q, s, b = affine_quantize(w, bits, group, mx.float16)
    s, b = s.astype(mx.float32), b.astype(mx.float32)  # a float16 result would round
    return np.array(mx.dequantize(q, s, b, group_size=group, bits=bits))


@pytest.mark.parametrize("bits, group", [(4, 32), (4, 64), (8, 32), (8, 128)])
def test_values_on_a_min_max_grid_come_back_exactly(bits, group):
    """A matrix already on a min/max grid (a dequantized Q4_1 file) keeps its values: the codes
    and the packing are what mx.dequantize reads."""
    rng = np.random.default_rng(0)
    levels = (1 << bits) - 1
    codes = rng.integers(0, levels + 1, size=(6, 4, group))
    codes[..., 0], codes[..., 1] = 0, levels  # every group spans the whole grid
    scale = rng.uniform(0.01, 0.1, size=(6, 4, 1)).astype(np.float16).astype(np.float32)
    low = rng.uniform(-1, 0, size=(6, 4, 1)).astype(np.float16).astype(np.float32)
    w = (codes * scale + low).reshape(6, 4 * group).astype(np.float32)
    np.testing.assert_allclose(_dequantized(mx.array(w), bits, group), w, rtol=0, atol=1e-6)


def test_min_max_beats_mx_quantize_on_a_quantized_file():
    """mx.quantize re-grids a matrix that already sits on a grid; ours does not, and it is no
    worse on plain Gaussian weights."""
    rng = np.random.default_rng(1)
    gauss = rng.standard_normal((64, 256)).astype(np.float32)
    on_grid = _dequantized(mx.array(gauss), 4, 32)

    def err(w: np.ndarray, ours: bool) -> float:
        if ours:
            got = _dequantized(mx.array(w), 4, 32)
        else:
            q, s, b = mx.quantize(mx.array(w), group_size=32, bits=4)
            s, b = s.astype(mx.float16).astype(mx.float32), b.astype(mx.float16).astype(mx.float32)
            got = np.array(mx.dequantize(q, s, b, group_size=32, bits=4))
        return float(np.sqrt(((got - w) ** 2).mean() / (w**2).mean()))

    assert err(on_grid, ours=True) < 1e-3 < 0.05 < err(on_grid, ours=False)
    assert err(gauss, ours=True) <= err(gauss, ours=False)


def test_a_width_that_is_not_whole_groups_is_refused():
    with pytest.raises(ValueError, match="groups"):
        affine_quantize(mx.zeros((2, 48)), 4, 32, mx.float16)


def test_int4_is_the_recipe_torch_uses():
    spec = parse_quant("int4", "F16")
    assert spec == QuantSpec("affine", 4, 32, mixed=True) and spec.label == "int4"
    for tied in (True, False):
        assert spec.layout(tied) == torch_recipe_layout("int4", tied)
        assert mlx_recipe_layout("int4", tied) == torch_recipe_layout("int4", tied)
    assert spec.layout(tied=True) == {**MIXED_INT4, "embed": Q8}
    assert spec.layout(tied=False) == {
        "embed": Q4, "head": Q8, "qkv": Q4, "o": Q4, "gate_up": Q4, "down": Q4,
    }  # fmt: skip


@pytest.mark.parametrize(
    "quant, layers",
    [
        ("int8", MatrixQuant(8, 64)),
        ("int4-g64", MatrixQuant(4, 64)),
        ("mlx-4bit", MatrixQuant(4, 64)),
        ("int8-g128", MatrixQuant(8, 128)),
        ("Q4_0", MatrixQuant(4, 32)),
        ("Q8_0", MatrixQuant(8, 32)),
    ],
)
def test_uniform_names(quant, layers):
    spec = parse_quant(quant, "F16")
    assert not spec.mixed and set(spec.layout(tied=True).values()) == {layers}
    assert set((mlx_recipe_layout(quant) or {}).values()) == {layers}


def test_unknown_names():
    assert mlx_recipe_layout("int4-g48") is None and mlx_recipe_layout("Q4_K_M") is None
    with pytest.raises(UnsupportedModelError, match="group size"):
        parse_quant("int4-g48", "F16")
    with pytest.raises(UnsupportedModelError, match="cannot quantize"):
        parse_quant("Q5_K", "F16")


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # tied, untied
def test_runner_holds_each_role_in_its_layout(arch):
    model = tiny_model(arch)
    w = make_runner(model, quant="int4", slots=1, max_ctx=32)._model.weights
    layer = w.layers[0]
    for m in [*layer.qkv.parts, layer.o, *layer.gate_up.parts, layer.down]:
        assert (m.bits, m.group_size) == (4, 32)
    assert (w.lm_head.bits, w.lm_head.group_size) == (8, 32)
    tied = model.config.tied_embeddings
    assert (w.lm_head is w.embed) == tied
    assert (w.embed.bits, w.embed.group_size) == ((8, 32) if tied else (4, 32))


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
@pytest.mark.parametrize("quant", ["int4", "int8", "int4-g64", "int4-g128", "int8-g32", "Q4_0"])
def test_budget_bytes_are_the_runners(arch, quant):
    """Tied (llama, qwen3) and untied heads, q|k|v biases (qwen2), q/k norms (qwen3); group 128
    is wider than the tiny model's rows, which then stay float32."""
    model = tiny_model(arch)
    runner = make_runner(model, quant=quant, slots=1, max_ctx=32)
    # The arrays' own bytes: memory() reads MLX's allocator, which may hand a small array a
    # larger cached buffer left by an earlier test (and count all of it).
    assert runner._model.weights.nbytes() == mlx_quant_bytes(arch_of(model.config), quant)


def test_budget_of_the_embedded_model_uses_the_recipe():
    from localinfer.backend_budget import compute_budget
    from localinfer.budget.compute import BudgetRequest
    from localinfer.loading.embedded import embedded_model_path

    path = str(embedded_model_path())
    got = {
        q: compute_budget(BudgetRequest(path, quant=q, backend="mlx", device="1TiB"))
        for q in ("int4", "int4-g64")
    }
    # SmolLM2-135M: 30 layers, hidden 576, 9/3 heads of 64, ffn 1536, 49152 tokens, tied.
    h, f, v, n = 576, 1536, 49152, 30

    def mat(bits: int, group: int, rows: int, cols: int) -> int:
        return rows * cols * bits // 8 + rows * cols // group * 4

    layer = mat(4, 32, 576 + 2 * 192, h) + mat(4, 32, h, 576) + mat(4, 32, 2 * f, h)
    layer += mat(4, 32, h, f) + 4 * 2 * h
    assert got["int4"].weights_bytes == n * layer + mat(8, 32, v, h) + 4 * h
    assert got["int4"].weights_bytes > got["int4-g64"].weights_bytes
    assert "mlx int4 recipe" in got["int4"].weights_source
