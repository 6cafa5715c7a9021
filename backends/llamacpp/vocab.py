"""llama.cpp's tokenizer lent to a BoundTokenizer (loading/tokenizer_bound.py): the vocabularies
localinfer does not tokenize itself (WordPiece, Unigram: BERT and XLM-RoBERTa rerankers) are
tokenized by the model the runner loaded, with llama.cpp's own special tokens and flags, so the
ids are the ones llama-server gives.

The lender reads the runner's model on each call: once the runner has closed (its model freed),
a call raises instead of touching freed memory. llama.cpp's tokenizer only reads the vocabulary,
so the server's threads may tokenize while the engine thread decodes.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Protocol

from localinfer.errors import BackendUnavailableError
from localinfer.loading.tokenizer import Tokenizer
from localinfer.loading.tokenizer_bound import BoundTokenizer, VocabSpecials

INT32_MIN = -(2**31)  # llama_tokenize's answer when the count overflows


class _Runner(Protocol):  # what of LlamaCppRunner the lender reads
    _llama: object
    _model_ptr: object


class LlamaVocab:
    """``VocabCalls`` over a runner's loaded model."""

    def __init__(self, runner: _Runner) -> None:
        self._runner = runner
        llama, vocab = self._vocab()
        null = llama.LLAMA_TOKEN_NULL

        def special(token: int) -> int | None:
            return None if token == null else int(token)

        self.specials = VocabSpecials(
            bos=special(llama.llama_vocab_bos(vocab)),
            eos=special(llama.llama_vocab_eos(vocab)),
            sep=special(llama.llama_vocab_sep(vocab)),
            add_bos=bool(llama.llama_vocab_get_add_bos(vocab)),
            add_eos=bool(llama.llama_vocab_get_add_eos(vocab)),
            add_sep=bool(llama.llama_vocab_get_add_sep(vocab)),
        )

    def _vocab(self):  # type: ignore[no-untyped-def]  # (llama module, llama_vocab pointer)
        model = getattr(self._runner, "_model_ptr", None)
        if not model:
            raise BackendUnavailableError("the llama.cpp runner that tokenized this model closed")
        llama = self._runner._llama
        return llama, llama.llama_model_get_vocab(model)

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        llama, vocab = self._vocab()
        data = text.encode("utf-8")
        room = len(data) + 8  # a token takes at least a byte, plus the specials added
        while True:
            buf = (llama.llama_token * room)()
            n = llama.llama_tokenize(vocab, data, len(data), buf, room, add_special, parse_special)
            if n >= 0:
                return list(buf[:n])
            if -n <= room or n == INT32_MIN:  # not "room too small, -n needed": a failure
                raise BackendUnavailableError(f"llama_tokenize failed ({n}) on {len(data)} bytes")
            room = -n

    def detokenize(self, ids: Sequence[int], remove_special: bool) -> str:
        llama, vocab = self._vocab()
        tokens = (llama.llama_token * max(1, len(ids)))(*ids)
        room = 16 * len(ids) + 16
        while True:
            buf = ctypes.create_string_buffer(room)
            n = llama.llama_detokenize(vocab, tokens, len(ids), buf, room, remove_special, False)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", "replace")
            room = -n


def lend_vocab(tokenizer: Tokenizer, runner: _Runner) -> None:
    """Bind ``tokenizer`` to llama.cpp's when it is a BoundTokenizer (else leave it)."""
    if isinstance(tokenizer, BoundTokenizer):
        tokenizer.bind(LlamaVocab(runner))
