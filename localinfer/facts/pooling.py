"""How an embedding pools a sequence's final hidden states (after the final norm): their mean,
the last token's or the first token's (BERT's [CLS]); every vector is then L2-normalised. A model
declares its pooling (loading/embedding_spec.py) and a runner applies it (backends/base.py).

A reranker declares llama.cpp's rank pooling instead (GGUF ``{arch}.pooling_type`` = 4): its
classifier head scores a query-document pair from the pooled state. That is no vector to
normalise, so it is not a ``Pooling``; an engine job asks for it as ``RANK``
(loading/rerank_spec.py, engine/embedding.py). llama.cpp's converter writes no pooling for a
BERT-style cross-encoder (bge-reranker: llama-server takes rank pooling from ``--reranking``):
an encoder that declares none and carries a classifier head is a reranker too."""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any, Final, Literal

Pooling = Literal["mean", "last", "cls"]
POOLINGS: tuple[Pooling, ...] = ("mean", "last", "cls")
RANK: Final = "rank"
PassKind = Literal["mean", "last", "cls", "rank"]  # what an engine embedding job computes
GGUF_RANK_POOLING = 4  # llama.cpp's LLAMA_POOLING_TYPE_RANK
# A sequence classifier's head as llama.cpp's converter names it (dense + out_proj, or out_proj).
CLASSIFIER_HEADS = ("cls.output.weight", "cls.weight")


def declares_rank_pooling(metadata: Mapping[str, Any]) -> bool:
    """Whether a GGUF header's metadata declares rank pooling: the file is a reranker."""
    value = metadata.get(f"{metadata.get('general.architecture')}.pooling_type")
    try:
        return value is not None and int(value) == GGUF_RANK_POOLING
    except (TypeError, ValueError):
        return False


def is_reranker_file(metadata: Mapping[str, Any], tensors: Container[str]) -> bool:
    """Whether a GGUF (its header's metadata and tensor names) is a reranker: it declares rank
    pooling, or it is an encoder (``{arch}.attention.causal`` false) that declares no pooling
    and carries a classifier head, as llama.cpp converts bge-reranker."""
    if declares_rank_pooling(metadata):
        return True
    arch = metadata.get("general.architecture")
    if metadata.get(f"{arch}.pooling_type") is not None:
        return False
    causal = metadata.get(f"{arch}.attention.causal")
    return causal is not None and not causal and any(h in tensors for h in CLASSIFIER_HEADS)
