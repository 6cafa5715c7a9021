"""A tiny random BERT-style reranker written as llama.cpp's converter writes bge-reranker: a
``bert`` GGUF (non-causal, learned positions, LayerNorm with biases) whose classifier head is
``cls`` (dense + tanh) then ``cls.output`` (one logit, label "LABEL_0"). llama.cpp scores a pair
as that logit over the first token's state.

Two vocabularies, as the converter writes them:

* ``"wpm"``: BERT's WordPiece (``tokenizer.ggml.model`` "bert"): words with the phantom space
  "\u2581" in front, word pieces without; [CLS] is BOS and [SEP] EOS and SEP, so a pair is
  ``[CLS] query [SEP] document [SEP]``;
* ``"ugm"``: XLM-RoBERTa's SentencePiece Unigram (``tokenizer.ggml.model`` "t5"), the one
  bge-reranker-base, -large and -v2-m3 have: ``<s> query </s> </s> document </s>``.

``rank_pooling=False`` leaves ``bert.pooling_type`` out, as a converted bge-reranker may: the
classifier head is then what makes it a reranker (llama-server takes the pooling from
``--reranking``).
"""

from __future__ import annotations

import string
from collections.abc import Collection
from pathlib import Path
from typing import Literal

import gguf
import numpy as np

from tests.gguf_writer import finish_gguf

Vocab = Literal["wpm", "ugm"]
# A context longer than llama-server's 512-token ubatch, as bge-reranker-v2-m3's 8192 is.
HIDDEN, HEADS, LAYERS, FFN, CTX = 64, 4, 2, 128, 1024
SPACE = "\u2581"
# Whole words of the tests' queries and documents, so that most of a pair is words, not letters.
TEXT = (
    "what is the capital of france paris berlin germany cat sat on mat dog long x a an and city "
    "country river 12 123 don t query document"
)
NORMAL, UNKNOWN, CONTROL = 1, 2, 3


def wordpiece_vocab() -> tuple[list[str], list[int]]:
    """[PAD] [UNK] [CLS] [SEP] [MASK], then every printable ASCII character as a word start and as
    a piece, then whole words: any ASCII text tokenizes."""
    chars = [c for c in string.printable if not c.isspace() and not c.isupper()]
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens += [SPACE + c for c in chars] + chars + [SPACE + w for w in TEXT.split() if len(w) > 1]
    types = [CONTROL, UNKNOWN, CONTROL, CONTROL, CONTROL] + [NORMAL] * (len(tokens) - 5)
    return tokens, types


def unigram_vocab() -> tuple[list[str], list[int], list[float]]:
    """<s> <pad> </s> <unk>, then single characters (with and without "\u2581") and whole words,
    longer pieces scoring higher, as a trained Unigram model's would."""
    chars = [c for c in string.printable if not c.isspace()]
    tokens = ["<s>", "<pad>", "</s>", "<unk>", SPACE]
    tokens += [SPACE + c for c in chars] + chars + [SPACE + w for w in TEXT.split() if len(w) > 1]
    types = [CONTROL, CONTROL, CONTROL, UNKNOWN] + [NORMAL] * (len(tokens) - 4)
    scores = [0.0] * 4 + [-10.0 + 0.5 * len(t) for t in tokens[4:]]
    return tokens, types, scores


def _add_vocab(w: gguf.GGUFWriter, vocab: Vocab) -> int:
    if vocab == "wpm":
        tokens, types = wordpiece_vocab()
        w.add_tokenizer_model("bert")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types(types)
        # What gguf's SpecialVocab writes for a BERT tokenizer (its TemplateProcessing "[CLS] $A
        # [SEP] $B [SEP]"): CLS as BOS, SEP as EOS, no separate SEP between the two.
        w.add_bos_token_id(2)
        w.add_eos_token_id(3)
        w.add_sep_token_id(3)
        w.add_unk_token_id(1)
        w.add_pad_token_id(0)
        w.add_mask_token_id(4)
        w.add_add_bos_token(True)
        w.add_add_eos_token(True)
        w.add_add_sep_token(False)
        return len(tokens)
    tokens, types, scores = unigram_vocab()
    w.add_tokenizer_model("t5")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_add_space_prefix(True)
    w.add_remove_extra_whitespaces(True)
    # XLM-RoBERTa's RobertaProcessing: BOS, EOS and SEP all added.
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_sep_token_id(2)
    w.add_unk_token_id(3)
    w.add_pad_token_id(1)
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    w.add_add_sep_token(True)
    return len(tokens)


def _layer_tensors(rng: np.random.Generator, i: int) -> dict[str, np.ndarray]:
    def normal(*shape: int, scale: float = 0.08) -> np.ndarray:
        return rng.normal(0.0, scale, size=shape).astype(np.float32)

    out: dict[str, np.ndarray] = {}
    for name, shape in (
        ("attn_q", (HIDDEN, HIDDEN)),
        ("attn_k", (HIDDEN, HIDDEN)),
        ("attn_v", (HIDDEN, HIDDEN)),
        ("attn_output", (HIDDEN, HIDDEN)),
        ("ffn_up", (FFN, HIDDEN)),
        ("ffn_down", (HIDDEN, FFN)),
    ):
        out[f"blk.{i}.{name}.weight"] = normal(*shape)
        out[f"blk.{i}.{name}.bias"] = normal(shape[0], scale=0.02)
    for norm in ("attn_output_norm", "layer_output_norm"):
        out[f"blk.{i}.{norm}.weight"] = 1.0 + normal(HIDDEN, scale=0.05)
        out[f"blk.{i}.{norm}.bias"] = normal(HIDDEN, scale=0.02)
    return out


def write_tiny_bert_reranker(
    path: Path,
    *,
    vocab: Vocab = "wpm",
    rank_pooling: bool = True,
    seed: int = 0,
    leave_out: Collection[str] = (),
) -> Path:
    """Write the tiny BERT reranker (module docstring) at ``path``, without the tensors named in
    ``leave_out`` (a malformed file); returns it."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch="bert")
    w.add_name("tiny bert reranker")
    w.add_block_count(LAYERS)
    w.add_context_length(CTX)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    if rank_pooling:
        w.add_pooling_type(gguf.PoolingType.RANK)
    w.add_classifier_output_labels(["LABEL_0"])
    n_vocab = _add_vocab(w, vocab)
    w.add_token_type_count(2 if vocab == "wpm" else 1)
    tensors = {
        "token_embd.weight": rng.normal(0.0, 0.5, size=(n_vocab, HIDDEN)),
        "token_types.weight": rng.normal(0.0, 0.1, size=(2 if vocab == "wpm" else 1, HIDDEN)),
        "position_embd.weight": rng.normal(0.0, 0.1, size=(CTX, HIDDEN)),
        "token_embd_norm.weight": 1.0 + rng.normal(0.0, 0.05, size=HIDDEN),
        "token_embd_norm.bias": rng.normal(0.0, 0.02, size=HIDDEN),
    }
    for i in range(LAYERS):
        tensors.update(_layer_tensors(rng, i))
    # The head: a logit of a few units' spread, so pairs score apart.
    tensors["cls.weight"] = rng.normal(0.0, 0.2, size=(HIDDEN, HIDDEN))
    tensors["cls.bias"] = rng.normal(0.0, 0.02, size=HIDDEN)
    tensors["cls.output.weight"] = rng.normal(0.0, 0.5, size=(1, HIDDEN))
    tensors["cls.output.bias"] = np.array([0.1])
    for name, data in tensors.items():
        if name not in leave_out:
            w.add_tensor(name, np.asarray(data, dtype=np.float32))
    finish_gguf(w)
    return path
