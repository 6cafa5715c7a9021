"""What a model declares about its embeddings: how to pool them, and how long they are.

Pooling, read where a model states it:

* GGUF: ``{arch}.pooling_type`` (llama.cpp's enum: 1 mean, 2 cls, 3 last; 0 none);
* a Hugging Face directory with sentence-transformers modules: the Pooling module's
  ``config.json`` (``pooling_mode_mean_tokens``, ``pooling_mode_cls_token``,
  ``pooling_mode_lasttoken``), found through ``modules.json``.

A model that declares none (a chat model such as the embedded SmolLM2) is mean-pooled: over a
causal LM's final states the mean carries the whole text, where the last token's state is shaped
for predicting the next token.

Shorter vectors are served for any model, as OpenAI's text-embedding-3 models serve them: the
first N components, renormalised to unit length (every vector here is normalised). Models
trained for it (Matryoshka: ``is_matryoshka`` or ``matryoshka_dimensions`` in a sentence-
transformers ``config.json``) lose little by the cut; for others it is the client's trade of
quality for size, as with OpenAI's. A length above the model's width is not a shortening: no
vector of that length exists, so it is refused as what this model cannot give
(UnsupportedModelError; the server answers 404, another model may be wider).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localinfer.errors import InvalidParameterError, UnsupportedModelError
from localinfer.facts.pooling import GGUF_RANK_POOLING, Pooling
from localinfer.loading.bert_gguf import BERT
from localinfer.loading.model import LoadedModel

DEFAULT_POOLING: Pooling = "mean"
_GGUF_POOLING: dict[int, Pooling | None] = {0: None, 1: "mean", 2: "cls", 3: "last"}
_ST_POOLING: dict[str, Pooling] = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last",
}
_ST_UNSUPPORTED = (
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
)


@dataclass(frozen=True, slots=True)
class EmbeddingSpec:
    pooling: Pooling
    dimensions: int  # a full vector's length (the hidden size)
    pooling_source: str  # where the pooling was read, or why it is the default

    def check_dimensions(self, asked: int | None, field: str = "dimensions") -> int | None:
        """The length to cut vectors to (None: keep them whole): any from 1 to the model's
        width. InvalidParameterError naming ``field`` below 1; UnsupportedModelError above the
        width (see the module docstring)."""
        if asked is None or asked == self.dimensions:
            return None
        if asked < 1:
            raise InvalidParameterError(f"{field}: must be at least 1, got {asked}")
        if asked > self.dimensions:
            raise UnsupportedModelError(
                f"{field}: {asked} is more than the {self.dimensions} dimensions of this "
                "model's vectors"
            )
        return asked


def shortened(vectors: np.ndarray, dimensions: int | None) -> np.ndarray:
    """The first ``dimensions`` components of each vector, renormalised to unit length."""
    if dimensions is None or dimensions == vectors.shape[1]:
        return vectors
    cut = vectors[:, :dimensions]
    norms = np.linalg.norm(cut, axis=1, keepdims=True)
    return (cut / np.maximum(norms, 1e-12)).astype(np.float32)


def embedding_spec(model: LoadedModel) -> EmbeddingSpec:
    """The model's declared pooling and its vectors' length (see the module docstring);
    UnsupportedModelError for a pooling localinfer does not compute."""
    hidden = model.config.hidden_size
    if model.config.arch == BERT:
        # Embeddings run in pieces whose KV carries the input: llama.cpp keeps none for an
        # encoder, which needs every input whole in one ubatch.
        raise UnsupportedModelError(
            f"{model.name}: a BERT encoder gives no embeddings here (a BERT reranker scores "
            "query-document pairs through /v1/rerank or `localinfer rerank`)"
        )
    declared = _gguf_pooling(model) if model.format == "gguf" else _st_pooling(Path(model.path))
    if declared is None:
        return EmbeddingSpec(DEFAULT_POOLING, hidden, "the default: the model declares none")
    pooling, source = declared
    return EmbeddingSpec(pooling, hidden, source)


def _gguf_pooling(model: LoadedModel) -> tuple[Pooling, str] | None:
    gguf = getattr(model.weights, "gguf", None)
    metadata: dict[str, Any] = getattr(gguf, "metadata", None) or {}
    arch = metadata.get("general.architecture")
    key = f"{arch}.pooling_type"
    value = metadata.get(key)
    if value is None:
        return None
    if int(value) == GGUF_RANK_POOLING:
        raise UnsupportedModelError(
            f"{model.name}: {key} = {value} (rank pooling: a reranker, which scores "
            "query-document pairs through /v1/rerank or `localinfer rerank`) gives no embedding"
        )
    if int(value) not in _GGUF_POOLING:
        raise UnsupportedModelError(
            f"{model.name}: {key} = {value} is not a pooling localinfer computes; it pools by "
            "mean, last or cls token"
        )
    pooling = _GGUF_POOLING[int(value)]
    return None if pooling is None else (pooling, key)


def _st_pooling(path: Path) -> tuple[Pooling, str] | None:
    """The sentence-transformers Pooling module's mode, when the directory has one."""
    modules = _json(path / "modules.json")
    if not isinstance(modules, list):
        return None
    for module in modules:
        if not isinstance(module, dict) or not str(module.get("type", "")).endswith("Pooling"):
            continue
        where = Path(str(module.get("path", ""))) / "config.json"
        config = _json(path / where)
        if not isinstance(config, dict):
            return None
        for key, pooling in _ST_POOLING.items():
            if config.get(key):
                return pooling, f"{where}: {key}"
        used = [k for k in _ST_UNSUPPORTED if config.get(k)]
        if used:
            raise UnsupportedModelError(
                f"{path / where}: {used[0]} is a pooling localinfer does not compute "
                "(it pools by mean, last or cls token)"
            )
    return None


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
