"""gpt-oss GGUFs, which only llama.cpp runs here: the tensors its loader reads, checked against
the header's numbers before llama.cpp sees the file, and the end-of-generation rule of its
o200k_harmony vocabulary.

localinfer's own runners (torch, MLX) implement no mixture of experts in MXFP4, attention sinks
or biased experts; their profiles leave the architecture out, so the backend choice sends a
gpt-oss GGUF to llama.cpp, and the model's weights are never read through localinfer's loader.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from localinfer.errors import ModelFileError
from localinfer.loading.bert_gguf import BERT
from localinfer.loading.model_config import QWEN2_VL, ModelConfig

GPT_OSS = "gpt_oss"  # ModelConfig.arch (Hugging Face's model_type)
GPT_OSS_GGUF = "gpt-oss"  # general.architecture
# Architectures only llama.cpp runs: their GGUFs load without a WeightSource (BERT: bert_gguf.py;
# Qwen2-VL: model_config.py).
LLAMACPP_ONLY_ARCHS = (GPT_OSS, BERT, QWEN2_VL)
# o200k_harmony ends a message with <|end|>, a turn with <|return|> and a tool call with
# <|call|>: with both of the latter in the vocabulary, <|end|> is not an end of generation
# (llama.cpp's rule), so the analysis channel can hand over to the final one.
HARMONY_TURN_ENDS = ("<|return|>", "<|call|>")
HARMONY_MESSAGE_END = "<|end|>"


def harmony_end_ids(tokens: Sequence[str], eog: list[int]) -> list[int]:
    """``eog`` without <|end|> when the vocabulary ends turns with <|return|> and <|call|>."""
    texts = {tokens[i] for i in eog if 0 <= i < len(tokens)}
    if not all(end in texts for end in HARMONY_TURN_ENDS):
        return eog
    return [i for i in eog if tokens[i] != HARMONY_MESSAGE_END]


def check_gpt_oss_layers(
    path: Path, c: ModelConfig, tensors: Mapping[str, Any], metadata: Mapping[str, Any]
) -> None:
    """Every tensor llama.cpp's gpt-oss loader reads is present with the shape the header's
    numbers give (numpy order: [out, in], experts first)."""
    experts = int(_required(path, metadata, "expert_count"))
    ffn = int(metadata.get(f"{GPT_OSS_GGUF}.expert_feed_forward_length") or c.ffn_size)
    q, kv, h = c.q_size, c.kv_size, c.hidden_size
    want: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (c.vocab_size, h),
        "output_norm.weight": (h,),
        "output.weight": (c.vocab_size, h),
    }
    layer: dict[str, tuple[int, ...]] = {
        "attn_norm.weight": (h,),
        "post_attention_norm.weight": (h,),
        "attn_q.weight": (q, h),
        "attn_k.weight": (kv, h),
        "attn_v.weight": (kv, h),
        "attn_output.weight": (h, q),
        "attn_output.bias": (h,),
        "attn_sinks.weight": (c.n_heads,),
        "ffn_gate_inp.weight": (experts, h),
        "ffn_gate_inp.bias": (experts,),
        "ffn_gate_exps.weight": (experts, ffn, h),
        "ffn_up_exps.weight": (experts, ffn, h),
        "ffn_down_exps.weight": (experts, h, ffn),
        "ffn_gate_exps.bias": (experts, ffn),
        "ffn_up_exps.bias": (experts, ffn),
        "ffn_down_exps.bias": (experts, h),
    }
    for i in range(c.n_layers):
        want.update({f"blk.{i}.{name}": shape for name, shape in layer.items()})
    for name, shape in want.items():
        info = tensors.get(name)
        if info is None:
            raise _fail(path, f"missing tensor '{name}' (gpt-oss, {c.n_layers} layers)")
        if tuple(info.shape) != shape:
            raise _fail(
                path,
                f"tensor '{name}' has shape {tuple(info.shape)} but the header's numbers give "
                f"{shape}",
            )


def _required(path: Path, metadata: Mapping[str, Any], key: str) -> Any:
    value = metadata.get(f"{GPT_OSS_GGUF}.{key}")
    if value is None:
        raise ModelFileError(path, f"missing metadata key '{GPT_OSS_GGUF}.{key}'")
    return value


def _fail(path: Path, reason: str) -> ModelFileError:
    return ModelFileError(path, f"malformed GGUF file: {reason}")
