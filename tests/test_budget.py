"""Budget arithmetic against hand calculations for real public models (saved config.json files):
KV cache and weights to the byte, totals, the exact limits of what fits, suggestions, quant names
per backend, and device sizes."""

from __future__ import annotations

import pytest

from localinfer.backend_budget import compute_budget
from localinfer.backends.select import backend_profile
from localinfer.budget import BudgetRequest, kv_cache_bytes
from localinfer.budget.compute import Planner
from localinfer.budget.memory import device_memory, parse_nvidia_smi, parse_size
from localinfer.budget.model_facts import model_facts
from localinfer.errors import InvalidParameterError
from localinfer.facts.arch import count_params
from localinfer.facts.kv_dtype import kv_dtype
from localinfer.facts.quant import bytes_for_params
from localinfer.resolve import resolve_model
from tests.saved_configs import arch_of

F16 = kv_dtype("f16")


GiB = 2**30


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


# --- totals, limits and what fits --------------------------------------------------------------


def test_total_is_the_sum_of_its_parts() -> None:
    r = compute_budget(BudgetRequest("llama3.1-8b", ctx=8192, concurrency=2, device="24GiB"))
    assert r.kv_cache_bytes == 2 * GiB
    assert r.overhead_bytes == r.compute_bytes + r.runtime_bytes
    assert r.total_bytes == r.weights_bytes + r.kv_cache_bytes + r.overhead_bytes
    # On a machine of a given size: the library's constant and the tokenizer tables of a
    # 128,256-token vocabulary, in host memory.
    assert r.runtime_bytes == backend_profile(r.backend).runtime("planned", 128256)
    assert r.runtime_bytes > backend_profile(r.backend).memory.runtime_bytes + 128256 * 500
    # The logits rows llama.cpp reserves, float32, are part of compute: one per sequence and 32
    # for speculative verification (backends/llamacpp/context_shape.py), not the whole chunk.
    assert 34 * 128256 * 4 < r.compute_bytes < 512 * 128256 * 4
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
    assert "\n" not in message and "try --slots 2" in message and "16 GiB" in message


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


def test_friendly_quant_names_follow_the_backend() -> None:
    # llama.cpp runs what `localinfer quantize --to int4/int8` writes (Q4_K_M / Q8_0); torch
    # quantizes itself: int4 is its mixed recipe (4-bit groups of 32, the head at 8 bits: 5.27
    # bits per weight on Qwen3-8B, above Q4_K_M's ~4.9), int4-g64 the uniform 4.5-bit layout.
    def weights(quant: str, backend: str) -> int:
        request = BudgetRequest("qwen3-8b", quant=quant, device="64GiB", backend=backend)
        return compute_budget(request).weights_bytes

    assert weights("int4", "llamacpp") == weights("Q4_K_M", "llamacpp")
    assert weights("int8", "llamacpp") == weights("Q8_0", "llamacpp")
    assert weights("int4-g64", "torch") < weights("int4", "llamacpp") < weights("int4", "torch")
    assert weights("int4", "torch") < weights("int8", "torch")


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
