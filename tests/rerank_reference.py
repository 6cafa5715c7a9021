"""llama.cpp's own reranking through llama-cpp-python's low-level API, as llama-server does it,
written independently of localinfer's code path: the pair's tokens from llama.cpp's tokenizer
and vocabulary flags (``format_prompt_rerank`` of the vendored tools/server), one pair at a time
in a context of llama-server's default shape (rank pooling, 512-token ubatches), the score the
first output of ``llama_get_embeddings_seq``. A pair longer than the ubatch runs in one decode
call of several ubatches, as llama-server's one slot runs it."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from localinfer.backends.llamacpp import native


def _tokenize(llama, vocab, text: str, parse_special: bool) -> list[int]:
    data = text.encode("utf-8")
    room = len(data) + 16
    buf = (llama.llama_token * room)()
    n = llama.llama_tokenize(vocab, data, len(data), buf, room, False, parse_special)
    assert n >= 0, f"llama_tokenize needed {-n} tokens"
    return list(buf[:n])


def _pair(llama, model, vocab, query: str, doc: str) -> list[int]:
    template = llama.llama_model_chat_template(model, b"rerank")
    if template:
        prompt = template.decode().replace("{query}", query).replace("{document}", doc)
        return _tokenize(llama, vocab, prompt, parse_special=True)
    eos = llama.llama_vocab_eos(vocab)
    if eos == llama.LLAMA_TOKEN_NULL:
        eos = llama.llama_vocab_sep(vocab)
    out: list[int] = []
    if llama.llama_vocab_get_add_bos(vocab):
        out.append(llama.llama_vocab_bos(vocab))
    out += _tokenize(llama, vocab, query, parse_special=False)
    if llama.llama_vocab_get_add_eos(vocab):
        out.append(eos)
    if llama.llama_vocab_get_add_sep(vocab):
        out.append(llama.llama_vocab_sep(vocab))
    out += _tokenize(llama, vocab, doc, parse_special=False)
    if llama.llama_vocab_get_add_eos(vocab):
        out.append(eos)
    return out


def llama_cpp_rerank(
    path: Path, query: str, documents: Sequence[str], n_ctx: int = 1024
) -> tuple[list[list[int]], np.ndarray]:
    """Each document's pair tokens and its score, in document order."""
    llama = native.lib()
    model = llama.llama_model_load_from_file(str(path).encode(), llama.llama_model_default_params())
    assert model, f"llama.cpp could not load {path}"
    params = llama.llama_context_default_params()
    params.n_ctx = params.n_batch = n_ctx
    params.n_ubatch = min(512, n_ctx)  # llama-server's default
    params.n_threads = params.n_threads_batch = 1
    params.embeddings = True
    params.pooling_type = llama.LLAMA_POOLING_TYPE_RANK
    ctx = llama.llama_init_from_model(model, params)
    assert ctx, "llama.cpp could not make the rank context"
    vocab = llama.llama_model_get_vocab(model)
    batch = llama.llama_batch_init(n_ctx, 0, 1)
    pairs: list[list[int]] = []
    scores = []
    try:
        for doc in documents:
            ids = _pair(llama, model, vocab, query, doc)
            pairs.append(ids)
            for i, t in enumerate(ids):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, i, 1
                batch.seq_id[i][0], batch.logits[i] = 0, 1
            batch.n_tokens = len(ids)
            llama.llama_memory_clear(llama.llama_get_memory(ctx), True)
            assert llama.llama_decode(ctx, batch) == 0
            out = llama.llama_get_embeddings_seq(ctx, 0)
            scores.append(ctypes.cast(out, ctypes.POINTER(ctypes.c_float))[0])
    finally:
        llama.llama_batch_free(batch)
        llama.llama_free(ctx)
        llama.llama_model_free(model)
    return pairs, np.array(scores, dtype=np.float64)
