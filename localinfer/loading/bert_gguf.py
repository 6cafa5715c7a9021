"""BERT-family GGUFs (``general.architecture`` "bert": BERT, RoBERTa and XLM-RoBERTa as llama.cpp's
converter writes them), which only llama.cpp runs here: the rerankers among them (bge-reranker-
base, -large, -v2-m3: a ``cls`` + ``cls.output`` classifier head) score query-document pairs
through llama.cpp's rank pooling.

localinfer's own runners implement no encoder (learned positions, LayerNorm, bidirectional
attention), so the backend choice sends such a file to llama.cpp, and its weights are never read
through localinfer's loader; the tensors llama.cpp's bert loader reads are checked here against
the header's numbers before llama.cpp sees the file. Their vocabularies, WordPiece (BERT,
``tokenizer.ggml.model`` "bert") and SentencePiece Unigram (XLM-RoBERTa, "t5"), are tokenized by
llama.cpp itself (loading/tokenizer_bound.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from localinfer.errors import ModelFileError
from localinfer.loading.model_config import ModelConfig

BERT = "bert"  # general.architecture and ModelConfig.arch
# The vocabularies llama.cpp tokenizes for localinfer (WordPiece, Unigram).
LLAMACPP_TOKENIZERS = frozenset({"bert", "t5"})
TOKEN_TYPE_COUNT = "tokenizer.ggml.token_type_count"  # BERT's segment embeddings


def check_bert_layers(
    path: Path, c: ModelConfig, tensors: Mapping[str, Any], metadata: Mapping[str, Any]
) -> None:
    """Every tensor llama.cpp's bert loader requires is present with the shape the header's
    numbers give (numpy order: [out, in]), and the optional ones it reads have theirs."""
    h, f = c.hidden_size, c.ffn_size
    types = int(metadata.get(TOKEN_TYPE_COUNT) or 0)
    if types < 1:  # llama.cpp refuses the file without it
        raise _fail(path, f"missing or zero metadata key '{TOKEN_TYPE_COUNT}'")
    want: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (c.vocab_size, h),
        "position_embd.weight": (c.max_ctx, h),
        "token_embd_norm.weight": (h,),
        "token_embd_norm.bias": (h,),
    }
    layer = {
        "attn_output.weight": (h, c.q_size),
        "attn_output_norm.weight": (h,),
        "attn_output_norm.bias": (h,),
        "ffn_up.weight": (f, h),
        "ffn_down.weight": (h, f),
        "layer_output_norm.weight": (h,),
        "layer_output_norm.bias": (h,),
    }
    for i in range(c.n_layers):
        want.update({f"blk.{i}.{name}": shape for name, shape in layer.items()})
        if f"blk.{i}.attn_qkv.weight" not in tensors:
            want.update(
                {
                    f"blk.{i}.attn_q.weight": (c.q_size, h),
                    f"blk.{i}.attn_k.weight": (c.kv_size, h),
                    f"blk.{i}.attn_v.weight": (c.kv_size, h),
                }
            )
    optional = {"token_types.weight": (types, h), "cls.weight": (h, h), "cls.bias": (h,)}
    for name, shape in optional.items():
        if name in tensors:
            want[name] = shape
    for name, shape in want.items():
        info = tensors.get(name)
        if info is None:
            raise _fail(path, f"missing tensor '{name}' (bert, {c.n_layers} layers)")
        if tuple(info.shape) != shape:
            raise _fail(
                path,
                f"tensor '{name}' has shape {tuple(info.shape)} but the header's numbers give "
                f"{shape}",
            )


def _fail(path: Path, reason: str) -> ModelFileError:
    return ModelFileError(path, f"malformed GGUF file: {reason}")
