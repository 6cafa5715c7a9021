"""Tokenizer: text <-> ids, plus the raw bytes of each token for UTF-8-safe streaming.

One class over a Hugging Face ``tokenizers.Tokenizer``, whatever it was built from (GGUF metadata
in tokenizer_gguf.py, or a tokenizer.json here). Special tokens written in the text (for example
``<|im_start|>`` in a rendered chat template) become their single ids.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Literal

from tokenizers import Tokenizer as HFTokenizer

from localinfer.errors import ModelFileError
from localinfer.loading.unicode_text import scrub_surrogates

# How a token's vocabulary string maps back to bytes.
#   byte_level:    GPT-2 byte-to-unicode alphabet (every byte is one printable char)
#   sentencepiece: "▁" is a space, "<0xAB>" is the raw byte 0xAB
#   plain:         the string itself, UTF-8 encoded
ByteMode = Literal["byte_level", "sentencepiece", "plain"]
SPIECE_SPACE = "\u2581"


@lru_cache(maxsize=1)
def byte_level_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: printable stand-in char -> byte value."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\u00a1"), ord("\u00ac") + 1),
        *range(ord("\u00ae"), ord("\u00ff") + 1),
    ]
    chars = list(printable)
    shift = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + shift)
            shift += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _spiece_bytes(token: str) -> bytes:
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return bytes([int(token[3:5], 16)])
        except ValueError:
            pass
    return token.replace(SPIECE_SPACE, " ").encode("utf-8")


def _byte_level_bytes(token: str) -> bytes:
    table = byte_level_decoder()
    out = bytearray()
    for ch in token:
        b = table.get(ch)
        if b is None:  # not a byte-level char (an added token stored as plain text)
            out += ch.encode("utf-8")
        else:
            out.append(b)
    return bytes(out)


class Tokenizer:
    """Text <-> token ids for one model."""

    def __init__(
        self,
        hf: HFTokenizer,
        *,
        tokens: Sequence[str] | None = None,
        byte_mode: ByteMode = "byte_level",
        special_ids: Iterable[int] = (),
        bos_id: int | None = None,
        eos_ids: Iterable[int] = (),
        add_bos: bool = False,
        add_eos: bool = False,
        source: str = "",
    ) -> None:
        self._hf = hf
        self._hf_raw: HFTokenizer | None = None  # lazily built twin that ignores special tokens
        self._lock = threading.Lock()
        if tokens is None:
            size = hf.get_vocab_size(with_added_tokens=True)
            tokens = [hf.id_to_token(i) or "" for i in range(size)]
        self._tokens = list(tokens)
        self.byte_mode: ByteMode = byte_mode
        self.special_ids: frozenset[int] = frozenset(special_ids)
        self.bos_id = bos_id
        self.eos_ids: tuple[int, ...] = tuple(eos_ids)
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.source = source
        self._bytes_cache: list[bytes | None] = [None] * len(self._tokens)

    # -- construction ----------------------------------------------------------------------

    @classmethod
    def from_json_file(
        cls,
        path: str | Path,
        *,
        bos_token: str | None = None,
        eos_tokens: Sequence[str] = (),
        eos_ids: Sequence[int] = (),
        add_bos: bool | None = None,
        add_eos: bool = False,
    ) -> Tokenizer:
        """A tokenizer.json (Hugging Face format). BOS/EOS are added by ``encode``; ``add_bos``
        None means: as the file's post-processor does (Llama 3 prepends <|begin_of_text|>)."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
            spec = json.loads(text)
            hf = HFTokenizer.from_str(text)
        except FileNotFoundError:
            raise ModelFileError(path, "no such file") from None
        except (OSError, UnicodeDecodeError, ValueError, Exception) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ModelFileError(path, f"malformed tokenizer.json: {reason}") from None
        template_bos = _post_processor_bos(spec.get("post_processor"))
        if add_bos is None:
            add_bos = template_bos is not None
        if bos_token is None and template_bos is not None:
            bos_token = template_bos
        # BOS/EOS are added by encode() from the model's settings, never by a template processor.
        hf.post_processor = None
        special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
        ids = list(eos_ids)
        for tok in eos_tokens:
            tid = hf.token_to_id(tok)
            if tid is not None and tid not in ids:
                ids.append(tid)
        return cls(
            hf,
            byte_mode=_json_byte_mode(spec),
            special_ids=special,
            bos_id=hf.token_to_id(bos_token) if bos_token else None,
            eos_ids=ids,
            add_bos=add_bos,
            add_eos=add_eos,
            source=str(path),
        )

    # -- the interface -----------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def encode(
        self, text: str, add_special_tokens: bool = False, parse_special: bool = True
    ) -> list[int]:
        """Token ids of ``text``. Special-token text such as ``<|im_start|>`` maps to its single
        id unless ``parse_special`` is False. ``add_special_tokens`` adds BOS/EOS when the model
        asks for them (GGUF ``add_bos_token``, tokenizer_config ``add_bos_token``). Lone
        surrogates (which ``tokenizers`` cannot take) are encoded as U+FFFD."""
        hf = self._hf if parse_special else self._raw_hf()
        ids = hf.encode(scrub_surrogates(text), add_special_tokens=False).ids
        if add_special_tokens:
            if self.add_bos and self.bos_id is not None:
                ids = [self.bos_id, *ids]
            if self.add_eos and self.eos_ids:
                ids = [*ids, self.eos_ids[0]]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token; concatenating them and decoding as UTF-8 gives the text.
        Special tokens give their literal text (``b"<|im_end|>"``)."""
        cached = self._bytes_cache[token_id]
        if cached is not None:
            return cached
        token = self._tokens[token_id]
        if token_id in self.special_ids or self.byte_mode == "plain":
            out = token.encode("utf-8")
        elif self.byte_mode == "byte_level":
            out = _byte_level_bytes(token)
        else:
            out = _spiece_bytes(token)
        self._bytes_cache[token_id] = out
        return out

    def token_to_id(self, token: str) -> int | None:
        return self._hf.token_to_id(scrub_surrogates(token))

    def id_to_token(self, token_id: int) -> str:
        if not 0 <= token_id < len(self._tokens):
            raise IndexError(
                f"token id {token_id} outside the vocabulary (0..{self.vocab_size - 1})"
            )
        return self._tokens[token_id]

    def is_special(self, token_id: int) -> bool:
        return token_id in self.special_ids

    @property
    def hf(self) -> HFTokenizer:
        """The underlying ``tokenizers.Tokenizer`` (batch encoding, offsets)."""
        return self._hf

    def _raw_hf(self) -> HFTokenizer:
        with self._lock:
            if self._hf_raw is None:
                raw = HFTokenizer.from_str(self._hf.to_str())
                raw.encode_special_tokens = True
                self._hf_raw = raw
            return self._hf_raw

    def __repr__(self) -> str:
        return f"Tokenizer({self.source!r}, vocab={self.vocab_size}, {self.byte_mode})"


def _post_processor_bos(proc: object) -> str | None:
    """The special token a TemplateProcessing post-processor puts first, if any."""
    if not isinstance(proc, dict):
        return None
    if proc.get("type") == "Sequence":
        for inner in proc.get("processors") or []:
            found = _post_processor_bos(inner)
            if found:
                return found
        return None
    if proc.get("type") == "TemplateProcessing":
        single = proc.get("single") or []
        if single and isinstance(single[0], dict) and "SpecialToken" in single[0]:
            return str(single[0]["SpecialToken"]["id"])
    return None


def _json_byte_mode(spec: dict) -> ByteMode:
    """Tell how tokens map to bytes from a tokenizer.json's model and decoder."""
    blob = json.dumps(spec.get("decoder")) + json.dumps(spec.get("pre_tokenizer"))
    if '"ByteLevel"' in blob:
        return "byte_level"
    model = spec.get("model") or {}
    if model.get("byte_fallback") or '"ByteFallback"' in blob or "Metaspace" in blob:
        return "sentencepiece"
    return "plain"
