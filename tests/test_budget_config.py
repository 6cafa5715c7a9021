"""A config.json alone is enough for a budget: the parameter count worked out from the
architecture (dense, GQA, MLA, MoE with shared experts, tied and untied embeddings, sliding-window
layers) against the published safetensors totals of real checkpoints, and the budget of a folder
holding only a config.json (or of the config.json itself)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_budget_files import qwen3_tensors
from test_resolve import write_safetensors

from localinfer.backend_budget import compute_budget
from localinfer.budget import BudgetRequest, kv_cache_bytes
from localinfer.cli import main
from localinfer.errors import UnsupportedModelError
from localinfer.facts.arch import ArchSpec, count_params
from localinfer.facts.kv_dtype import kv_dtype
from localinfer.facts.quant import bytes_for_params
from tests.saved_configs import CONFIGS, arch_of

# metadata.total_size of each checkpoint's model.safetensors.index.json (bytes, all tensors
# BF16: 2 bytes a parameter), or the parameter count Hugging Face reports for a single-file
# checkpoint. This machine has no Hub access: each figure was found quoted in public code
# (code search) and agrees with the model card's rounded count; the sources are listed in
# tests/fixtures/configs/README.md.
PUBLISHED_SAFETENSORS_BYTES = {
    "llama-3.1-8b-instruct.json": 16_060_522_496,  # dense, GQA, untied
    "mistral-7b-instruct-v0.3.json": 14_496_047_104,  # dense, GQA, no sliding window
    "qwen2.5-7b-instruct.json": 15_231_233_024,  # q/k/v bias the config does not name
    "qwen3-8b.json": 16_381_470_720,  # explicit head_dim, q/k norms
    "qwen3-30b-a3b.json": 61_064_245_248,  # MoE, 128 experts
    "mixtral-8x7b-v0.1.json": 93_405_585_408,  # MoE, 8 experts, no shared ones
    "qwen1.5-moe-a2.7b.json": 28_631_568_384,  # MoE + a gated shared expert of its own width
    "deepseek-v2-lite.json": 31_412_968_448,  # MLA + MoE with 2 shared experts, 1 dense layer
    "gemma-3-270m-it.json": 2 * 268_098_176,  # tied, sliding-window layers, 4 norms a layer
}


@pytest.mark.parametrize("fixture", sorted(PUBLISHED_SAFETENSORS_BYTES))
def test_config_parameter_count_matches_the_published_safetensors_total(fixture: str) -> None:
    counted = 2 * count_params(arch_of(fixture))
    published = PUBLISHED_SAFETENSORS_BYTES[fixture]
    assert abs(counted - published) <= 0.005 * published  # the bound; all are exact:
    assert counted == published


def test_deepseek_v3_counts_its_multi_token_prediction_module() -> None:
    # The Hub's safetensors count for deepseek-ai/DeepSeek-V3 is 684,531,386,000 parameters:
    # BF16 3,918,786,560 + F8_E4M3 680,571,043,840 + F32 41,555,600 ("685B = 671B of the main
    # model + 14B of the MTP module", its README). The F32 ones are the 256 router biases of each
    # of the 59 MoE layers (the MTP module's included) and the FP8 weights' 128x128 block scales,
    # which are quantization data, not weights: the count has the biases, not the scales.
    arch = arch_of("deepseek-v3.json")
    assert arch.n_mtp_layers == 1 and arch.n_layers == 61 and arch.router_bias
    published = 684_531_386_000
    counted = count_params(arch)
    assert abs(counted - published) <= 0.005 * published  # the bound
    assert counted == 3_918_786_560 + 680_571_043_840 + 59 * 256
    assert counted + _fp8_block_scales(arch) == published
    # Without the MTP module: the main model's 671B, 2% under the published total.
    main_model = count_params(arch.model_copy(update={"n_mtp_layers": 0}))
    assert published - main_model > 0.019 * published
    assert round(main_model / 1e9) == 671


def _fp8_block_scales(arch: ArchSpec) -> int:
    """The F32 scale of every 128x128 block of each FP8 matrix (every projection of attention and
    MLP, the MTP module's included; embeddings, heads, routers and eh_proj stay BF16)."""

    def blocks(rows: int, cols: int) -> int:
        return -(-rows // 128) * -(-cols // 128)

    h, heads = arch.hidden_size, arch.n_heads
    assert arch.q_lora_rank and arch.kv_lora_rank and arch.qk_rope_head_dim and arch.moe_ffn_size
    assert arch.qk_nope_head_dim and arch.v_head_dim
    attention = (
        blocks(arch.q_lora_rank, h)
        + blocks(heads * arch.head_dim, arch.q_lora_rank)
        + blocks(arch.kv_lora_rank + arch.qk_rope_head_dim, h)
        + blocks(heads * (arch.qk_nope_head_dim + arch.v_head_dim), arch.kv_lora_rank)
        + blocks(h, heads * arch.v_head_dim)
    )
    dense = 2 * blocks(arch.ffn_size, h) + blocks(h, arch.ffn_size)
    expert = 2 * blocks(arch.moe_ffn_size, h) + blocks(h, arch.moe_ffn_size)
    layers = arch.n_layers + arch.n_mtp_layers
    moe_layers = layers - arch.first_dense_layers
    n_experts = arch.n_experts + arch.n_shared_experts
    return layers * attention + arch.first_dense_layers * dense + moe_layers * n_experts * expert


def test_a_checkpoint_storing_its_tied_head_twice() -> None:
    # Qwen3-0.6B ties its embeddings, yet its model.safetensors stores lm_head.weight as well:
    # Hugging Face reports 751,632,384 BF16 parameters (1,503,300,328 bytes with the header).
    # Loading drops the copy, so the budget counts the embedding once.
    arch = arch_of("qwen3-0.6b.json")
    assert arch.tied_embeddings
    assert count_params(arch) + arch.vocab_size * arch.hidden_size == 751_632_384
    assert count_params(arch) == 596_049_920


def test_multimodal_config_counts_the_language_model() -> None:
    # gemma-3-4b-it: the language model under text_config; the vision tower (loading leaves it
    # out) is not counted. 3,880,099,328 is the text model with a 262,144-row embedding; the
    # config's vocab is 262,208.
    assert count_params(arch_of("gemma-3-4b-it.json")) == 3_880_099_328 + 64 * 2560


def config_folder(tmp_path: Path, fixture: str) -> Path:
    folder = tmp_path / fixture.removesuffix(".json")
    folder.mkdir()
    shutil.copy(CONFIGS / fixture, folder / "config.json")
    return folder


@pytest.mark.parametrize("fixture", ["mixtral-8x7b-v0.1.json", "deepseek-v2-lite.json"])
def test_budget_of_a_folder_with_only_a_config(tmp_path: Path, fixture: str) -> None:
    folder = config_folder(tmp_path, fixture)
    arch = arch_of(fixture)
    for spec in (folder, folder / "config.json"):
        report = compute_budget(BudgetRequest(str(spec), ctx=8192, device="512GiB"))
        assert report.model_kind == "hf_config" and report.model_path is None
        assert report.params == count_params(arch) and report.quant == "bf16"
        assert report.weights_bytes == bytes_for_params(count_params(arch), "bf16")
        assert "config.json" in report.weights_source
        assert report.kv_cache_bytes == kv_cache_bytes(arch, 8192, 1, kv_dtype("f16"))
    int4 = compute_budget(BudgetRequest(str(folder), quant="Q4_K_M", device="512GiB"))
    assert int4.weights_bytes == bytes_for_params(count_params(arch), "Q4_K_M")


def test_budget_of_deepseek_v3_from_its_config(tmp_path: Path) -> None:
    # An FP8 checkpoint (quantization_config fp8): a byte a weight; the KV cache counts the 61
    # layers that attend over the context, not the MTP module.
    folder = config_folder(tmp_path, "deepseek-v3.json")
    arch = arch_of("deepseek-v3.json")
    report = compute_budget(BudgetRequest(str(folder), ctx=8192, device="1024GiB"))
    assert report.params == count_params(arch) and report.quant == "int8"
    assert report.kv_cache_bytes == kv_cache_bytes(arch, 8192, 1, kv_dtype("f16"))
    one_layer_less = arch.model_copy(update={"n_layers": 60})
    assert report.kv_cache_bytes > kv_cache_bytes(one_layer_less, 8192, 1, kv_dtype("f16"))


def test_config_budget_equals_the_safetensors_headers(tmp_path: Path) -> None:
    # The same model, once as a config alone and once with its (sparse) weights, the tied head
    # stored twice as Qwen3-0.6B's checkpoint does: every figure agrees to the byte.
    folder = config_folder(tmp_path, "qwen3-0.6b.json")
    alone = compute_budget(BudgetRequest(str(folder), ctx=4096, device="64GiB"))
    tensors = qwen3_tensors(arch_of("qwen3-0.6b.json"))
    arch = arch_of("qwen3-0.6b.json")
    tensors["lm_head.weight"] = ("BF16", [arch.vocab_size, arch.hidden_size])
    write_safetensors(folder / "model.safetensors", tensors)
    headers = compute_budget(BudgetRequest(str(folder), ctx=4096, device="64GiB"))
    assert headers.weights_source == "safetensors headers"
    for field in ("params", "quant", "weights_bytes", "kv_cache_bytes", "total_bytes"):
        assert getattr(alone, field) == getattr(headers, field), field
    assert headers.weights_bytes == 2 * 596_049_920


def test_quantized_and_float32_checkpoints(tmp_path: Path) -> None:
    config = json.loads((CONFIGS / "qwen2.5-7b-instruct.json").read_text())
    params = count_params(arch_of("qwen2.5-7b-instruct.json"))
    gptq = {**config, "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}
    (tmp_path / "config.json").write_text(json.dumps(gptq))
    report = compute_budget(BudgetRequest(str(tmp_path), device="64GiB"))
    assert report.quant == "int4-g128"
    assert report.weights_bytes == bytes_for_params(params, "int4-g128")
    (tmp_path / "config.json").write_text(json.dumps({**config, "torch_dtype": "float32"}))
    assert compute_budget(BudgetRequest(str(tmp_path), device="64GiB")).quant == "f32"


def test_an_architecture_the_budget_does_not_count(tmp_path: Path) -> None:
    config = json.loads((CONFIGS / "llama-3.1-8b-instruct.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "phi"}))
    with pytest.raises(UnsupportedModelError, match="not of model_type 'phi'"):
        compute_budget(BudgetRequest(str(tmp_path), device="64GiB"))


def test_missing_config_fields_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = json.loads((CONFIGS / "qwen3-8b.json").read_text())
    del config["hidden_size"], config["vocab_size"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["budget", str(tmp_path / "config.json"), "--device", "8GiB"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("localinfer: error: ") and err.count("\n") == 1
    assert "config.json lacks hidden_size, vocab_size" in err


def test_a_config_only_model_does_not_run(tmp_path: Path) -> None:
    from localinfer.errors import ModelFileError
    from localinfer.session import open_model

    folder = config_folder(tmp_path, "qwen3-8b.json")
    with pytest.raises(ModelFileError, match="holds only a config.json"):
        open_model(str(folder))
