"""What a reranker declares, and how a (query, document) pair becomes its token ids.

A reranker is a GGUF with llama.cpp's rank pooling (``{arch}.pooling_type`` = 4), or an encoder
that declares no pooling and carries a classifier head (facts/pooling.py): Qwen3-Reranker (a
causal qwen3 whose head is the "yes"/"no" rows of its LM head) is converted with rank pooling,
bge-reranker (BERT-style, a ``cls`` + ``cls.output`` head) with or without it. The head's
outputs are named by ``{arch}.classifier.output_labels``; a pair's score is the first.

A pair is formatted exactly as llama-server's ``format_prompt_rerank`` does (the vendored
llama.cpp's tools/server):

* with a ``tokenizer.chat_template.rerank`` template (Qwen3-Reranker's): ``{query}`` and then
  ``{document}`` replaced in it, the text tokenized with special-token text parsed and nothing
  added;
* otherwise: BOS when the vocabulary adds one, the query, EOS (SEP when there is no EOS) when it
  adds EOS, SEP when it adds SEP, the document, EOS when it adds EOS; query and document are
  tokenized as plain text (special-token text in them is not parsed). A BERT vocabulary adds
  [CLS] and [SEP]: ``[CLS] query [SEP] document [SEP]``; XLM-RoBERTa's (bge-reranker) adds <s>,
  </s> and a separating </s>: ``<s> query </s> </s> document </s>``.

The vocabularies llama.cpp tokenizes for localinfer (loading/tokenizer_bound.py) give their
special tokens and flags from llama.cpp itself. An encoder (BERT) attends to the whole pair at
once and llama.cpp keeps no KV for it, so its pair runs in one ubatch, at most
``ENCODER_PAIR_TOKENS`` (llama-server's default ubatch, which refuses longer pairs too).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from localinfer.errors import ContextOverflowError, InvalidParameterError, UnsupportedModelError
from localinfer.facts.pooling import is_reranker_file
from localinfer.loading.model import LoadedModel
from localinfer.loading.tokenizer import Tokenizer
from localinfer.loading.tokenizer_bound import BoundTokenizer

TEMPLATE_KEY = "tokenizer.chat_template.rerank"
# llama.cpp adds SEP by default for these vocabularies (llama-vocab.cpp); a file's
# tokenizer.ggml.add_sep_token overrides it.
_SEP_MODELS = frozenset({"bert"})
_SEP_PRES = frozenset({"jina-v1-en", "jina-v2-code", "roberta-bpe"})
# The most tokens an encoder's pair may have: one ubatch of llama-server's default size (the
# llama.cpp runner's rank context, backends/llamacpp/rerank.py, runs that size too).
ENCODER_PAIR_TOKENS = 512


@dataclass(frozen=True, slots=True)
class RerankSpec:
    template: str | None  # the rerank template ({query}, {document}); None: BOS/EOS/SEP joins
    labels: tuple[str, ...]  # the head's outputs, in order; the score is the first
    bos: int | None
    eos: int | None  # EOS, or SEP where the vocabulary has no EOS (as llama-server takes it)
    sep: int | None
    add_bos: bool
    add_eos: bool
    add_sep: bool
    whole_pair: int | None = None  # an encoder's pair runs in one ubatch of at most this


def is_reranker(model: LoadedModel) -> bool:
    """Whether ``model`` is a GGUF reranker (module docstring)."""
    gguf = getattr(model.weights, "gguf", None)
    return is_reranker_file(_metadata(model), getattr(gguf, "tensors", None) or {})


class NotARerankerError(UnsupportedModelError):
    """A model asked to rerank that is no reranker: a request's mistake (the server's 400)."""

    def __init__(self, name: str, arch: str) -> None:
        super().__init__(
            f"model '{name}' is not a reranker: its file declares no rank pooling "
            f"('{arch}.pooling_type' = 4, as llama.cpp converts Qwen3-Reranker) and is no "
            "encoder with a classifier head (bge-reranker); use a reranker GGUF"
        )


def rerank_spec(model: LoadedModel, name: str | None = None) -> RerankSpec:
    """The pair format and head of ``model`` (``name``: the id its errors give, its file's name
    by default); NotARerankerError when it is no reranker."""
    metadata = _metadata(model)
    arch = metadata.get("general.architecture") or model.config.arch
    if not is_reranker(model):
        raise NotARerankerError(name or model.name, arch)
    labels = metadata.get(f"{arch}.classifier.output_labels")
    template = metadata.get(TEMPLATE_KEY)
    causal = metadata.get(f"{arch}.attention.causal")
    encoder = causal is not None and not bool(causal)
    tok = model.tokenizer
    if isinstance(tok, BoundTokenizer):  # llama.cpp's own specials and flags
        s = tok.specials
        return RerankSpec(
            template=str(template) if template else None,
            labels=tuple(str(x) for x in labels) if labels is not None else ("score",),
            bos=s.bos,
            eos=s.eos if s.eos is not None else s.sep,
            sep=s.sep,
            add_bos=s.add_bos,
            add_eos=s.add_eos,
            add_sep=s.add_sep,
            whole_pair=ENCODER_PAIR_TOKENS if encoder else None,
        )
    eos = _int(metadata.get("tokenizer.ggml.eos_token_id"))
    sep = _int(metadata.get("tokenizer.ggml.seperator_token_id"))  # GGUF's own spelling
    default_sep = (
        metadata.get("tokenizer.ggml.model") in _SEP_MODELS
        or metadata.get("tokenizer.ggml.pre") in _SEP_PRES
    )
    return RerankSpec(
        template=str(template) if template else None,
        labels=tuple(str(x) for x in labels) if labels is not None else ("score",),
        bos=tok.bos_id,
        eos=eos if eos is not None else sep,
        sep=sep,
        add_bos=bool(tok.add_bos),
        add_eos=bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
        add_sep=bool(metadata.get("tokenizer.ggml.add_sep_token", default_sep)),
        whole_pair=ENCODER_PAIR_TOKENS if encoder else None,
    )


def pair_ids(tokenizer: Tokenizer, spec: RerankSpec, query: str, document: str) -> list[int]:
    """The token ids of one (query, document) pair (module docstring)."""
    if spec.template is not None:
        text = spec.template.replace("{query}", query).replace("{document}", document)
        return tokenizer.encode(text, add_special_tokens=False, parse_special=True)
    q = tokenizer.encode(query, add_special_tokens=False, parse_special=False)
    d = tokenizer.encode(document, add_special_tokens=False, parse_special=False)
    ids: list[int] = []
    if spec.add_bos and spec.bos is not None:
        ids.append(spec.bos)
    ids += q
    if spec.add_eos and spec.eos is not None:
        ids.append(spec.eos)
    if spec.add_sep and spec.sep is not None:
        ids.append(spec.sep)
    ids += d
    if spec.add_eos and spec.eos is not None:
        ids.append(spec.eos)
    return ids


class PairTooLongError(ContextOverflowError):
    """A query-document pair longer than the context (or than an encoder's one ubatch);
    ``field`` names the document."""

    def __init__(self, index: int, requested: int, limit: int, whole: bool = False) -> None:
        self.field = f"documents[{index}]"
        why = f", which this encoder scores whole, in one ubatch of {limit}" if whole else ""
        super().__init__(requested, limit, what=f"{self.field} with the query{why}")


def pairs_ids(
    tokenizer: Tokenizer, spec: RerankSpec, query: str, documents: Sequence[str], max_ctx: int
) -> list[list[int]]:
    """Every document's pair with ``query`` as token ids; InvalidParameterError for a pair of no
    tokens, PairTooLongError for one longer than ``max_ctx`` or an encoder's ubatch (nothing is
    truncated)."""
    whole = spec.whole_pair is not None and spec.whole_pair < max_ctx
    limit = spec.whole_pair if whole and spec.whole_pair is not None else max_ctx
    out = []
    for i, document in enumerate(documents):
        ids = pair_ids(tokenizer, spec, query, document)
        if not ids:
            raise InvalidParameterError(
                f"documents[{i}]: the query and this document make no tokens"
            )
        if len(ids) > limit:
            raise PairTooLongError(i, len(ids), limit, whole)
        out.append(ids)
    return out


def ranked(scores: Sequence[float], top_n: int | None = None) -> list[int]:
    """Document indices by score, highest first (ties in document order), ``top_n`` of them."""
    order = sorted(range(len(scores)), key=lambda i: -float(scores[i]))
    return order if top_n is None else order[:top_n]


def _metadata(model: LoadedModel) -> dict[str, Any]:
    gguf = getattr(model.weights, "gguf", None)
    return getattr(gguf, "metadata", None) or {}


def _int(value: Any) -> int | None:
    return None if value is None else int(value)
