"""The budget's facts read from model files: exact weights from GGUF and safetensors headers,
sliding-window layers from a GGUF header, and one-line errors for truncated files and impossible
header or config.json numbers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from gguf_writer import finish_gguf
from test_resolve import tiny_hf_repo

from localinfer.backend_budget import compute_budget
from localinfer.budget import BudgetRequest, kv_cache_bytes
from localinfer.budget.file_headers import read_gguf_header
from localinfer.cli import main
from localinfer.errors import ModelFileError
from localinfer.facts.arch import ArchSpec
from localinfer.facts.kv_dtype import KV_DTYPES
from localinfer.facts.quant import bytes_for_params
from localinfer.loading.embedded import embedded_model_path
from tests.saved_configs import CONFIGS, arch_of

F16 = KV_DTYPES["f16"]

# --- exact weights from file headers -----------------------------------------------------------


def test_embedded_gguf_weights_are_the_sum_of_its_tensors() -> None:
    from gguf import GGML_QUANT_SIZES, GGUFReader

    # Independent reference: gguf's own reader, sizes recomputed from type + element count.
    reader = GGUFReader(embedded_model_path())
    expected = 0
    for tensor in reader.tensors:
        block, block_bytes = GGML_QUANT_SIZES[tensor.tensor_type]
        expected += int(tensor.n_elements) // block * block_bytes
    report = compute_budget(BudgetRequest("smollm2-135m", device="8GiB"))
    assert report.weights_bytes == expected == 96_576_768
    assert report.weights_source == "GGUF header"
    assert report.params == 134_515_008 and report.quant == "Q4_1"
    # The data region holds those bytes plus alignment padding, never less.
    assert expected <= embedded_model_path().stat().st_size


def write_tiny_gemma3_gguf(path: Path, pattern: list[bool] | None = None) -> None:
    """A 12-layer Gemma 3 shaped GGUF (window 32) written by gguf's writer: an f32 embedding and
    an f16 query matrix in every layer (the budget checks block_count against the blk.N tensors);
    `pattern` stores a per-layer sliding flag the way newer llama.cpp converters do."""
    import numpy as np
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "gemma3")
    writer.add_block_count(12)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(1)
    writer.add_key_length(16)
    writer.add_value_length(16)
    writer.add_feed_forward_length(128)
    writer.add_context_length(1024)
    writer.add_sliding_window(32)
    writer.add_token_list([f"t{i}" for i in range(100)])
    if pattern is not None:
        writer.add_array("gemma3.attention.sliding_window_pattern", pattern)
    writer.add_tensor("token_embd.weight", np.zeros((100, 64), np.float32))
    for layer in range(12):
        writer.add_tensor(f"blk.{layer}.attn_q.weight", np.zeros((64, 64), np.float16))
    finish_gguf(writer)


def test_gguf_header_of_a_sliding_window_model(tmp_path: Path) -> None:
    path = tmp_path / "tiny-gemma3.gguf"
    write_tiny_gemma3_gguf(path)
    r = compute_budget(BudgetRequest(str(path), ctx=1024, device="1GiB"))
    assert r.weights_bytes == 100 * 64 * 4 + 12 * 64 * 64 * 2  # f32 embedding + f16 matrices
    assert r.arch == "gemma3" and r.model_max_ctx == 1024
    # llama.cpp's Gemma 3 pattern: layers 5 and 11 global, the other 10 keep a 32-token window.
    per_layer_token = 2 * 1 * 16 * 2
    arch = _header_arch(path)
    assert [i for i in range(12) if not arch.is_sliding(i)] == [5, 11]
    assert kv_cache_bytes(arch, 1024, 1, F16) == (2 * 1024 + 10 * 32) * per_layer_token
    # The llama.cpp runner keeps every cell on the sliding layers too (swa_full), and the
    # budget costs what it holds.
    assert r.kv_cache_bytes == 12 * 1024 * per_layer_token


def test_gguf_per_layer_sliding_flags(tmp_path: Path) -> None:
    path = tmp_path / "tiny-alternating.gguf"
    write_tiny_gemma3_gguf(path, pattern=[i % 2 == 0 for i in range(12)])
    per_layer_token = 2 * 1 * 16 * 2
    arch = _header_arch(path)
    assert kv_cache_bytes(arch, 1024, 1, F16) == (6 * 1024 + 6 * 32) * per_layer_token


def _header_arch(path: Path) -> ArchSpec:
    arch = read_gguf_header(path).arch
    assert arch is not None
    return arch


def test_truncated_gguf_is_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "cut.gguf"
    write_tiny_gemma3_gguf(path)
    path.write_bytes(path.read_bytes()[:200])
    assert main(["budget", str(path), "--device", "1GiB"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("localinfer: error: ") and err.count("\n") == 1 and "cut.gguf" in err


def test_asking_another_quant_of_a_gguf_uses_its_exact_param_count() -> None:
    report = compute_budget(BudgetRequest("smollm2-135m", quant="Q8_0", device="8GiB"))
    assert report.weights_bytes == 134_515_008 * 17 // 16  # 8.5 bits
    assert "params" in report.weights_source


def qwen3_tensors(arch: ArchSpec) -> dict[str, tuple[str, list[int]]]:
    """The tensor list of a Qwen3 checkpoint in Hugging Face names (tied: no lm_head)."""
    h, q, kv, ffn = (
        arch.hidden_size,
        arch.n_heads * arch.head_dim,
        arch.n_kv_heads * arch.head_dim,
        arch.ffn_size,
    )
    out = {
        "model.embed_tokens.weight": ("BF16", [arch.vocab_size, h]),
        "model.norm.weight": ("BF16", [h]),
    }
    for i in range(arch.n_layers):
        p = f"model.layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": ("BF16", [q, h]),
            p + "self_attn.k_proj.weight": ("BF16", [kv, h]),
            p + "self_attn.v_proj.weight": ("BF16", [kv, h]),
            p + "self_attn.o_proj.weight": ("BF16", [h, q]),
            p + "self_attn.q_norm.weight": ("BF16", [arch.head_dim]),
            p + "self_attn.k_norm.weight": ("BF16", [arch.head_dim]),
            p + "mlp.gate_proj.weight": ("BF16", [ffn, h]),
            p + "mlp.up_proj.weight": ("BF16", [ffn, h]),
            p + "mlp.down_proj.weight": ("BF16", [h, ffn]),
            p + "input_layernorm.weight": ("BF16", [h]),
            p + "post_attention_layernorm.weight": ("BF16", [h]),
        }
    return out


@pytest.fixture
def qwen3_dir(tmp_path: Path) -> Path:
    from test_resolve import write_safetensors

    folder = tmp_path / "Qwen3-0.6B"
    folder.mkdir()
    shutil.copy(CONFIGS / "qwen3-0.6b.json", folder / "config.json")
    write_safetensors(folder / "model.safetensors", qwen3_tensors(arch_of("qwen3-0.6b.json")))
    return folder


def test_safetensors_headers_give_exact_weights(qwen3_dir: Path) -> None:
    report = compute_budget(BudgetRequest(str(qwen3_dir), ctx=40960, device="64GiB"))
    assert report.model_kind == "hf_dir" and report.quant == "bf16"
    assert report.weights_source == "safetensors headers"
    assert report.params == 596_049_920
    assert report.weights_bytes == 2 * 596_049_920
    assert report.kv_cache_bytes == 4_697_620_480
    quantized = compute_budget(BudgetRequest(str(qwen3_dir), quant="int4", device="64GiB"))
    assert quantized.weights_bytes == bytes_for_params(596_049_920, "int4")


def test_truncated_safetensors_is_a_model_file_error(qwen3_dir: Path) -> None:
    weights = qwen3_dir / "model.safetensors"
    with weights.open("r+b") as fh:
        fh.truncate(weights.stat().st_size - 1)
    with pytest.raises(ModelFileError, match="truncated"):
        compute_budget(BudgetRequest(str(qwen3_dir), device="64GiB"))


def write_gguf_header(path: Path, **numbers: int) -> Path:
    """A small llama-shaped GGUF (two layers, one tensor each) whose header numbers can be set
    wrong."""
    import numpy as np
    from gguf import GGUFWriter

    values = {"heads": 4, "kv_heads": 2, "context": 1024, **numbers}
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_embedding_length(64)
    writer.add_head_count(values["heads"])
    writer.add_head_count_kv(values["kv_heads"])
    writer.add_feed_forward_length(128)
    writer.add_context_length(values["context"])
    writer.add_token_list([f"t{i}" for i in range(100)])
    writer.add_tensor("token_embd.weight", np.zeros((100, 64), np.float32))
    for layer in range(2):
        writer.add_tensor(f"blk.{layer}.attn_norm.weight", np.ones(64, np.float32))
    finish_gguf(writer)
    return path


@pytest.mark.parametrize(
    ("numbers", "words"),
    [({"context": 0}, "context"), ({"kv_heads": 3}, "not a multiple of n_kv_heads")],
)
def test_impossible_gguf_header_numbers_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], numbers: dict[str, int], words: str
) -> None:
    path = write_gguf_header(tmp_path / "bad.gguf", **numbers)
    assert main(["budget", str(path), "--device", "1GiB"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("localinfer: error: ") and err.count("\n") == 1, err
    assert words in err and "bad.gguf" in err and "pydantic" not in err


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"max_position_embeddings": 0}, "max_ctx: Input should be greater than 0"),
        ({"num_attention_heads": 0}, "n_heads: Input should be greater than 0"),
        ({"num_attention_heads": "4"}, "must be whole numbers"),
        ({"num_key_value_heads": 3}, "not a multiple of n_kv_heads"),
    ],
)
def test_impossible_config_json_values_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, object], words: str
) -> None:
    snapshot = tiny_hf_repo(tmp_path / "hf", "someone/tiny-llama")
    config_path = snapshot / "config.json"
    config = json.loads(config_path.read_text())
    config_path.unlink()  # a link into blobs/: write a file of its own
    config_path.write_text(json.dumps({**config, **change}))
    assert main(["budget", str(snapshot), "--device", "1GiB"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("localinfer: error: ") and err.count("\n") == 1, err
    assert words in err
