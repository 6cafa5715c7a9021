"""A vocabulary localinfer does not tokenize itself (WordPiece, ``tokenizer.ggml.model`` "bert";
SentencePiece Unigram, "t5"): llama.cpp's tokenizer, reached through the runner that loaded it.

The loader makes a ``BoundTokenizer`` from the GGUF's token list, which says what each id is (its
text, its bytes, whether it is a control token). Encoding and decoding are llama.cpp's own
(``llama_tokenize``, ``llama_detokenize``), bound by the llama.cpp runner when it loads the model
(backends/llamacpp/vocab.py) and unbound when it closes, so the ids are exactly the ones llama.cpp
and llama-server give. So are the special tokens and which of them the vocabulary adds
(``VocabSpecials``: llama.cpp's defaults per vocabulary type, overridden by the file's keys).
Before a runner binds it (another backend, or none yet), encoding raises UnsupportedModelError.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from localinfer.errors import UnsupportedModelError
from localinfer.loading.tokenizer import Tokenizer
from localinfer.loading.unicode_text import scrub_surrogates


@dataclass(frozen=True, slots=True)
class VocabSpecials:
    """llama.cpp's special tokens (None: the vocabulary has none) and whether it adds them."""

    bos: int | None
    eos: int | None
    sep: int | None
    add_bos: bool
    add_eos: bool
    add_sep: bool


class VocabCalls(Protocol):
    """What a runner lends a BoundTokenizer: llama.cpp's tokenizer over the loaded vocabulary."""

    specials: VocabSpecials

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]: ...

    def detokenize(self, ids: Sequence[int], remove_special: bool) -> str: ...


class BoundTokenizer(Tokenizer):
    """A Tokenizer whose encode and decode are llama.cpp's (module docstring)."""

    def __init__(
        self,
        tokens: Sequence[str],
        control_ids: Sequence[int],
        *,
        kind: str,
        bos_id: int | None,
        eos_ids: Sequence[int],
        source: str,
    ) -> None:
        # Tokenizer's own HF tokenizer is never used here: a one-token stand-in fills the slot.
        stand_in = HFTokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
        super().__init__(
            stand_in,
            tokens=tokens,
            byte_mode="sentencepiece",  # "\u2581" is a space in WordPiece and Unigram pieces alike
            special_ids=control_ids,
            bos_id=bos_id,
            eos_ids=eos_ids,
            source=source,
        )
        self.kind = kind
        self._ids: dict[str, int] = {}
        for i, token in enumerate(tokens):
            self._ids.setdefault(token, i)
        self._calls: VocabCalls | None = None

    def bind(self, calls: VocabCalls | None) -> None:
        """Lend llama.cpp's tokenizer (None: take it back, as a closing runner does)."""
        self._calls = calls
        if calls is not None:
            s = calls.specials
            self.add_bos, self.add_eos = s.add_bos, s.add_eos

    @property
    def bound(self) -> bool:
        return self._calls is not None

    @property
    def specials(self) -> VocabSpecials:
        """llama.cpp's special tokens for this vocabulary (needs a runner: module docstring)."""
        return self._require().specials

    def encode(
        self, text: str, add_special_tokens: bool = False, parse_special: bool = True
    ) -> list[int]:
        """llama.cpp's ids for ``text``; ``add_special_tokens``: the specials the vocabulary
        adds (BERT's [CLS] ... [SEP]), as llama.cpp adds them."""
        return self._require().tokenize(scrub_surrogates(text), add_special_tokens, parse_special)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._require().detokenize(list(ids), skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._ids.get(token)

    @property
    def hf(self) -> HFTokenizer:
        raise UnsupportedModelError(
            f"{self.source}: its '{self.kind}' vocabulary is tokenized by llama.cpp only"
        )

    def _require(self) -> VocabCalls:
        calls = self._calls
        if calls is None:
            raise UnsupportedModelError(
                f"{self.source}: its '{self.kind}' vocabulary (WordPiece or Unigram) is tokenized "
                "by llama.cpp; run the model with --backend llamacpp"
            )
        return calls

    def __repr__(self) -> str:
        return f"BoundTokenizer({self.source!r}, {self.kind}, vocab={self.vocab_size})"
