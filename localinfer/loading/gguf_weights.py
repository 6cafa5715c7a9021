"""GGUF tensors as a WeightSource: Hugging Face names and layout, dequantized lazily to float32.

Two layout differences are undone here so runners see one layout whatever the file:
- llama.cpp's converter permutes the Q/K projection rows of llama-architecture models for its
  interleaved ("normal") RoPE; Hugging Face uses rotate-half. ``unpermute_qk`` reverses it.
- Gemma's converter stores RMSNorm weights as (1 + w); Hugging Face stores w.
"""

from __future__ import annotations

import re

import numpy as np

from localinfer.errors import UnsupportedModelError
from localinfer.loading.gguf_file import GGUFFile
from localinfer.loading.gpt_oss import LLAMACPP_ONLY_ARCHS
from localinfer.loading.model_config import ModelConfig

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# Tensors that carry no Hugging Face weight: their content is folded into the config.
_CONFIG_ONLY = {"rope_freqs.weight"}
# A reranker's classifier head (llama.cpp's rank pooling reads it; generation does not).
_RANK_HEAD = {"cls.weight", "cls.bias", "cls.output.weight", "cls.output.bias"}

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_norm": "post_attention_layernorm",
}
# Gemma 3 has four norms per layer; GGUF's ffn_norm is the pre-feed-forward one there.
_GEMMA3_LAYER_NAMES = {
    **_LAYER_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.([a-z0-9_]+)\.(weight|bias)$")

# GGUF types whose blocks the torch runner's native CPU kernels multiply by as stored
# (backends/torch/block_weights.py); the one list backend choice, budget and speculation use.
STORED_BLOCK_TYPES = ("Q8_0", "Q4_0", "Q4_1")

# Archs whose GGUF Q/K rows were permuted by the converter (llama.cpp rope type "normal").
PERMUTED_QK_ARCHS = ("llama", "mistral")


def permute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp converter's permutation (HF rotate-half rows -> interleaved pairs).

    Per head, rows [x0..x_{d/2-1}, y0..y_{d/2-1}] become [x0, y0, x1, y1, ...].
    w: [n_heads * head_dim, ...] (weight rows or bias).
    """
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of permute_qk: interleaved pairs back to Hugging Face rotate-half rows."""
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_to_hf_name(gguf_name: str, arch: str) -> str | None:
    """The Hugging Face name for a GGUF tensor name; None if it has no counterpart."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.match(gguf_name)
    if not m:
        return None
    layer, part, kind = m.groups()
    table = _GEMMA3_LAYER_NAMES if arch == "gemma3" else _LAYER_NAMES
    if part not in table:
        return None
    return f"model.layers.{layer}.{table[part]}.{kind}"


class GGUFWeights:
    """WeightSource over an open GGUFFile; each get() dequantizes one tensor on demand."""

    def __init__(self, gguf: GGUFFile, config: ModelConfig) -> None:
        self.gguf = gguf
        self.config = config
        self._hf_to_gguf: dict[str, str] = {}
        if config.arch in LLAMACPP_ONLY_ARCHS:
            return  # llama.cpp reads the file itself; no runner here reads these weights
        unknown: list[str] = []
        for name in gguf.tensors:
            hf = gguf_to_hf_name(name, config.arch)
            if hf is not None:
                self._hf_to_gguf[hf] = name
            elif name not in _CONFIG_ONLY and name not in _RANK_HEAD:
                unknown.append(name)
        if unknown:
            # e.g. mixture-of-experts tensors (ffn_gate_exps): running without them would be wrong.
            shown = ", ".join(unknown[:3]) + (" ..." if len(unknown) > 3 else "")
            raise UnsupportedModelError(
                f"{gguf.path}: {len(unknown)} tensors this {config.arch} loader does not know "
                f"({shown})"
            )

    def names(self) -> list[str]:
        return list(self._hf_to_gguf)

    def gguf_name(self, name: str) -> str:
        return self._hf_to_gguf[name]

    def get(self, name: str) -> np.ndarray:
        gguf_name = self._hf_to_gguf[name]  # KeyError if absent, as the protocol says
        w = self._hf_row_order(name, self.gguf.dequantize(gguf_name))
        cfg = self.config
        if cfg.arch == "gemma3" and name.endswith("norm.weight"):
            w = w - 1.0
        return np.ascontiguousarray(w, dtype=np.float32)

    def stored_rows(self, name: str) -> tuple[str, np.ndarray] | None:
        """A 2-D tensor stored in Q8_0, Q4_0 or Q4_1 as (type, uint8 block rows [out, bytes])
        in Hugging Face row order: Q/K rows un-permuted as ``get`` does (a row permutation, so
        whole block rows move); None for any other type. A view of the file when no rows move."""
        info = self.gguf.tensors[self._hf_to_gguf[name]]  # KeyError if absent
        if info.type_name not in STORED_BLOCK_TYPES or len(info.shape) != 2:
            return None
        return info.type_name, self._hf_row_order(name, self.gguf.raw(info.name))

    def release_pages(self) -> None:
        """The file's pages read so far leave this process's resident memory (GGUFFile)."""
        self.gguf.release_pages()

    def _hf_row_order(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Q/K rows of llama-style GGUFs back in Hugging Face order (llama.cpp permutes them
        for its RoPE layout); any other tensor as it is."""
        cfg = self.config
        if cfg.arch in PERMUTED_QK_ARCHS:
            if ".self_attn.q_proj." in name:
                return unpermute_qk(rows, cfg.n_heads)
            if ".self_attn.k_proj." in name:
                return unpermute_qk(rows, cfg.n_kv_heads)
        return rows

    def raw(self, name: str) -> np.ndarray:
        """Stored bytes in GGUF layout (no un-permutation), for runners with quantized kernels."""
        return self.gguf.raw(self._hf_to_gguf[name])

    def quant_type(self, name: str) -> str:
        return self.gguf.tensors[self._hf_to_gguf[name]].type_name

    def shape(self, name: str) -> tuple[int, ...]:
        return self.gguf.tensors[self._hf_to_gguf[name]].shape

    def nbytes(self) -> int:
        return self.gguf.tensor_nbytes()
