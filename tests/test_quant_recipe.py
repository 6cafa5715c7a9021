"""The torch runner's quantization recipes: which matrix gets which bits (the layout), the runner
holding exactly that, and the budget predicting its bytes exactly."""

from __future__ import annotations

import pytest

from localinfer.backends.base import RunnerConfig
from localinfer.backends.torch.quant_layout import QuantSpec
from localinfer.backends.torch.quant_recipe import parse_recipe, role_of
from localinfer.backends.torch.runner import TorchRunner
from localinfer.facts.arch import ArchSpec
from localinfer.facts.quant import MatrixQuant, torch_quant_bytes, torch_recipe_layout
from localinfer.loading.model_config import ModelConfig
from tests import tiny

pytestmark = pytest.mark.usefixtures("private_cache", "one_torch_thread")

Q8 = QuantSpec(8, 32)
Q4 = QuantSpec(4, 32)


def test_mixed_int4_layout() -> None:
    tied, untied = parse_recipe("int4", tied=True), parse_recipe("int4", tied=False)
    assert tied is not None and untied is not None
    assert tied.label == untied.label == "int4"
    assert tied.layout() == {
        "embed": Q8, "head": Q8, "qkv": Q4, "o": Q4, "gate_up": Q4, "down": Q4,
    }  # fmt: skip
    # an untied table only feeds the first layer: 4 bits like the layers
    assert untied.layout() == {**tied.layout(), "embed": Q4}


@pytest.mark.parametrize(
    "quant, table, layers",
    [
        ("int8", QuantSpec(8, 32), QuantSpec(8, 0)),
        ("int8-g64", QuantSpec(8, 64), QuantSpec(8, 64)),
        ("int4-g64", QuantSpec(4, 64), QuantSpec(4, 64)),
        ("INT4_g128", QuantSpec(4, 128), QuantSpec(4, 128)),
    ],
)
def test_uniform_layouts(quant: str, table: QuantSpec, layers: QuantSpec) -> None:
    recipe = parse_recipe(quant)
    assert recipe is not None and recipe.label == layers.label
    layout = recipe.layout()
    assert layout.pop("embed") == table
    assert set(layout.values()) == {layers}


def test_float_names_and_unknowns() -> None:
    assert parse_recipe(None) is None and parse_recipe("fp32") is None
    assert torch_recipe_layout("Q4_K_M") is None and torch_recipe_layout("int4-g48") is None
    with pytest.raises(ValueError):
        role_of("model.layers.0.mystery")


def test_roles_of_the_loaders_matrix_names() -> None:
    assert role_of("model.embed_tokens") == "embed"
    assert role_of("lm_head") == "head"
    assert role_of("model.layers.3.self_attn.qkv") == "qkv"
    assert role_of("model.layers.3.self_attn.o_proj") == "o"
    assert role_of("model.layers.3.mlp.gate_up") == "gate_up"
    assert role_of("model.layers.3.mlp.down_proj") == "down"


def test_matrix_bytes() -> None:
    assert MatrixQuant(8, 0).nbytes(10, 100) == 10 * 100 + 10 * 4
    assert MatrixQuant(8, 32).nbytes(10, 100) == 10 * 128 + 10 * 4 * 2  # padded to 4 groups
    assert MatrixQuant(4, 64).nbytes(10, 100) == 10 * 64 + 10 * 2 * 4


def arch_of(config: ModelConfig) -> ArchSpec:
    return ArchSpec(
        arch=config.arch, n_layers=config.n_layers, hidden_size=config.hidden_size,
        n_heads=config.n_heads, n_kv_heads=config.n_kv_heads, head_dim=config.head_dim,
        ffn_size=config.ffn_size, vocab_size=config.vocab_size, max_ctx=config.max_ctx,
        tied_embeddings=config.tied_embeddings, attention_bias=config.attention_bias,
        qk_norm=config.qk_norm,
    )  # fmt: skip


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
@pytest.mark.parametrize("quant", ["int4", "int8", "int4-g64", "int4-g128", "int8-g32"])
def test_budget_bytes_are_the_runners(arch: str, quant: str) -> None:
    """Tied (llama) and untied heads, q|k|v biases (qwen2), q/k norms (qwen3)."""
    model = tiny.tiny_model(arch, format="gguf")
    runner = TorchRunner(model, RunnerConfig(slots=1, max_ctx=32, quant=quant))
    assert runner.memory().weights == torch_quant_bytes(arch_of(model.config), quant)


def test_budget_of_the_embedded_model_uses_the_recipe() -> None:
    from localinfer.backend_budget import compute_budget
    from localinfer.budget.compute import BudgetRequest
    from localinfer.loading.embedded import embedded_model_path

    path = str(embedded_model_path())
    got = {
        q: compute_budget(BudgetRequest(path, quant=q, backend="torch", device="1TiB"))
        for q in ("int4", "int4-g64", "int8")
    }
    # SmolLM2-135M: 30 layers, hidden 576, 9/3 heads of 64, ffn 1536, 49152 tokens, tied.
    h, f, v, n = 576, 1536, 49152, 30
    q4 = MatrixQuant(4, 32)
    layer = q4.nbytes(576 + 2 * 192, h) + q4.nbytes(h, 576) + q4.nbytes(2 * f, h)
    layer += q4.nbytes(h, f) + 4 * 2 * h
    assert got["int4"].weights_bytes == n * layer + MatrixQuant(8, 32).nbytes(v, h) + 4 * h
    assert got["int4"].weights_bytes > got["int4-g64"].weights_bytes
    assert "recipe" in got["int4"].weights_source
