"""Fill-in-the-middle (FIM) prompts: which FIM tokens a model's vocabulary has, and the prompt
they make from the text before the cursor (prefix) and after it (suffix).

One table, ``FIM_FAMILIES``, says per model family its marker tokens, their order and the tokens
that end a middle:

    PSM  prefix-suffix-middle  <|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>
    SPM  suffix-prefix-middle  [SUFFIX]{suffix}[PREFIX]{prefix}        (Codestral: no middle mark)

A family is detected from the vocabulary alone: each of its markers must be one added token
(``Tokenizer.token_to_id``), so a chat model that merely could spell ``<fim_prefix>`` is not
mistaken for a FIM model. BOS goes first when the model wants one. The prefix and suffix are
tokenized as plain text: a marker spelled in the user's file (``"<|fim_middle|>"`` in code being
edited) stays characters, even where the vocabulary matches that token anywhere (Qwen's FIM tokens
are not "special", and added tokens that are not special match even with special-token parsing
off). A SentencePiece vocabulary's dummy space stays on the prefix and is kept off the suffix,
as Meta's ``encode_infilling`` and llama.cpp's infill do: ``" <PRE> {prefix} <SUF>{suffix} <MID>"``.

Prefix reuse (the engine keeps an idle slot's KV for a prompt that starts the same way): while a
user types, the text above the cursor grows and the text below stays. PSM puts the prefix first,
so successive prompts share the marker and the prefix typed so far, and the suffix is prefilled
again each time; SPM puts the unchanged suffix first, so they share the suffix and the prefix, and
only the new line is prefilled. When the cursor moves down into existing code instead, the suffix
loses its first line and SPM shares nothing; PSM still shares the prefix.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from localinfer.errors import InvalidParameterError
from localinfer.loading.unicode_text import scrub_surrogates

if TYPE_CHECKING:
    from localinfer.loading.tokenizer import Tokenizer

FimOrder = Literal["psm", "spm"]

# A catalog model whose vocabulary has FIM tokens, named when a model has none.
FIM_EXAMPLE_MODEL = "qwen2.5-coder-0.5b"

# Put before a suffix to take a SentencePiece vocabulary's dummy space (Meta's CodeLlama code).
_SENTINEL = "\u263a"


@dataclass(frozen=True, slots=True)
class FimFamily:
    """One row of the table: a family's FIM markers (each as the spellings vocabularies use) and
    the tokens that end a middle besides end-of-sequence, used where the vocabulary has them."""

    name: str
    prefix: tuple[str, ...]
    suffix: tuple[str, ...]
    middle: tuple[str, ...]  # empty: the middle follows the prefix at once (Codestral)
    order: FimOrder
    stops: tuple[str, ...] = ()


_QWEN_STOPS = (
    "<|endoftext|>",
    "<|fim_pad|>",
    "<|file_sep|>",
    "<|repo_name|>",
    "<|im_end|>",
    "<|im_start|>",
    "<|fim_prefix|>",
    "<|fim_suffix|>",
    "<|fim_middle|>",
)
_STARCODER_STOPS = (
    "<|endoftext|>",
    "<fim_pad>",
    "<file_sep>",
    "<repo_name>",
    "<filename>",
    "<fim_prefix>",
    "<fim_suffix>",
    "<fim_middle>",
)

FIM_FAMILIES: tuple[FimFamily, ...] = (
    # Qwen2.5-Coder, Qwen2.5, Qwen3 (and Granite, which spells them the same way)
    FimFamily(
        "qwen", ("<|fim_prefix|>",), ("<|fim_suffix|>",), ("<|fim_middle|>",), "psm", _QWEN_STOPS
    ),
    # StarCoder / StarCoder2 vocabularies
    FimFamily(
        "starcoder",
        ("<fim_prefix>",),
        ("<fim_suffix>",),
        ("<fim_middle>",),
        "psm",
        _STARCODER_STOPS,
    ),
    # SantaCoder, the first of the StarCoder family
    FimFamily(
        "santacoder",
        ("<fim-prefix>",),
        ("<fim-suffix>",),
        ("<fim-middle>",),
        "psm",
        ("<|endoftext|>", "<fim-pad>"),
    ),
    # Codestral (mistral-common's encode_fim: BOS [SUFFIX] suffix [PREFIX] prefix)
    FimFamily("codestral", ("[PREFIX]",), ("[SUFFIX]",), (), "spm"),
    # CodeLlama: its vocabularies spell the markers with SentencePiece's space ("▁<PRE>")
    FimFamily(
        "codellama",
        ("<PRE>", "▁<PRE>"),
        ("<SUF>", "▁<SUF>"),
        ("<MID>", "▁<MID>"),
        "psm",
        ("<EOT>", "▁<EOT>"),
    ),
    # DeepSeek-Coder: begin = prefix, hole = suffix, end = middle
    FimFamily(
        "deepseek-coder",
        ("<｜fim▁begin｜>",),
        ("<｜fim▁hole｜>",),
        ("<｜fim▁end｜>",),
        "psm",
        ("<|EOT|>", "<｜end▁of▁sentence｜>"),
    ),
)


@dataclass(frozen=True, slots=True)
class FimFormat:
    """A family found in one vocabulary: its marker ids and the ids that end a middle."""

    family: FimFamily
    prefix_id: int
    suffix_id: int
    middle_id: int | None
    stop_ids: tuple[int, ...]
    added_ids: frozenset[int]  # every added token of the vocabulary
    dummy_space: bool  # the tokenizer puts a space before any text (SentencePiece's "▁")

    def prompt_ids(self, tokenizer: Tokenizer, prefix: str, suffix: str) -> list[int]:
        head = [self.prefix_id, *self.text_ids(tokenizer, prefix)]
        tail = [self.suffix_id, *self._suffix_ids(tokenizer, suffix)]
        ids = head + tail if self.family.order == "psm" else tail + head
        if self.middle_id is not None:
            ids.append(self.middle_id)
        if tokenizer.add_bos and tokenizer.bos_id is not None:
            ids.insert(0, tokenizer.bos_id)
        return ids

    def text_ids(self, tokenizer: Tokenizer, text: str) -> list[int]:
        """``text`` as plain text: no added token is matched in it."""
        if not text:
            return []
        ids = tokenizer.encode(text, add_special_tokens=False, parse_special=False)
        if self.added_ids.isdisjoint(ids):
            return ids
        # The text spells an added token that matches even with special tokens off.
        return unmatched_ids(tokenizer, text)

    def _suffix_ids(self, tokenizer: Tokenizer, suffix: str) -> list[int]:
        if not self.dummy_space or not suffix:
            return self.text_ids(tokenizer, suffix)
        # Meta's encode_infilling: a character that merges with nothing takes the dummy space,
        # and its own tokens are dropped (llama.cpp drops a lone space token: the fallback).
        mark = self.text_ids(tokenizer, _SENTINEL)
        ids = self.text_ids(tokenizer, _SENTINEL + suffix)
        if ids[: len(mark)] == mark:
            return ids[len(mark) :]
        ids = self.text_ids(tokenizer, suffix)
        return ids[1:] if tokenizer.token_bytes(ids[0]) == b" " else ids


def unmatched_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """``text``'s ids by the tokenizer's own steps (normalizer, pre-tokenizer, model) without
    its added-token split: what ``encode`` gives for text that spells no added token."""
    hf = tokenizer.hf
    text = scrub_surrogates(text)
    if hf.normalizer is not None:
        text = hf.normalizer.normalize_str(text)
    pieces = hf.pre_tokenizer.pre_tokenize_str(text) if hf.pre_tokenizer else [(text, None)]
    return [token.id for piece, _ in pieces for token in hf.model.tokenize(piece)]


# Detection reads the added tokens (thousands in some vocabularies): once per tokenizer.
_FOUND: weakref.WeakKeyDictionary[Tokenizer, FimFormat | None] = weakref.WeakKeyDictionary()


def find_fim_format(tokenizer: Tokenizer) -> FimFormat | None:
    """The first family of ``FIM_FAMILIES`` whose markers are all added tokens of
    ``tokenizer``, or None. Remembered per tokenizer."""
    if tokenizer in _FOUND:
        return _FOUND[tokenizer]
    found = _FOUND[tokenizer] = _detect(tokenizer)
    return found


def _detect(tokenizer: Tokenizer) -> FimFormat | None:
    added = frozenset(tokenizer.hf.get_added_tokens_decoder())

    def marker(spellings: tuple[str, ...]) -> int | None:
        for text in spellings:
            tid = tokenizer.token_to_id(text)
            if tid is not None and tid in added:
                return tid
        return None

    for family in FIM_FAMILIES:
        prefix, suffix, middle = marker(family.prefix), marker(family.suffix), None
        if prefix is None or suffix is None:
            continue
        if family.middle:
            middle = marker(family.middle)
            if middle is None:
                continue
        stops = [marker((text,)) for text in family.stops]
        stop_ids = tuple(dict.fromkeys(s for s in stops if s is not None))
        probe = tokenizer.encode("a", add_special_tokens=False, parse_special=False)
        dummy = bool(probe) and tokenizer.token_bytes(probe[0]).startswith(b" ")
        return FimFormat(family, prefix, suffix, middle, stop_ids, added, dummy)
    return None


def fim_format(
    tokenizer: Tokenizer, *, field: str = "suffix", model: str | None = None
) -> FimFormat:
    """The FIM format of ``tokenizer``; InvalidParameterError (400) naming ``field`` when the
    vocabulary has no FIM tokens, with a catalog model that has them."""
    found = find_fim_format(tokenizer)
    if found is not None:
        return found
    who = f"model '{model}'" if model else "this model"
    markers = ", ".join(family.prefix[0] for family in FIM_FAMILIES)
    raise InvalidParameterError(
        f"{field}: {who} cannot fill in the middle: its vocabulary has no FIM tokens (none of "
        f"{markers}); use a code model trained for it, e.g. {FIM_EXAMPLE_MODEL} "
        f"(localinfer pull {FIM_EXAMPLE_MODEL})"
    )


def fim_prompt_ids(
    tokenizer: Tokenizer,
    prefix: str,
    suffix: str,
    *,
    field: str = "suffix",
    model: str | None = None,
) -> list[int]:
    """The prompt asking ``tokenizer``'s model for the text between ``prefix`` and ``suffix``
    (BOS as the model wants; the text never parsed for special tokens)."""
    return fim_format(tokenizer, field=field, model=model).prompt_ids(tokenizer, prefix, suffix)


def fim_stop_ids(tokenizer: Tokenizer) -> tuple[int, ...]:
    """The tokens that end a middle (end-of-sequence stops every answer anyway); () when the
    vocabulary has no FIM tokens."""
    found = find_fim_format(tokenizer)
    return () if found is None else found.stop_ids
