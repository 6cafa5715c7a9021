"""ModelConfig from GGUF metadata (llama.cpp's key names -> Hugging Face terms)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from localinfer.errors import ModelFileError, UnsupportedModelError
from localinfer.loading.gguf_checks import check_config_numbers, check_layer_count, check_layers
from localinfer.loading.gguf_file import GGUFFile
from localinfer.loading.model_config import SUPPORTED_ARCHS, ModelConfig, RopeScaling

# GGUF general.architecture -> ModelConfig.arch. Mistral models convert to "llama" in GGUF.
GGUF_ARCHS = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3": "gemma3",
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
    }
)
TOKEN_TYPE_CONTROL = 3

# Gemma 3: every sixth layer attends globally, the rest use the sliding window (llama.cpp
# hard-codes the same pattern); local layers use RoPE base 10000.
GEMMA3_SWA_PATTERN = 6
GEMMA3_LOCAL_THETA = 10000.0


def gguf_arch(gguf: GGUFFile) -> str:
    arch = gguf.architecture
    if arch not in GGUF_ARCHS:
        raise UnsupportedModelError(
            f"{gguf.path}: architecture '{arch}' is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHS)})"
        )
    return GGUF_ARCHS[arch]


def _uniform_int(gguf: GGUFFile, key: str, value: Any) -> int:
    """Per-layer arrays (some GGUFs store head counts per layer) must be uniform here. Types and
    ranges were checked when the file was opened (gguf_checks.check_header)."""
    if isinstance(value, np.ndarray | list):
        values = set(int(v) for v in value)
        if len(values) != 1:
            raise UnsupportedModelError(
                f"{gguf.path}: '{key}' differs between layers ({sorted(values)}), not supported"
            )
        return values.pop()
    return int(value)


def config_from_gguf(gguf: GGUFFile) -> ModelConfig:
    """The config of a model localinfer runs, with every number checked against the tensors
    (ModelFileError: no backend ever sees an inconsistent file)."""
    arch = gguf_arch(gguf)
    a = gguf.architecture  # key prefix as written in the file

    def req(key: str) -> int:
        return _uniform_int(gguf, f"{a}.{key}", gguf.require(f"{a}.{key}"))

    n_layers = req("block_count")
    check_layer_count(gguf.path, a, n_layers, gguf.tensors)
    hidden = req("embedding_length")
    n_heads = req("attention.head_count")
    n_kv = gguf.get(f"{a}.attention.head_count_kv")
    n_kv_heads = (
        _uniform_int(gguf, f"{a}.attention.head_count_kv", n_kv) if n_kv is not None else n_heads
    )
    key_length = gguf.get(f"{a}.attention.key_length")
    # 0 heads is refused by check_config_numbers below; no division by it here
    head_dim = int(key_length) if key_length else (hidden // n_heads if n_heads > 0 else 0)
    ffn = req("feed_forward_length")
    max_ctx = req("context_length")
    if "token_embd.weight" not in gguf.tensors:
        raise ModelFileError(gguf.path, "missing tensor 'token_embd.weight'")
    vocab_size = gguf.tensors["token_embd.weight"].shape[0]
    rope_theta = float(gguf.get(f"{a}.rope.freq_base", 10000.0))
    rms_eps = float(gguf.get(f"{a}.attention.layer_norm_rms_epsilon", 1e-5))
    value_length = gguf.get(f"{a}.attention.value_length")
    if value_length is not None and int(value_length) != head_dim:
        raise UnsupportedModelError(
            f"{gguf.path}: value heads of {value_length} and key heads of {head_dim} dimensions "
            "(the runners need one head size)"
        )

    rope_scaling, max_ctx = _rope_scaling(gguf, a, head_dim, rope_theta, max_ctx)
    sliding_window, sliding_layers = _sliding(gguf, a, arch, n_layers)
    bos, eos = _special_ids(gguf)
    config = ModelConfig(
        arch=arch,
        n_layers=n_layers,
        hidden_size=hidden,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        ffn_size=ffn,
        vocab_size=vocab_size,
        max_ctx=max_ctx,
        rope_theta=rope_theta,
        rms_eps=rms_eps,
        tied_embeddings="output.weight" not in gguf.tensors,
        qk_norm="blk.0.attn_q_norm.weight" in gguf.tensors,
        attention_bias="blk.0.attn_q.bias" in gguf.tensors,
        rope_scaling=rope_scaling,
        sliding_window=sliding_window,
        sliding_layers=sliding_layers,
        bos_token_id=bos,
        eos_token_ids=eos,
        rope_local_theta=_local_theta(gguf, a, arch),
        query_pre_attn_scalar=float(head_dim) if arch == "gemma3" else None,
    )
    check_config_numbers(gguf.path, config, gguf.get(f"{a}.rope.dimension_count"))
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


def _sliding(
    gguf: GGUFFile, a: str, arch: str, n_layers: int
) -> tuple[int | None, tuple[int, ...]]:
    window = gguf.get(f"{a}.attention.sliding_window")
    if not window:
        return None, ()
    pattern = gguf.get(f"{a}.attention.sliding_window_pattern")
    if isinstance(pattern, np.ndarray | list) and len(pattern) == n_layers:
        layers = tuple(i for i, is_swa in enumerate(pattern) if bool(is_swa))
    elif isinstance(pattern, int) and pattern > 0:
        layers = tuple(i for i in range(n_layers) if (i + 1) % pattern)
    elif arch == "gemma3":
        layers = tuple(i for i in range(n_layers) if (i + 1) % GEMMA3_SWA_PATTERN)
    else:
        layers = tuple(range(n_layers))
    return int(window), layers


def _special_ids(gguf: GGUFFile) -> tuple[int | None, tuple[int, ...]]:
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
    return (int(bos) if bos is not None else None), tuple(eos)
