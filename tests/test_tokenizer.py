"""Tokenizer: parity with llama.cpp on the embedded model, bytes per token, caching, JSON files."""

from __future__ import annotations

import json
import sys

import pytest
from gguf_writer import finish_gguf
from model_files import SPECIALS, TINY_VOCAB_SIZE, tiny_tokenizer_json

from localinfer.errors import ModelFileError, UnsupportedModelError
from localinfer.loading import tokenizer_gguf
from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.gguf_file import GGUFFile
from localinfer.loading.tokenizer import Tokenizer
from localinfer.loading.tokenizer_gguf import tokenizer_from_gguf

CORPUS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "def square(x: int) -> int:\n    return x ** 2  # comment\n\n\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "1234567890 3.14159 1,000,000 -42 0x1F",
    "你好，世界！日本語のテキスト。한국어 문장입니다.",
    "emoji 😀🎉👨\u200d👩\u200d👧 done 🇫🇷",
    "   leading spaces and\t\ttabs\n \n  trailing   ",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "don't it's we'll they're I'M YOU'VE",
    "naïve café résumé Ünïcödé Ωmega",
    "",
    " ",
    "\n\n\n",
    "a  b   c    d     e",
    "<|endoftext|>x<file_sep>y<filename>",
    "http://example.com/path?q=1&b=2#frag",
    "Ω≈ç√∫˜µ≤≥÷ ∀x∈ℝ: x²≥0",
    "\u200b zero width \u00a0nbsp",
    "ﷺ ١٢٣ ٤٥٦ עברית",
    "<|im_start|><|im_start|>nested<|im_end|",
]


pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.fixture(scope="module")
def embedded_gguf() -> GGUFFile:
    return GGUFFile(embedded_model_path())


@pytest.fixture(scope="module")
def tok(embedded_gguf, tmp_path_factory) -> Tokenizer:
    return tokenizer_from_gguf(embedded_gguf, use_cache=False)


def test_basic_properties(tok):
    assert tok.vocab_size == 49152
    assert tok.bos_id == 1
    assert tok.eos_ids[0] == 2
    assert tok.token_to_id("<|im_start|>") == 1
    assert tok.token_to_id("<|im_end|>") == 2
    assert tok.id_to_token(2) == "<|im_end|>"
    assert {0, 1, 2} <= tok.special_ids
    assert not tok.add_bos
    with pytest.raises(IndexError):
        tok.id_to_token(49152)


def test_special_tokens_are_single_ids(tok):
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert ids.count(1) == 1 and ids.count(2) == 1
    # Without special parsing the same text is ordinary characters.
    raw = tok.encode("<|im_start|>user", parse_special=False)
    assert 1 not in raw and len(raw) > 3


@pytest.mark.parametrize("text", CORPUS)
def test_round_trip_and_token_bytes(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode("utf-8")


def test_token_bytes_split_multibyte_characters(tok):
    # The emoji's four bytes straddle tokens: a single token is not valid UTF-8 on its own.
    ids = tok.encode(" 😀")
    pieces = [tok.token_bytes(i) for i in ids]
    assert b"".join(pieces) == " 😀".encode()
    assert len(pieces) >= 2
    with pytest.raises(UnicodeDecodeError):
        pieces[0].decode("utf-8")


def test_skip_special_tokens(tok):
    ids = tok.encode("<|im_start|>assistant\nok<|im_end|>")
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\nok"


def test_add_special_tokens_follows_the_model(tok):
    # SmolLM2's GGUF says add_bos_token = false, as llama.cpp obeys.
    assert tok.encode("hi", add_special_tokens=True) == tok.encode("hi")


@pytest.mark.llamacpp
def test_parity_with_llama_cpp(tok):
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(embedded_model_path()), vocab_only=True, verbose=False)
    long_text = "\n".join(CORPUS) * 3
    for text in [*CORPUS, long_text]:
        expected = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        assert tok.encode(text) == expected, text
        plain = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
        assert tok.encode(text, parse_special=False) == plain, text
        assert tok.encode(text, add_special_tokens=True) == llm.tokenize(
            text.encode("utf-8"), add_bos=True, special=True
        )


def test_cache_is_written_and_used(embedded_gguf, tmp_path, monkeypatch):
    first = tokenizer_from_gguf(embedded_gguf)
    cached = list((tmp_path / "cache" / "tokenizers").glob("*.json"))
    assert len(cached) == 1

    def no_build(*args, **kwargs):
        raise AssertionError("rebuilt although cached")

    monkeypatch.setattr(tokenizer_gguf, "_build_byte_level_bpe", no_build)
    second = tokenizer_from_gguf(embedded_gguf)
    text = CORPUS[2] + CORPUS[5]
    assert second.encode(text) == first.encode(text)


def test_damaged_cache_is_rebuilt(embedded_gguf, tmp_path):
    tokenizer_from_gguf(embedded_gguf)
    (entry,) = (tmp_path / "cache" / "tokenizers").glob("*.json")
    entry.write_text("{ not json")
    tok = tokenizer_from_gguf(embedded_gguf)
    assert tok.encode("Hello world") == [19556, 905]
    assert json.loads(entry.read_text())["model"]["type"] == "BPE"


def test_from_json_file(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text(tiny_tokenizer_json())
    tok = Tokenizer.from_json_file(path, bos_token="<|im_start|>", eos_tokens=["<|im_end|>"])
    assert tok.vocab_size == TINY_VOCAB_SIZE
    assert tok.bos_id == 1 and tok.eos_ids == (2,)
    assert tok.byte_mode == "byte_level"
    assert tok.special_ids == {0, 1, 2}
    text = "<|im_start|>say the thin otter 😀<|im_end|>"
    ids = tok.encode(text)
    assert ids[0] == 1 and ids[-1] == 2
    assert tok.token_to_id("Ġthe") in ids
    assert tok.decode(ids) == text
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode()
    assert [tok.id_to_token(i) for i in range(3)] == SPECIALS


def test_from_json_file_same_ids_as_gguf_build(tok, tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text(tok.hf.to_str())
    again = Tokenizer.from_json_file(path)
    for text in CORPUS:
        assert again.encode(text) == tok.encode(text)


def test_malformed_tokenizer_json(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text('{"model": {"type": "Nope"}}')
    with pytest.raises(ModelFileError, match="tokenizer.json"):
        Tokenizer.from_json_file(path)
    with pytest.raises(ModelFileError, match="no such file"):
        Tokenizer.from_json_file(tmp_path / "missing.json")


def test_unsupported_tokenizer_model(tmp_path):
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "t.gguf"), arch="llama")
    w.add_tokenizer_model("rwkv")
    w.add_token_list(["a", "b"])
    finish_gguf(w)
    with pytest.raises(UnsupportedModelError, match="rwkv"):
        tokenizer_from_gguf(GGUFFile(tmp_path / "t.gguf"))


@pytest.mark.slow
@pytest.mark.llamacpp
def test_sentencepiece_parity_with_llama_cpp_gemma3(tmp_path_factory):
    """Gemma 3's SentencePiece vocabulary (262k tokens, byte fallback) against llama.cpp."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from model_files import gemma3_gguf

    path = gemma3_gguf(tmp_path_factory.mktemp("gemma3"))
    tok = tokenizer_from_gguf(GGUFFile(path))
    assert tok.byte_mode == "sentencepiece" and tok.add_bos and tok.bos_id == 2
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    extra = ["<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n", "  two leading"]
    for text in [*CORPUS, *extra]:
        assert tok.encode(text) == llm.tokenize(text.encode(), add_bos=False, special=True), text
        assert tok.encode(text, add_special_tokens=True)[0] == 2
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert b"".join(tok.token_bytes(i) for i in ids) == text.encode()


def test_cache_and_data_dirs_follow_env(tmp_path, monkeypatch):
    from localinfer import paths

    monkeypatch.setenv("LOCALINFER_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("LOCALINFER_DATA_DIR", str(tmp_path / "d"))
    assert paths.cache_dir() == tmp_path / "c" and (tmp_path / "c").is_dir()
    assert paths.data_dir() == tmp_path / "d" and (tmp_path / "d").is_dir()
    monkeypatch.delenv("LOCALINFER_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # platformdirs on Linux
    if sys.platform.startswith("linux"):
        assert paths.cache_dir() == tmp_path / "xdg" / "localinfer"


def test_gguf_without_vocabulary(tmp_path):
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "t.gguf"), arch="llama")
    finish_gguf(w)
    with pytest.raises(ModelFileError, match="tokenizer.ggml.tokens"):
        tokenizer_from_gguf(GGUFFile(tmp_path / "t.gguf"))


PRE_TYPES = ["llama-bpe", "qwen2", "smollm", "gpt-2", "default", "starcoder", "stablelm2"]
SPLIT_TEXTS = ["x  ,  123 1234 12 123456", "don't (( ((x)) \n\n\n  \n", " 1 12 , ,"]


@pytest.mark.llamacpp
def test_pre_tokenizer_parity_with_llama_cpp(tmp_path):
    """Each tokenizer.ggml.pre splits text as llama.cpp does (a tiny vocabulary whose merges
    only form when a pre-tokenizer keeps digits, spaces or newlines together)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from model_files import write_gguf
    from tiny import tiny_config, tiny_weights

    config = tiny_config("llama", vocab_size=TINY_VOCAB_SIZE, n_layers=1)
    src = tiny_weights(config)
    weights = {n: src.get(n) for n in src.names()}
    seen = set()
    for pre in PRE_TYPES:
        path = write_gguf(tmp_path / f"{pre}.gguf", config, weights, pre=pre)
        tok = tokenizer_from_gguf(GGUFFile(path), use_cache=False)
        llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        for text in [*CORPUS, *SPLIT_TEXTS]:
            expected = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
            assert tok.encode(text) == expected, (pre, text)
        seen.add(tuple(tuple(tok.encode(t)) for t in SPLIT_TEXTS))
    assert len(seen) >= 4, "the pre-tokenizers should split these texts differently"
