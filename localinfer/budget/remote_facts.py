"""Model facts without the weights on disk: from the Hub's metadata (hub_metadata.py: the same
header summaries a downloaded file gives, so a budget before `pull` equals the one after it), and
from a config.json alone (the parameter count worked out from the architecture)."""

from __future__ import annotations

import dataclasses
from typing import Any

from localinfer.budget.facts_record import ModelFacts
from localinfer.budget.hub_metadata import RemoteWeights, remote_weights
from localinfer.catalog import HFSource
from localinfer.errors import InvalidParameterError, UnsupportedModelError
from localinfer.facts.arch import count_params
from localinfer.facts.hf_config import arch_from_hf_config, text_model_config
from localinfer.facts.quant import WEIGHT_BITS
from localinfer.resolve import ResolvedModel

# model_type -> count_params follows its Hugging Face module layout (checked against published
# safetensors totals in tests/test_budget_config.py); others have layouts it would miscount.
COUNTED_TYPES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "gemma3",
    "phi3",
    "deepseek_v2",
    "deepseek_v3",
)
_DTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}


def hub_facts(
    resolved: ResolvedModel, mmproj: str | None, *, cached_only: bool = False
) -> ModelFacts:
    """A Hub repo that is not on disk, read from its metadata (the quantization that named it
    picks the GGUF file); ``cached_only``: from the metadata cache, never the Hub."""
    assert resolved.repo_id is not None
    quant = resolved.picked_by
    if quant is not None and quant.strip().lower() == "none":
        quant = None
    weights = remote_weights(resolved.repo_id, quant, mmproj, cached_only=cached_only)
    return _facts(weights, resolved, resolved.name)


def catalog_hub_facts(resolved: ResolvedModel, mmproj: str | None) -> ModelFacts:
    """A catalog model not on disk, read from the Hub's metadata of the file the catalog names
    (`--online`): exact weights instead of params x bits."""
    entry = resolved.entry
    assert entry is not None
    source = entry.source
    if not isinstance(source, HFSource):
        raise InvalidParameterError(f"{entry.name} is not on the Hugging Face Hub")
    quant = resolved.quant or entry.default_quant
    if quant == "bf16" or not source.gguf_repo:
        repo, tag = source.repo, None
    else:
        repo, tag = source.gguf_repo, source.gguf_filename(quant) or quant
    weights = remote_weights(repo, tag, mmproj)
    # The catalog's file of that quantization, budgeted as it is (as once it is on disk).
    picked = quant if weights.format == "gguf" else None
    resolved = dataclasses.replace(resolved, repo_id=repo, picked_by=picked)
    return _facts(weights, resolved, entry.name)


def _facts(weights: RemoteWeights, resolved: ResolvedModel, name: str) -> ModelFacts:
    at = f"{weights.repo_id}@{weights.commit[:10]}"
    origin = f"cached Hub metadata of {at}" if weights.from_cache_only else f"Hub: {at}"
    extra: dict[str, Any] = {
        "projector": weights.projector,
        "projectors": weights.projectors,
        "download_bytes": weights.download_bytes,
        "hub_files": weights.files + ((weights.projector.name,) if weights.projector else ()),
    }
    resolved = dataclasses.replace(resolved, name=name)
    if weights.format == "config":
        assert weights.config is not None
        facts = config_facts(weights.config, resolved, f"{weights.repo_id}/config.json")
        return dataclasses.replace(facts, **extra)
    header = weights.header
    assert header is not None
    if weights.format == "gguf":
        assert header.arch is not None
        arch = header.arch
    else:
        assert weights.config is not None
        arch = arch_from_hf_config(weights.config, f"{weights.repo_id}/config.json")
    return ModelFacts(
        name,
        arch,
        header.params,
        header.quant,
        header,
        resolved,
        weights.format,
        origin,
        **extra,
    )


def config_facts(config: dict[str, Any], resolved: ResolvedModel, origin: str) -> ModelFacts:
    """A model known by its config.json alone: the parameter count worked out from the
    architecture (dense, GQA, MLA, MoE with shared experts, tied embeddings: facts/arch.py), the
    weights in the config's dtype (or its quantization_config's bits)."""
    source = resolved.path or origin
    arch = arch_from_hf_config(config, source)
    model_type = text_model_config(config)["model_type"]
    if model_type not in COUNTED_TYPES:
        raise UnsupportedModelError(
            f"{source}: the budget counts the parameters of {', '.join(COUNTED_TYPES)} from a "
            f"config.json, not of model_type {model_type!r}; budget its GGUF or safetensors files"
        )
    quant = config_quant(config)
    return ModelFacts(
        resolved.name, arch, count_params(arch), quant, None, resolved, "safetensors", origin
    )


def config_quant(config: dict[str, Any]) -> str:
    """How a checkpoint stores its weights, from config.json: a GPTQ/AWQ-style
    quantization_config's bits and group, else torch_dtype (dtype in newer configs), else bf16."""
    quantized = config.get("quantization_config")
    if isinstance(quantized, dict):
        bits = quantized.get("bits") or quantized.get("w_bit")
        group = quantized.get("group_size") or quantized.get("q_group_size")
        if bits in (4, 8):
            name = f"int{bits}" + (f"-g{group}" if group in (32, 128) else "")
            return name if name in WEIGHT_BITS else f"int{bits}"
        if str(quantized.get("quant_method", "")).lower() == "fp8":
            return "int8"  # one byte per weight, as fp8 stores them
    text = text_model_config(config)
    dtype = text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype")
    return _DTYPES.get(str(dtype), "bf16")
