"""Build a Tokenizer from the vocabulary stored in GGUF metadata, the way llama.cpp reads it.

- ``gpt2`` (byte-level BPE): tokens + merges, with the pre-tokenizer regexes llama.cpp uses for
  the file's ``tokenizer.ggml.pre`` (smollm, llama-bpe, qwen2, gpt-2, default, ...).
- ``llama`` (SentencePiece BPE with byte fallback: Llama 2, Mistral, Gemma): merges are derived
  from the scores, as Hugging Face's converter does.

Building from ~50k tokens and merges takes a moment, so the built tokenizer JSON is cached under
the cache dir, keyed by a hash of the file's metadata section (the vocabulary lives there).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from localinfer.errors import ModelFileError, UnsupportedModelError
from localinfer.loading.bert_gguf import LLAMACPP_TOKENIZERS
from localinfer.loading.gguf_config import gguf_special_ids
from localinfer.loading.gguf_file import GGUFFile
from localinfer.loading.tokenizer import SPIECE_SPACE, ByteMode, Tokenizer
from localinfer.loading.tokenizer_bound import BoundTokenizer
from localinfer.paths import cache_dir

log = logging.getLogger(__name__)

BUILDER_VERSION = "1"  # bump when the built JSON would change for the same file

# GGUF tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE = 1, 2, 3, 4, 5, 6

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# o200k (gpt-oss) as its tokenizer.json writes it: llama.cpp spells the case classes
# with lookaheads its regex engine lacks; Oniguruma reads the original.
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp's split regexes per tokenizer.ggml.pre, applied in order (llama-vocab.cpp).
PRE_TOKENIZER_REGEXES: dict[str, tuple[str, ...]] = {
    "gpt-4o": (_GPT4O,),
    "llama3": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "smollm": (r"\p{N}", _GPT2),
    "gpt2": (_GPT2,),
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
}
PRE_ALIASES = {
    "llama-bpe": "llama3",
    "llama-v3": "llama3",
    "falcon3": "llama3",
    "pixtral": "llama3",
    "dbrx": "llama3",
    "smaug-bpe": "llama3",
    "deepseek-r1-qwen": "qwen2",
    "stablelm2": "qwen2",
    "starcoder": "smollm",
    "refact": "smollm",
    "command-r": "smollm",
    "codeshell": "smollm",
    "exaone": "smollm",
    "minerva-7b": "smollm",
    "gpt-2": "gpt2",
    "phi-2": "gpt2",
    "jina-es": "gpt2",
    "jina-de": "gpt2",
    "mpt": "gpt2",
    "olmo": "gpt2",
    "jais": "gpt2",
}
# llama-bpe vocabularies match whole pre-tokens before merging (Llama 3's ignore_merges).
IGNORE_MERGES = {"llama3"}


def tokenizer_from_gguf(gguf: GGUFFile, use_cache: bool = True) -> Tokenizer:
    tokens = gguf.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ModelFileError(gguf.path, "missing metadata key 'tokenizer.ggml.tokens'")
    kind = gguf.get("tokenizer.ggml.model", "")
    types = gguf.get("tokenizer.ggml.token_type")
    if types is None or len(types) != len(tokens):
        types = [TT_NORMAL] * len(tokens)
    types = [int(t) for t in types]

    if kind in LLAMACPP_TOKENIZERS:  # WordPiece, Unigram: llama.cpp's (tokenizer_bound.py)
        bos, eos = gguf_special_ids(gguf)
        control = [i for i, t in enumerate(types) if t == TT_CONTROL]
        return BoundTokenizer(
            tokens, control, kind=kind, bos_id=bos, eos_ids=eos, source=str(gguf.path)
        )
    if kind == "gpt2":
        byte_mode: ByteMode = "byte_level"
        build = _build_byte_level_bpe
    elif kind == "llama":
        byte_mode = "sentencepiece"
        build = _build_sentencepiece_bpe
    else:
        raise UnsupportedModelError(
            f"{gguf.path}: tokenizer model '{kind}' is not supported (supported: gpt2, llama; "
            "bert and t5 with --backend llamacpp)"
        )

    hf = _cached(gguf, lambda: build(gguf, tokens, types)) if use_cache else None
    if hf is None:
        hf = build(gguf, tokens, types)
    bos, eos = gguf_special_ids(gguf)
    default_add_bos = kind == "llama"  # llama.cpp's default for SentencePiece vocabularies
    return Tokenizer(
        hf,
        tokens=tokens,
        byte_mode=byte_mode,
        special_ids=[i for i, t in enumerate(types) if t == TT_CONTROL],
        bos_id=bos,
        eos_ids=eos,
        add_bos=bool(gguf.get("tokenizer.ggml.add_bos_token", default_add_bos)),
        add_eos=bool(gguf.get("tokenizer.ggml.add_eos_token", False)),
        source=str(gguf.path),
    )


def _cached(gguf: GGUFFile, build) -> HFTokenizer:  # type: ignore[no-untyped-def]
    key = hashlib.sha256(f"{BUILDER_VERSION}:{gguf.header_digest()}".encode()).hexdigest()[:32]
    path = cache_dir() / "tokenizers" / f"{key}.json"
    if path.is_file():
        try:
            return HFTokenizer.from_file(str(path))
        except Exception as exc:  # a damaged cache entry is rebuilt, never fatal
            log.warning("rebuilding cached tokenizer %s: %s", path, exc)
    hf = build()
    _atomic_write(path, hf.to_str())
    return hf


def _atomic_write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as exc:  # a read-only cache only costs speed
        log.warning("could not cache tokenizer at %s: %s", path, exc)


def _vocab(tokens: list[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)  # duplicates (rare) keep their first id
    return vocab


def _add_special(hf: HFTokenizer, tokens: list[str], types: list[int]) -> None:
    """Control tokens match as specials; user-defined tokens always match (as llama.cpp does)."""
    added = []
    for t, ty in zip(tokens, types, strict=True):
        if ty in (TT_CONTROL, TT_USER_DEFINED) and t:
            added.append(AddedToken(t, special=ty == TT_CONTROL, normalized=False))
    hf.add_tokens(added)


def _build_byte_level_bpe(gguf: GGUFFile, tokens: list[str], types: list[int]) -> HFTokenizer:
    merges_raw = gguf.get("tokenizer.ggml.merges")
    if not merges_raw:
        raise ModelFileError(gguf.path, "missing metadata key 'tokenizer.ggml.merges'")
    merges = []
    for m in merges_raw:
        left, sep, right = m.partition(" ")
        if not sep:
            raise ModelFileError(gguf.path, f"malformed merge {m!r} in tokenizer.ggml.merges")
        merges.append((left, right))
    pre = str(gguf.get("tokenizer.ggml.pre", "default"))
    pre = PRE_ALIASES.get(pre, pre)
    if pre not in PRE_TOKENIZER_REGEXES:
        log.warning(
            "%s: unknown tokenizer.ggml.pre '%s', using llama.cpp's default", gguf.path, pre
        )
        pre = "default"
    model = models.BPE(_vocab(tokens), merges, ignore_merges=pre in IGNORE_MERGES, fuse_unk=False)
    hf = HFTokenizer(model)
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [
            *(
                pre_tokenizers.Split(Regex(r), behavior="isolated")
                for r in PRE_TOKENIZER_REGEXES[pre]
            ),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    hf.decoder = decoders.ByteLevel()
    _add_special(hf, tokens, types)
    return hf


def _build_sentencepiece_bpe(gguf: GGUFFile, tokens: list[str], types: list[int]) -> HFTokenizer:
    scores = gguf.get("tokenizer.ggml.scores")
    if scores is None or len(scores) != len(tokens):
        raise ModelFileError(gguf.path, "missing or short metadata key 'tokenizer.ggml.scores'")
    vocab = _vocab(tokens)
    # Merges: every split of a normal token into two vocabulary pieces, best-scoring merged
    # token first (llama.cpp's SentencePiece tokenizer merges the highest-scoring pair first).
    mergeable = {t: float(s) for t, s, ty in zip(tokens, scores, types, strict=True) if ty == 1}
    ranked: list[tuple[float, int, int, str, str]] = []
    for piece, score in mergeable.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in mergeable and right in mergeable:
                ranked.append((-score, vocab[left], vocab[right], left, right))
    ranked.sort()
    merges = [(left, right) for *_, left, right in ranked]
    unk_id = next((i for i, t in enumerate(types) if t == TT_UNKNOWN), None)
    unk = tokens[unk_id] if unk_id is not None else None
    model = models.BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True)
    hf = HFTokenizer(model)
    add_prefix = bool(gguf.get("tokenizer.ggml.add_space_prefix", True))
    steps = [normalizers.Replace(" ", SPIECE_SPACE)]
    if add_prefix:
        steps.insert(0, normalizers.Prepend(SPIECE_SPACE))
    hf.normalizer = normalizers.Sequence(steps)
    dec = [decoders.Replace(SPIECE_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix:
        dec.append(decoders.Strip(" ", 1, 0))
    hf.decoder = decoders.Sequence(dec)
    _add_special(hf, tokens, types)
    return hf
