"""What the tiny planted-chain models share (tests/harmony_model.py for gpt-oss,
tests/think_model.py for the ``<think>`` formats): a byte-level BPE vocabulary that holds a chat
format's special tokens and whole-word tokens, and a planted next-token table.

The table (``chain``: token -> its successor) is planted in the embeddings and the LM head: the
embeddings of the chain's tokens are orthonormal (rms 1) and the head maps each to its successor,
so while the rest of the network adds little to the residual stream, a greedy decode follows the
chain from the prompt's last token whatever came before it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from localinfer.loading.tokenizer import byte_level_decoder

CONTROL, NORMAL, USER_DEFINED = 3, 1, 4  # GGUF token types


def planted_vocab(
    specials: Sequence[str], words: Sequence[str], user_defined: Sequence[str] = ()
) -> tuple[list[str], list[int], list[str]]:
    """Tokens (``specials`` as control tokens, ``user_defined`` as user-defined ones, the 256
    byte-level characters, then ``words`` and their prefixes, each word built by merges left to
    right; "Ġ" is a space, "Ċ" a newline), their GGUF token types, and the merges."""
    byte_chars = sorted(byte_level_decoder(), key=byte_level_decoder().__getitem__)
    tokens = [*specials, *user_defined, *byte_chars]
    merges: list[str] = []
    for word in words:
        for cut in range(1, len(word)):
            merge = f"{word[:cut]} {word[cut]}"
            if merge not in merges:
                merges.append(merge)
            if word[: cut + 1] not in tokens:
                tokens.append(word[: cut + 1])
    types = [CONTROL] * len(specials) + [USER_DEFINED] * len(user_defined)
    types += [NORMAL] * (len(tokens) - len(types))
    return tokens, types, merges


@dataclass(frozen=True)
class PlantedChain:
    """The embeddings and LM head ([vocab, hidden], float32) that carry a chain, and the unit
    directions left orthogonal to every planted embedding (``spare``: [n, hidden]), for a
    model's own switches."""

    embd: np.ndarray
    head: np.ndarray
    spare: np.ndarray


def plant_chain(
    rng: np.random.Generator,
    vocab: Sequence[str],
    chain: Mapping[str, str],
    hidden: int,
    logit_scale: float,
    extra: Sequence[str] = (),
) -> PlantedChain:
    """Random embeddings with ``chain`` planted: the successor's logit is about
    ``logit_scale * sqrt(hidden)`` above every other (after the final RMS norm). The ``extra``
    tokens get orthonormal embeddings too, with no successor (for a switch to read)."""
    ids = {t: i for i, t in enumerate(vocab)}
    planted = sorted({ids[t] for pair in chain.items() for t in pair} | {ids[t] for t in extra})
    embd = rng.normal(size=(len(vocab), hidden)).astype(np.float32)
    basis, _ = np.linalg.qr(rng.normal(size=(hidden, hidden)))
    embd[planted] = basis[: len(planted)] * np.sqrt(hidden)  # orthogonal, rms 1
    head = np.zeros((len(vocab), hidden), dtype=np.float32)
    for token, successor in chain.items():
        head[ids[successor]] += logit_scale * embd[ids[token]] / np.sqrt(hidden)
    spare = basis[len(planted) :].astype(np.float32)
    return PlantedChain(embd, head, spare)
