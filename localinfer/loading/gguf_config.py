"""ModelConfig from a GGUF header: the architecture numbers as localinfer/facts/gguf_header.py
reads them (for the budget too), checked against what the runners need, plus RoPE, norms and the
special-token ids."""

from __future__ import annotations

import math

import numpy as np

from localinfer.errors import ModelFileError, UnsupportedModelError
from localinfer.facts.gguf_header import arch_fields_from_gguf
from localinfer.loading.bert_gguf import BERT, check_bert_layers
from localinfer.loading.gguf_checks import check_config_numbers, check_layers
from localinfer.loading.gguf_file import GGUFFile
from localinfer.loading.gpt_oss import (
    GPT_OSS,
    GPT_OSS_GGUF,
    LLAMACPP_ONLY_ARCHS,
    check_gpt_oss_layers,
    harmony_end_ids,
)
from localinfer.loading.model_config import (
    QWEN2_VL,
    SUPPORTED_ARCHS,
    ModelConfig,
    RopeScaling,
    config_from_arch_fields,
)

# GGUF general.architecture -> ModelConfig.arch. Mistral models convert to "llama" in GGUF.
GGUF_ARCHS = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3": "gemma3",
    GPT_OSS_GGUF: GPT_OSS,  # llama.cpp only (loading/gpt_oss.py)
    BERT: BERT,  # llama.cpp only (loading/bert_gguf.py)
    "qwen2vl": QWEN2_VL,  # llama.cpp only (M-RoPE: model_config.py)
}

# llama.cpp marks these texts end-of-generation as well as the declared eos/eot ids.
EOG_TEXTS = frozenset(
    {
        "<|endoftext|>",
        "<|im_end|>",
        "<|eot_id|>",
        "<|eom_id|>",
        "<end_of_turn>",
        "<|end|>",
        "<|end_of_text|>",
        "<|return|>",  # o200k_harmony (gpt-oss), whose <|end|> is not one (gpt_oss.py)
        "<|call|>",
    }
)
TOKEN_TYPE_CONTROL = 3

# Gemma 3's sliding-window layers use RoPE base 10000 (llama.cpp hard-codes it too).
GEMMA3_LOCAL_THETA = 10000.0
# The numbers the runners need from the file itself (the budget falls back where one is missing),
# and those a file may give per layer, which the runners need the same in every layer.
_RUNNER_KEYS = ("feed_forward_length", "context_length")
_PER_LAYER_KEYS = ("attention.head_count", "attention.head_count_kv", "feed_forward_length")


def gguf_arch(gguf: GGUFFile) -> str:
    arch = gguf.architecture
    if arch not in GGUF_ARCHS:
        raise UnsupportedModelError(
            f"{gguf.path}: architecture '{arch}' is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHS + LLAMACPP_ONLY_ARCHS)})"
        )
    return GGUF_ARCHS[arch]


def _check_uniform(gguf: GGUFFile, key: str) -> None:
    """Per-layer arrays (some GGUFs store head counts per layer) must be uniform here. Types and
    ranges were checked when the file was opened (gguf_checks.check_header)."""
    value = gguf.get(key)
    if isinstance(value, np.ndarray | list):
        values = set(int(v) for v in value)
        if len(values) != 1:
            raise UnsupportedModelError(
                f"{gguf.path}: '{key}' differs between layers ({sorted(values)}), not supported"
            )


def config_from_gguf(gguf: GGUFFile) -> ModelConfig:
    """The config of a model localinfer runs, with every number checked against the tensors
    (ModelFileError: no backend ever sees an inconsistent file)."""
    arch = gguf_arch(gguf)
    a = gguf.architecture  # key prefix as written in the file
    fields = arch_fields_from_gguf(gguf.metadata, gguf.tensors, gguf.path)
    for key in _RUNNER_KEYS:
        gguf.require(f"{a}.{key}")
    for key in _PER_LAYER_KEYS:
        _check_uniform(gguf, f"{a}.{key}")
    if "token_embd.weight" not in gguf.tensors:
        raise ModelFileError(gguf.path, "missing tensor 'token_embd.weight'")
    head_dim = int(fields["head_dim"])
    value_length = gguf.get(f"{a}.attention.value_length")
    if value_length is not None and int(value_length) != head_dim:
        raise UnsupportedModelError(
            f"{gguf.path}: value heads of {value_length} and key heads of {head_dim} dimensions "
            "(the runners need one head size)"
        )
    rope_theta = float(gguf.get(f"{a}.rope.freq_base", 10000.0))
    rope_scaling = None  # llama.cpp applies a llama.cpp-only architecture's scaling (YaRN) itself
    if arch not in LLAMACPP_ONLY_ARCHS:
        rope_scaling, fields["max_ctx"] = _rope_scaling(
            gguf, a, head_dim, rope_theta, fields["max_ctx"]
        )
    bos, eos = gguf_special_ids(gguf)
    config = config_from_arch_fields(
        arch,
        fields,
        rope_theta=rope_theta,
        rms_eps=float(gguf.get(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_scaling=rope_scaling,
        bos_token_id=bos,
        eos_token_ids=eos,
        rope_local_theta=_local_theta(gguf, a, arch),
        query_pre_attn_scalar=float(head_dim) if arch == "gemma3" else None,
    )
    check_config_numbers(gguf.path, config, gguf.get(f"{a}.rope.dimension_count"))
    if arch == GPT_OSS:
        check_gpt_oss_layers(gguf.path, config, gguf.tensors, gguf.metadata)
    elif arch == BERT:
        check_bert_layers(gguf.path, config, gguf.tensors, gguf.metadata)
    else:
        check_layers(gguf.path, config, gguf.tensors)
    return config


def _local_theta(gguf: GGUFFile, a: str, arch: str) -> float | None:
    value = gguf.get(f"{a}.rope.freq_base_swa")
    if value is not None:
        return float(value)
    return GEMMA3_LOCAL_THETA if arch == "gemma3" else None


def _rope_scaling(
    gguf: GGUFFile, a: str, head_dim: int, theta: float, max_ctx: int
) -> tuple[RopeScaling | None, int]:
    kind = gguf.get(f"{a}.rope.scaling.type")
    factor = gguf.get(f"{a}.rope.scaling.factor")
    if kind == "linear" and factor and float(factor) != 1.0:
        return RopeScaling(kind="linear", factor=float(factor)), max_ctx
    if kind == "yarn":
        # YaRN is not implemented by the runners: stay inside the original window instead of
        # producing garbage past it.
        orig = gguf.get(f"{a}.rope.scaling.original_context_length")
        return None, min(max_ctx, int(orig)) if orig else max_ctx
    if "rope_freqs.weight" in gguf.tensors:
        factors = gguf.dequantize("rope_freqs.weight").reshape(-1)
        return llama3_scaling_from_factors(factors, head_dim, theta), max_ctx
    return None, max_ctx


def llama3_scaling_from_factors(
    factors: np.ndarray, head_dim: int, theta: float
) -> RopeScaling | None:
    """Recover Llama-3 rope scaling from the per-frequency factors llama.cpp stores.

    The converter writes f_i = 1 / ((1 - s_i) / factor + s_i) with
    s_i = clamp((orig_ctx / wavelen_i - low) / (high - low), 0, 1): s is linear in 1/wavelen, so
    two smooth-region points fix orig_ctx / (high - low) and low / (high - low). Any
    (orig_ctx, low, high) with those two ratios gives identical frequencies; low = 1 is chosen.
    """
    factors = np.asarray(factors, dtype=np.float64)
    factor = float(factors.max())
    if factor <= 1.0 + 1e-6:
        return None
    inv_freq = theta ** (-np.arange(0, 2 * len(factors), 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    smooth = (1.0 / factors - 1.0 / factor) / (1.0 - 1.0 / factor)
    mid = (factors > 1.0 + 1e-4) & (factors < factor * (1.0 - 1e-4))
    if mid.sum() >= 2:
        design = np.stack([1.0 / wavelen[mid], -np.ones(int(mid.sum()))], axis=1)
        (ratio_ctx, ratio_low), *_ = np.linalg.lstsq(design, smooth[mid], rcond=None)
        if ratio_low > 0:
            return RopeScaling(
                kind="llama3",
                factor=round(factor, 4),
                low_freq_factor=1.0,
                high_freq_factor=float(1.0 + 1.0 / ratio_low),
                original_max_position_embeddings=int(round(ratio_ctx / ratio_low)),
            )
    return RopeScaling(kind="llama3", factor=round(factor, 4))


def gguf_special_ids(gguf: GGUFFile) -> tuple[int | None, tuple[int, ...]]:
    """The BOS id and the end-of-generation ids (EOS, EOT, EOM and llama.cpp's EOG texts)."""
    bos = gguf.get("tokenizer.ggml.bos_token_id")
    eos: list[int] = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        value = gguf.get(f"tokenizer.ggml.{key}")
        if value is not None and int(value) not in eos:
            eos.append(int(value))
    tokens = gguf.get("tokenizer.ggml.tokens") or []
    types = gguf.get("tokenizer.ggml.token_type")
    if types is not None and len(types) == len(tokens):
        for text in sorted(EOG_TEXTS):
            try:
                i = tokens.index(text)  # a C-speed scan; vocabularies reach 262k entries
            except ValueError:
                continue
            if int(types[i]) == TOKEN_TYPE_CONTROL and i not in eos:
                eos.append(i)
        eos = harmony_end_ids(tokens, eos)
    return (int(bos) if bos is not None else None), tuple(eos)
