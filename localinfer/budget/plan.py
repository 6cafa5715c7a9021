"""What to do when a request does not fit: the nearest settings that do, and, when none does,
a vLLM command line for the fewest 80 GiB GPUs that would serve it."""

from __future__ import annotations

from dataclasses import replace

from localinfer.budget.model_facts import ModelFacts
from localinfer.budget.planner import Planner, kv_cache_bytes
from localinfer.budget.report import Suggestion, VllmPlan
from localinfer.errors import LocalinferError
from localinfer.facts.kv_dtype import KV_DTYPES, KVDtype, kv_dtype
from localinfer.facts.quant import weight_bits

# Ordered from large to small: the budget walks this list when it looks for a quantization that
# fits. Only the ones a runner can actually produce or load are offered as suggestions.
SUGGESTION_ORDER = ("bf16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K")

# A context shorter than this is not a useful suggestion for chat or code.
MIN_USEFUL_CTX = 1024

GPU_BYTES = 80 * 2**30  # one A100/H100 80GB
GPU_MEMORY_UTILIZATION = 0.90  # vLLM's default share of each GPU
# vLLM's per-GPU memory beyond weights and KV (CUDA context, activations, CUDA graphs, NCCL).
# A named estimate from vLLM's profiling run behaviour, not measured here.
VLLM_PER_GPU_OVERHEAD = 3 * 2**30
MAX_GPUS = 64


def suggestions_for(
    planner: Planner, budget: int, quant: str, ctx: int, sequences: int, kv: KVDtype
) -> list[Suggestion]:
    """One suggestion per knob (quantization, context, concurrency, KV dtype) that alone makes
    the request fit; if none does alone, one that turns them all down together."""
    out: list[Suggestion] = []

    def add(change: str, q: str, c: int, s: int, k: KVDtype) -> None:
        total = planner.breakdown(q, c, s, k).total
        out.append(
            Suggestion(
                change=change, quant=q, ctx=c, concurrency=s, kv_dtype=k.name, total_bytes=total
            )
        )

    smaller = _smaller_quants(planner.facts, quant)
    for q in smaller:
        if planner.fits(budget, q, ctx, sequences, kv):
            add(f"--quant {q}", q, ctx, sequences, kv)
            break
    best_ctx = planner.max_context(budget, quant, sequences, kv)
    if best_ctx >= min(MIN_USEFUL_CTX, ctx):
        add(f"--ctx {best_ctx}", quant, best_ctx, sequences, kv)
    if sequences > 1:
        best_seqs = planner.max_sequences(budget, quant, ctx, kv)
        if best_seqs >= 1:
            add(f"--concurrency {best_seqs}", quant, ctx, best_seqs, kv)
    if planner.profile.holds_compute_dtype:
        # Weights (dequantized) and cache are in the compute dtype: halve both.
        if planner.compute_dtype() == "float32":
            half = replace(planner, dtype="bfloat16")
            half_kv = KV_DTYPES["bf16"] if kv.name == "f32" else kv
            if half.fits(budget, quant, ctx, sequences, half_kv):
                total = half.breakdown(quant, ctx, sequences, half_kv).total
                out.append(
                    Suggestion(
                        change="--dtype bfloat16",
                        quant=quant,
                        ctx=ctx,
                        concurrency=sequences,
                        kv_dtype=half_kv.name,
                        total_bytes=total,
                    )
                )
    elif quantized_caches(planner):
        for name in ("q8_0", "q4_0"):
            cheaper = KV_DTYPES[name]
            if cheaper.block_bytes / cheaper.block < kv.block_bytes / kv.block and planner.fits(
                budget, quant, ctx, sequences, cheaper
            ):
                add(f"--kv-dtype {name}", quant, ctx, sequences, cheaper)
                break
    if out:
        return out
    # Nothing alone: the smallest quantization, the cheapest cache, the longest context it allows.
    q = smaller[-1] if smaller else quant
    k = kv_dtype("q4_0") if quantized_caches(planner) else kv
    for seqs in dict.fromkeys((sequences, 1)):
        best_ctx = planner.max_context(budget, q, seqs, k)
        if best_ctx >= min(MIN_USEFUL_CTX, ctx):
            flags = [f"--quant {q}"] if q != quant else []
            flags += [f"--kv-dtype {k.name}"] if k is not kv else []
            flags.append(f"--ctx {best_ctx}")
            if seqs != sequences:
                flags.append("--concurrency 1")
            add(" ".join(flags), q, best_ctx, seqs, k)
            break
    return out


def quantized_caches(planner: Planner) -> bool:
    """Q8_0/Q4_0 KV caches are llama.cpp's (--kv-dtype); torch and MLX hold the compute dtype."""
    profile = planner.profile
    return not (profile.holds_compute_dtype or profile.kv_in_compute_dtype)


def _smaller_quants(facts: ModelFacts, quant: str) -> list[str]:
    """Quantizations with fewer bits than `quant`, largest first: those the catalog entry offers,
    or the usual GGUF ladder for a model that isn't in the catalog."""
    entry = facts.resolved.entry
    offered = list(entry.quants) if entry is not None else list(SUGGESTION_ORDER)
    try:
        current = weight_bits(quant)
    except LocalinferError:  # a file type without a bits figure (packed GPTQ ints): 16-bit
        current = weight_bits("bf16")
    return sorted((q for q in offered if weight_bits(q) < current), key=weight_bits, reverse=True)


def vllm_plan_for(facts: ModelFacts, ctx: int, sequences: int, kv: KVDtype) -> VllmPlan | None:
    """Fewest 80 GiB GPUs (tensor parallel up to 8, then pipeline stages) serving the original
    bf16 weights at this context and concurrency."""
    arch = facts.arch
    weights = facts.weights("bf16")[0]
    # vLLM's cache is 16-bit ("auto") or fp8; a quantized llama.cpp cache maps to fp8.
    fp8 = kv.name not in ("f16", "bf16", "f32")
    cache_dtype = KVDtype("fp8", 1, 1) if fp8 else KV_DTYPES["f16"]
    kv_total = kv_cache_bytes(arch, ctx, sequences, cache_dtype)
    usable = int(GPU_BYTES * GPU_MEMORY_UTILIZATION) - VLLM_PER_GPU_OVERHEAD
    tp_options = [tp for tp in (1, 2, 4, 8) if arch.n_heads % tp == 0]
    for tp, pp in [(tp, 1) for tp in tp_options] + [
        (tp_options[-1], pp) for pp in range(2, MAX_GPUS // tp_options[-1] + 1)
    ]:
        per_gpu = _per_gpu_bytes(facts, weights, kv_total, tp, pp)
        if per_gpu <= usable:
            return _plan(facts, tp, pp, ctx, sequences, fp8, per_gpu)
    return None


def _per_gpu_bytes(facts: ModelFacts, weights: int, kv_total: int, tp: int, pp: int) -> int:
    arch = facts.arch
    # KV heads split across tensor-parallel ranks; with fewer KV heads than ranks (and for MLA's
    # single latent) each rank keeps a full copy of its heads.
    if arch.is_mla:
        kv_share = kv_total
    else:
        kv_share = kv_total * max(1, arch.n_kv_heads // tp) // arch.n_kv_heads
    return -(-weights // (tp * pp)) + -(-kv_share // pp)


def _plan(
    facts: ModelFacts, tp: int, pp: int, ctx: int, sequences: int, fp8: bool, per_gpu: int
) -> VllmPlan:
    entry = facts.resolved.entry
    repo = facts.resolved.repo_id or (getattr(entry.source, "repo", None) if entry else None)
    target = repo or str(facts.resolved.path or facts.name)
    parts = [f"vllm serve {target}", f"--tensor-parallel-size {tp}"]
    if pp > 1:
        parts.append(f"--pipeline-parallel-size {pp}")
    parts += [
        f"--max-model-len {ctx}",
        f"--max-num-seqs {sequences}",
        f"--gpu-memory-utilization {GPU_MEMORY_UTILIZATION:.2f}",
    ]
    if fp8:
        parts.append("--kv-cache-dtype fp8")
    return VllmPlan(
        gpus=tp * pp,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        max_model_len=ctx,
        max_num_seqs=sequences,
        gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
        kv_cache_dtype="fp8" if fp8 else "auto",
        per_gpu_bytes=per_gpu + VLLM_PER_GPU_OVERHEAD,
        command=" ".join(parts),
    )
