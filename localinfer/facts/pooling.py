"""How an embedding pools a sequence's final hidden states (after the final norm): their mean,
the last token's or the first token's (BERT's [CLS]); every vector is then L2-normalised. A model
declares its pooling (loading/embedding_spec.py) and a runner applies it (backends/base.py).

A reranker declares llama.cpp's rank pooling instead (GGUF ``{arch}.pooling_type`` = 4): its
classifier head scores a query-document pair from the pooled state. That is no vector to
normalise, so it is not a ``Pooling``; an engine job asks for it as ``RANK``
(loading/rerank_spec.py, engine/embedding.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

Pooling = Literal["mean", "last", "cls"]
POOLINGS: tuple[Pooling, ...] = ("mean", "last", "cls")
RANK: Final = "rank"
PassKind = Literal["mean", "last", "cls", "rank"]  # what an engine embedding job computes
GGUF_RANK_POOLING = 4  # llama.cpp's LLAMA_POOLING_TYPE_RANK


def declares_rank_pooling(metadata: Mapping[str, Any]) -> bool:
    """Whether a GGUF header's metadata declares rank pooling: the file is a reranker."""
    value = metadata.get(f"{metadata.get('general.architecture')}.pooling_type")
    try:
        return value is not None and int(value) == GGUF_RANK_POOLING
    except (TypeError, ValueError):
        return False
