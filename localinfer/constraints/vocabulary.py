"""The model's vocabulary as a grammar engine needs it: the bytes of every token, which ids are
special (never text), which ids end the answer, and the tokenizer's own encoder."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class TokenizerLike(Protocol):
    """What the adapter reads from localinfer.loading.tokenizer.Tokenizer."""

    vocab_size: int
    special_ids: frozenset[int]
    eos_ids: tuple[int, ...]

    def token_bytes(self, token_id: int) -> bytes: ...

    def encode(
        self, text: str, add_special_tokens: bool = False, parse_special: bool = True
    ) -> list[int]: ...


@dataclass(frozen=True, slots=True)
class ConstraintVocabulary:
    """``tokens[i]`` is the raw bytes of id ``i``; ids past the tokenizer up to ``size`` (a model
    whose logits are padded) are empty and never allowed."""

    tokens: tuple[bytes, ...]
    special_ids: frozenset[int]
    eos_ids: tuple[int, ...]
    encode: Callable[[str], list[int]]

    @property
    def size(self) -> int:
        return len(self.tokens)


def vocabulary_from_tokenizer(
    tokenizer: TokenizerLike, logits_size: int | None = None
) -> ConstraintVocabulary:
    """Adapt a project tokenizer. ``logits_size`` is the width of the model's logits when it is
    larger than the tokenizer's vocabulary."""
    if not tokenizer.eos_ids:
        raise ValueError("the tokenizer names no end-of-sequence token; constraints need one")
    count = tokenizer.vocab_size
    size = max(count, logits_size or 0)
    tokens = [tokenizer.token_bytes(i) for i in range(count)] + [b""] * (size - count)
    return ConstraintVocabulary(
        tokens=tuple(tokens),
        special_ids=frozenset(tokenizer.special_ids),
        eos_ids=tuple(tokenizer.eos_ids),
        encode=lambda text: tokenizer.encode(text, parse_special=False),
    )
