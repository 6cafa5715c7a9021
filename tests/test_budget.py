"""Budget arithmetic against hand calculations for real public models (saved config.json files),
exact GGUF-header weights of the embedded model, device sizes, suggestions, and the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from gguf_writer import finish_gguf
from llama_reference import reference_llama
from test_resolve import tiny_hf_repo

from localinfer.backends.select import backend_profile
from localinfer.budget import BudgetRequest, compute_budget, kv_cache_bytes
from localinfer.budget.compute import Planner
from localinfer.budget.memory import device_memory, parse_nvidia_smi, parse_size
from localinfer.budget.model_facts import model_facts
from localinfer.budget.quant import kv_dtype
from localinfer.cli import main
from localinfer.errors import InvalidParameterError, ModelFileError
from localinfer.facts.arch import ArchSpec, count_params
from localinfer.facts.hf_config import arch_from_hf_config
from localinfer.facts.quant import bytes_for_params
from localinfer.loading.embedded import embedded_model_path
from localinfer.resolve import resolve_model

CONFIGS = Path(__file__).resolve().parent / "fixtures" / "configs"
F16 = kv_dtype("f16")
GiB = 2**30


def arch_of(fixture: str) -> ArchSpec:
    return arch_from_hf_config(json.loads((CONFIGS / fixture).read_text()), fixture)


# --- KV cache and weights of real models, to the byte --------------------------------------------


def test_llama31_8b_gqa() -> None:
    arch = arch_of("llama-3.1-8b-instruct.json")
    # 32 layers x (K + V) x 8 KV heads x head_dim 128 x 2 bytes = 131072 bytes per token.
    per_token = 32 * 2 * 8 * 128 * 2
    assert kv_cache_bytes(arch, 8192, 1, F16) == per_token * 8192 == 1 * GiB
    assert kv_cache_bytes(arch, 131072, 4, F16) == per_token * 131072 * 4 == 64 * GiB
    # Parameters: untied embeddings (128256 x 4096, twice), per layer q/o 4096^2, k/v 4096 x 1024,
    # SwiGLU 3 x 4096 x 14336 and two norms; plus the final norm.
    embed = 128256 * 4096
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    params = 2 * embed + 32 * layer + 4096
    assert params == 8_030_261_248 == count_params(arch)
    assert bytes_for_params(params, "bf16") == 16_060_522_496
    # Q4_K_M at 4.89 bits per weight, rounded up to a byte.
    assert bytes_for_params(params, "Q4_K_M") == -(-(params * 489) // 800) == 4_908_497_188


def test_qwen3_explicit_head_dim() -> None:
    arch = arch_of("qwen3-0.6b.json")
    # config.json says head_dim 128, not hidden/heads = 1024/16 = 64: the cache is twice as big.
    assert arch.head_dim == 128 != 1024 // 16
    per_token = 28 * 2 * 8 * 128 * 2  # 114688
    assert kv_cache_bytes(arch, 40960, 1, F16) == per_token * 40960 == 4_697_620_480
    # Tied embeddings count once; q is 1024 -> 16 x 128 = 2048 wide; q/k norms of 128 each.
    layer = 1024 * 2048 + 2 * 1024 * 1024 + 2048 * 1024 + 2 * 128 + 3 * 1024 * 3072 + 2 * 1024
    params = 151936 * 1024 + 28 * layer + 1024
    assert params == 596_049_920 == count_params(arch)


def test_gemma3_sliding_window_layers() -> None:
    arch = arch_of("gemma-3-4b-it.json")  # multimodal config: numbers under text_config + defaults
    assert (arch.n_layers, arch.n_kv_heads, arch.head_dim, arch.sliding_window) == (
        34,
        4,
        256,
        1024,
    )
    full_layers = [i for i in range(34) if not arch.is_sliding(i)]
    assert full_layers == [5, 11, 17, 23, 29]  # every 6th layer is global
    per_layer_token = 2 * 4 * 256 * 2  # 4096 bytes
    # ctx 32768: 5 global layers hold every token, 29 sliding layers hold the last 1024.
    expected = 5 * 32768 * per_layer_token + 29 * 1024 * per_layer_token
    assert kv_cache_bytes(arch, 32768, 1, F16) == expected == 792_723_456
    # Below the window every layer holds the whole context.
    assert kv_cache_bytes(arch, 512, 2, F16) == 34 * 512 * per_layer_token * 2


def test_gemma3_270m_layer_types_list() -> None:
    arch = arch_of("gemma-3-270m-it.json")  # newer configs list each layer's attention type
    assert [i for i in range(18) if not arch.is_sliding(i)] == [5, 11, 17]
    per_layer_token = 2 * 1 * 256 * 2
    expected = 3 * 32768 * per_layer_token + 15 * 512 * per_layer_token
    assert kv_cache_bytes(arch, 32768, 1, F16) == expected == 108_527_616
    assert count_params(arch) == 268_098_176


def test_qwen3_moe_all_experts_resident() -> None:
    arch = arch_of("qwen3-30b-a3b.json")
    assert kv_cache_bytes(arch, 40960, 1, F16) == 48 * 2 * 4 * 128 * 2 * 40960 == 4_026_531_840
    # Every one of the 128 experts (3 x 2048 x 768 each) is in memory, plus the router.
    attention = 2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048 + 2 * 128
    moe = 2048 * 128 + 128 * 3 * 2048 * 768
    params = 2 * 151936 * 2048 + 48 * (attention + moe + 2 * 2048) + 2048
    assert params == 30_532_122_624 == count_params(arch)
    assert bytes_for_params(params, "bf16") == 61_064_245_248


def test_deepseek_v2_lite_mla() -> None:
    arch = arch_of("deepseek-v2-lite.json")
    assert arch.is_mla and (arch.kv_lora_rank, arch.qk_rope_head_dim) == (512, 64)
    # One latent of 512 + 64 per token per layer, no K/V pair: 27 x 576 x 2 bytes.
    per_token = 27 * (512 + 64) * 2
    assert kv_cache_bytes(arch, 32768, 1, F16) == per_token * 32768 == 1_019_215_872
    # q8_0 packs 32 values in 34 bytes: 576 values = 18 blocks = 612 bytes per row.
    assert kv_cache_bytes(arch, 1000, 3, kv_dtype("q8_0")) == 27 * 612 * 1000 * 3
    # Params: MLA projections; layer 0 dense (10944), layers 1..26 with 64 routed + 2 shared.
    attention = 2048 * 16 * 192 + 2048 * 576 + 512 + 512 * 16 * 256 + 16 * 128 * 2048
    dense = 3 * 2048 * 10944
    moe = 2048 * 64 + 64 * 3 * 2048 * 1408 + 2 * 3 * 2048 * 1408
    params = 2 * 102400 * 2048 + 27 * (attention + 2 * 2048) + dense + 26 * moe + 2048
    assert params == 15_706_484_224 == count_params(arch)


def test_mistral_v03_has_no_sliding_window() -> None:
    arch = arch_of("mistral-7b-instruct-v0.3.json")
    assert arch.sliding_window is None
    assert kv_cache_bytes(arch, 32768, 1, F16) == 32 * 2 * 8 * 128 * 2 * 32768


def test_quantized_kv_dtypes() -> None:
    arch = arch_of("llama-3.1-8b-instruct.json")
    row = 8 * 128  # one layer's K (or V) per token: 1024 values = 32 blocks
    assert kv_cache_bytes(arch, 100, 1, kv_dtype("q8_0")) == 32 * 2 * (32 * 34) * 100
    assert kv_cache_bytes(arch, 100, 1, kv_dtype("q4_0")) == 32 * 2 * (32 * 18) * 100
    assert kv_cache_bytes(arch, 100, 1, kv_dtype("f32")) == 32 * 2 * row * 4 * 100


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
    assert r.kv_cache_bytes == 2 * 1024 * per_layer_token + 10 * 32 * per_layer_token


def test_gguf_per_layer_sliding_flags(tmp_path: Path) -> None:
    path = tmp_path / "tiny-alternating.gguf"
    write_tiny_gemma3_gguf(path, pattern=[i % 2 == 0 for i in range(12)])
    r = compute_budget(BudgetRequest(str(path), ctx=1024, device="1GiB"))
    per_layer_token = 2 * 1 * 16 * 2
    assert r.kv_cache_bytes == 6 * 1024 * per_layer_token + 6 * 32 * per_layer_token


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


# --- totals, limits and what fits --------------------------------------------------------------


def test_total_is_the_sum_of_its_parts() -> None:
    r = compute_budget(BudgetRequest("llama3.1-8b", ctx=8192, concurrency=2, device="24GiB"))
    assert r.kv_cache_bytes == 2 * GiB
    assert r.overhead_bytes == r.compute_bytes + r.runtime_bytes
    assert r.total_bytes == r.weights_bytes + r.kv_cache_bytes + r.overhead_bytes
    assert r.runtime_bytes == backend_profile(r.backend).memory.runtime_bytes
    # Logits for a 512-token prefill chunk over a 128256 vocab, float32, are part of compute.
    assert r.compute_bytes > 512 * 128256 * 4
    assert r.fits and r.available_bytes == 24 * GiB


def test_max_context_and_concurrency_are_the_exact_boundaries() -> None:
    request = BudgetRequest("qwen3-8b", ctx=32768, concurrency=2, device="12GiB")
    r = compute_budget(request)
    facts = model_facts(resolve_model("qwen3-8b"))
    # "planned": the kind of device a --device SIZE budget is for.
    planner = Planner(facts, backend_profile(r.backend), r.prefill_chunk, "planned")
    assert not r.fits
    assert planner.fits(r.available_bytes, r.quant, r.max_context, 2, F16)
    assert not planner.fits(r.available_bytes, r.quant, r.max_context + 1, 2, F16)
    assert planner.fits(r.available_bytes, r.quant, 32768, r.max_concurrency, F16)
    assert not planner.fits(r.available_bytes, r.quant, 32768, r.max_concurrency + 1, F16)


def test_suggestions_each_fit() -> None:
    r = compute_budget(BudgetRequest("llama3.1-8b", ctx=32768, concurrency=4, device="16GiB"))
    assert not r.fits and r.vllm is None
    changes = {s.change.split()[0] for s in r.suggestions}
    assert {"--ctx", "--concurrency", "--kv-dtype"} <= changes
    for s in r.suggestions:
        assert s.total_bytes <= r.available_bytes
    smaller_quant = compute_budget(BudgetRequest("llama3.1-8b", quant="bf16", device="12GiB"))
    # bf16 (16 GB) doesn't fit 12 GiB; the largest offered quantization that does is Q8_0.
    assert smaller_quant.suggestions[0].change == "--quant Q8_0"


def test_nothing_fits_gives_a_vllm_command() -> None:
    r = compute_budget(BudgetRequest("gemma3-27b", ctx=131072, concurrency=8, device="8GiB"))
    assert not r.fits and not r.suggestions and r.vllm is not None
    # bf16 weights 2 x 27,009,346,304; KV 8 x (10 global x 131072 + 52 sliding x 1024) x 8192 B.
    weights = 2 * 27_009_346_304
    kv = 8 * (10 * 131072 + 52 * 1024) * (2 * 16 * 128 * 2)
    usable = int(80 * GiB * 0.90) - 3 * GiB
    assert weights + kv > usable  # one GPU is not enough
    assert weights // 2 + kv // 2 <= usable  # two share weights and KV heads
    assert r.vllm.tensor_parallel_size == 2 and r.vllm.gpus == 2
    assert r.vllm.command == (
        "vllm serve google/gemma-3-27b-it --tensor-parallel-size 2 --max-model-len 131072 "
        "--max-num-seqs 8 --gpu-memory-utilization 0.90"
    )


def test_ensure_fits_refuses_with_what_would_fit() -> None:
    from localinfer.budget import ensure_fits
    from localinfer.errors import OutOfMemoryBudgetError

    ok = compute_budget(BudgetRequest("smollm2-135m", device="8GiB"))
    assert ensure_fits(ok) is ok
    big = compute_budget(BudgetRequest("llama3.1-8b", ctx=32768, concurrency=4, device="16GiB"))
    with pytest.raises(OutOfMemoryBudgetError) as info:
        ensure_fits(big)
    message = str(info.value)
    assert "\n" not in message and "try --concurrency 2" in message and "16 GiB" in message


def test_torch_dequantizes_gguf_to_its_dtype() -> None:
    # The torch runner loads GGUF blocks as float32 on CPU and caches K/V in float32 too.
    r = compute_budget(BudgetRequest("qwen3-8b", ctx=16384, backend="torch", device="24GiB"))
    assert r.quant == "Q4_K_M" and r.kv_dtype == "f32"
    assert r.weights_bytes == 8_190_735_360 * 4
    assert r.kv_cache_bytes == 36 * 2 * 8 * 128 * 4 * 16384
    assert not r.fits
    assert [s.change for s in r.suggestions] == ["--dtype bfloat16"]
    half = compute_budget(
        BudgetRequest("qwen3-8b", ctx=16384, backend="torch", device="24GiB", dtype="bfloat16")
    )
    assert half.fits and half.weights_bytes == 8_190_735_360 * 2
    assert half.total_bytes == r.suggestions[0].total_bytes


def test_kv_dtype_changes_only_the_cache() -> None:
    base = compute_budget(BudgetRequest("qwen3-8b", ctx=16384, device="64GiB"))
    q8 = compute_budget(BudgetRequest("qwen3-8b", ctx=16384, kv_dtype="q8_0", device="64GiB"))
    assert q8.weights_bytes == base.weights_bytes
    assert q8.kv_cache_bytes * 2 * 32 == base.kv_cache_bytes * 34


# --- devices --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [("24GiB", 24 * 2**30), ("16GB", 16 * 10**9), ("512 MiB", 512 * 2**20), ("1.5TiB", 3 * 2**39)],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["24", "GiB", "12XB", "-4GiB", "0GiB", "lots"])
def test_unparseable_sizes(text: str) -> None:
    with pytest.raises(InvalidParameterError):
        parse_size(text)


def test_nvidia_smi_output() -> None:
    assert parse_nvidia_smi("80000, 81559\n 1024 , 24576\n") == [
        (80000 * 2**20, 81559 * 2**20),
        (1024 * 2**20, 24576 * 2**20),
    ]


def test_cpu_memory_is_read_from_the_machine() -> None:
    cpu = device_memory("cpu")
    assert 0 < cpu.available <= cpu.total


# --- the command line -----------------------------------------------------------------------------


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "budget",
            "smollm2-135m",
            "--ctx",
            "4k",
            "--concurrency",
            "2",
            "--device",
            "8GiB",
            "--json",
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert rc == 0
    for key in (
        "weights_bytes",
        "kv_cache_bytes",
        "overhead_bytes",
        "total_bytes",
        "available_bytes",
        "fits",
        "max_context",
        "max_concurrency",
        "ctx",
        "concurrency",
        "quant",
        "kv_dtype",
        "device",
        "backend",
    ):
        assert key in data
    assert data["ctx"] == 4096 and data["concurrency"] == 2
    assert data["kv_cache_bytes"] == 30 * 2 * 3 * 64 * 2 * 4096 * 2
    assert (
        data["total_bytes"]
        == data["weights_bytes"] + data["kv_cache_bytes"] + data["overhead_bytes"]
    )


def test_cli_table_and_not_fitting_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["budget", "llama3.1-8b", "--device", "24GiB"]) == 0
    out = capsys.readouterr().out
    assert "weights" in out and "KV cache" in out and "fits" in out
    assert (
        main(["budget", "llama3.1-8b", "--ctx", "128k", "--concurrency", "8", "--device", "24GiB"])
        == 3
    )
    assert "does not fit" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["budget", "lama-3.1-8b"], "unknown model"),
        (["budget", "qwen3-8b", "--ctx", "100000"], "maximum context of 40960"),
        (["budget", "qwen3-8b", "--ctx", "0"], "--ctx"),
        (["budget", "qwen3-8b", "--ctx", "-5"], "--ctx"),
        (["budget", "qwen3-8b", "--concurrency", "0"], "--concurrency"),
        (["budget", "qwen3-8b", "--concurrency", "two"], "--concurrency"),
        (["budget", "qwen3-8b", "--device", "24"], "memory size"),
        (["budget", "qwen3-8b", "--device", "12XB"], "memory size"),
        (["budget", "qwen3-8b", "--device", "tpu"], "unknown device"),
        (["budget", "qwen3-8b", "--quant", "Q9"], "unknown quantization"),
        (["budget", "qwen3-8b", "--kv-dtype", "int3"], "KV cache dtype"),
        (["budget", "qwen3-8b", "--backend", "onnx"], "unknown backend"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_1(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("localinfer: error: ") and err.count("\n") == 1
    assert needle in err


def test_cli_config_json_missing_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from test_resolve import write_safetensors

    config = json.loads((CONFIGS / "llama-3.1-8b-instruct.json").read_text())
    del config["num_hidden_layers"], config["max_position_embeddings"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    write_safetensors(tmp_path / "model.safetensors", {"w": ("BF16", [8, 8])})
    assert main(["budget", str(tmp_path), "--device", "8GiB"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "lacks num_hidden_layers, max_position_embeddings" in err


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def test_models_command_lists_cached_repos(
    hf_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = tiny_hf_repo(hf_cache, "someone/tiny-llama")
    assert main(["models", "--device", "8GiB", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    tiny = rows["someone/tiny-llama"]
    assert tiny["source"] == "hf cache" and tiny["on_disk"] and tiny["fits"]
    assert tiny["quant"] == "bf16"
    assert tiny["size_bytes"] == sum(
        p.stat().st_size for p in (hf_cache / "models--someone--tiny-llama" / "blobs").iterdir()
    )
    assert snapshot.is_dir()


def test_models_command_lists_catalog_and_cache(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "--device", "1GiB", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["smollm2-135m"]["on_disk"] and rows["smollm2-135m"]["fits"]
    assert rows["smollm2-135m"]["size_bytes"] == embedded_model_path().stat().st_size
    assert not rows["qwen3-30b-a3b"]["on_disk"] and rows["qwen3-30b-a3b"]["fits"] is False
    assert main(["models", "--device", "8GiB"]) == 0
    assert "smollm2-135m" in capsys.readouterr().out


# --- predicted vs what llama.cpp allocates -------------------------------------------------------


@pytest.mark.llamacpp
def test_prediction_matches_llama_cpp_for_the_embedded_model() -> None:
    import re

    pytest.importorskip("llama_cpp")
    from localinfer.backends.llamacpp import native

    # Read llama.cpp's own buffer report through the project's log hook: once any test has
    # initialised the backend, llama.cpp's log no longer reaches stderr. The weights load as the
    # runner loads them (no AMX copy; tests/llama_reference.py), which is what the budget plans.
    capture = native.LogCapture()
    with (
        native.listen(capture),
        reference_llama(
            embedded_model_path(), n_ctx=4096, n_batch=512, n_ubatch=512, n_threads=1, verbose=True
        ),
    ):
        pass
    log = capture.text()
    mib: dict[str, float] = {}
    for match in re.finditer(r"\b(model|KV|compute) buffer size\s*=\s*([\d.]+) MiB", log):
        mib[match.group(1)] = mib.get(match.group(1), 0.0) + float(match.group(2))
    assert set(mib) == {"model", "KV", "compute"}, log[-2000:]
    report = compute_budget(
        BudgetRequest("smollm2-135m", ctx=4096, device="8GiB", backend="llamacpp")
    )
    # llama.cpp prints MiB with two decimals: weights and KV agree to that precision.
    assert abs(report.weights_bytes / 2**20 - mib["model"]) < 0.01
    assert abs(report.kv_cache_bytes / 2**20 - mib["KV"]) < 0.01
    # The compute estimate may be conservative, by at most 15%.
    assert mib["compute"] <= report.compute_bytes / 2**20 <= 1.15 * mib["compute"]


def test_cpu_budget_counts_what_is_resident() -> None:
    # llama.cpp reserves chunk x vocab logits; on the CPU only one row per sequence is touched
    # (scripts/budget-accuracy measures RSS), on a GPU or an unknown machine the reservation counts.
    def llamacpp(device: str) -> int:
        request = BudgetRequest(
            "smollm2-135m", ctx=2048, concurrency=4, device=device, backend="llamacpp"
        )
        return compute_budget(request).compute_bytes

    assert llamacpp("8GiB") - llamacpp("cpu") == (512 - 4) * 49152 * 4

    # torch on the CPU: its native kernels keep the file's Q4_1/Q8_0 blocks as stored where this
    # machine's calibration found them faster (norms are F32 already); the file's pages are
    # dropped after the load. Asked for float32 weights, or without the kernels, float32
    # weights; where the kernels do not run on float32 rows (switched off, no C compiler, or
    # measured slower than torch ops) the oneDNN-packed copy of the tied LM head is held beside
    # the table as well.
    from localinfer.backends.torch.native_plan import keeps_blocks, native_f32_tokens

    def torch_cpu_weights(quant: str | None = None) -> int:
        request = BudgetRequest("smollm2-135m", device="cpu", backend="torch", quant=quant)
        return compute_budget(request).weights_bytes

    f32 = 134_515_008 * 4 + (0 if native_f32_tokens() else 49152 * 576 * 4)
    assert torch_cpu_weights() == (96_576_768 if keeps_blocks() else f32)
    assert torch_cpu_weights("f32") == f32
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALINFER_NATIVE_KERNELS", "0")
        assert torch_cpu_weights() == 134_515_008 * 4 + 49152 * 576 * 4
    planned = compute_budget(BudgetRequest("smollm2-135m", device="8GiB", backend="torch"))
    assert planned.weights_bytes == 134_515_008 * 4


def test_total_error_only_from_a_fresh_process() -> None:
    from localinfer.budget.verify import MemoryCheck

    sizes = dict.fromkeys(
        ["predicted_weights", "measured_weights", "predicted_kv_cache", "measured_kv_cache"], 1
    )
    check = MemoryCheck(
        backend="torch",
        device="cpu",
        **sizes,
        predicted_compute=1,
        measured_overhead=1,
        predicted_total=110,
        rss_growth=100,
    )
    assert check.total_error == pytest.approx(0.10)
    assert check.model_copy(update={"predicted_total": 95}).total_error == pytest.approx(-0.05)
    # RSS growth without the library import, or no RSS at all: no comparable figure.
    assert check.model_copy(update={"library_preloaded": True}).total_error is None
    assert check.model_copy(update={"rss_growth": None}).total_error is None


@pytest.mark.slow  # ~10-20 s: loads the tokenizer and model; the numbers are checked fast above
@pytest.mark.llamacpp
def test_verify_with_llama_cpp(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("llama_cpp")
    argv = ["budget", "smollm2-135m", "--ctx", "1024", "--concurrency", "2"]
    assert main([*argv, "--backend", "llamacpp", "--device", "cpu", "--verify", "--json"]) == 0
    check = json.loads(capsys.readouterr().out)["verify"]
    assert check["backend"] == "llamacpp"
    assert check["measured_weights"] == check["predicted_weights"] == 96_576_768
    assert check["measured_kv_cache"] == check["predicted_kv_cache"] == 30 * 2 * 192 * 2 * 1024 * 2
    # On the CPU the prediction counts the resident part of llama.cpp's reserved compute
    # buffer (activations + one logits row per sequence), less than the reservation it reports.
    assert 512 * 576 * 4 < check["predicted_compute"] < check["measured_overhead"]
    if check["total_error"] is not None:  # llama_cpp not imported earlier in this process
        assert abs(check["total_error"]) <= 0.10


@pytest.mark.slow
def test_verify_with_torch(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    argv = ["budget", "smollm2-135m", "--ctx", "1024", "--concurrency", "2"]
    assert main([*argv, "--backend", "torch", "--device", "cpu", "--verify", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    check = data["verify"]
    # torch's native kernels keep the file's Q4_1/Q8_0 blocks as stored (the tied LM head is the
    # embedding table's blocks) and cache K/V in float32.
    assert check["measured_weights"] == check["predicted_weights"] == 96_576_768
    assert check["measured_kv_cache"] == check["predicted_kv_cache"] == 30 * 2 * 192 * 4 * 1024 * 2
    # Everything the process gained (library, tokenizer, weights, cache, activations) lands
    # within 10% of the predicted total when torch was first imported by the measurement.
    if check["total_error"] is not None:
        assert abs(check["total_error"]) <= 0.10


def test_verify_needs_the_model_here(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["budget", "qwen3-8b", "--device", "cpu", "--verify"]) == 1
    assert "localinfer pull qwen3-8b" in capsys.readouterr().err
    assert main(["budget", "smollm2-135m", "--device", "8GiB", "--verify"]) == 1
    assert "drop --device SIZE" in capsys.readouterr().err


def test_friendly_quant_names_follow_the_backend() -> None:
    # llama.cpp runs what `localinfer quantize --to int4/int8` writes (Q4_K_M / Q8_0); torch and
    # mlx quantize in groups themselves (int4 g64 = 4.5 bits).
    def weights(quant: str, backend: str) -> int:
        request = BudgetRequest("qwen3-8b", quant=quant, device="64GiB", backend=backend)
        return compute_budget(request).weights_bytes

    assert weights("int4", "llamacpp") == weights("Q4_K_M", "llamacpp")
    assert weights("int8", "llamacpp") == weights("Q8_0", "llamacpp")
    assert weights("int4", "torch") < weights("int4", "llamacpp")


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
