"""localinfer.fim: the FIM format table read from vocabularies (each family's markers, order, BOS
and stop tokens), user text that spells a marker staying text, the 400 for a model without FIM
tokens, and `localinfer generate --suffix` through cli.main on a tiny random FIM model (#21)."""

from __future__ import annotations

import itertools
import json
import string
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from tokenizers import AddedToken, decoders, models, normalizers
from tokenizers import Tokenizer as HFTokenizer

from bench.autocomplete import typing_workload
from bench.fim_model import write_fim_model as write_bench_fim_model
from localinfer.catalog import HFSource, load_catalog
from localinfer.cli import main
from localinfer.engine import Request, SamplingParams
from localinfer.errors import InvalidParameterError
from localinfer.fim import (
    FIM_EXAMPLE_MODEL,
    fim_prompt_ids,
    fim_stop_ids,
    find_fim_format,
    unmatched_ids,
)
from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.gguf_file import GGUFFile
from localinfer.loading.loader import load_model
from localinfer.loading.tokenizer import Tokenizer
from localinfer.session import open_session
from tests.model_files import TINY_VOCAB_SIZE, tiny_tokenizer_json, write_hf_dir
from tests.tiny import tiny_config, tiny_weights

QWEN_FIM = ["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>",
            "<|file_sep|>"]  # fmt: skip
PREFIX = 'def add(a, b):\n    """Sum, café."""\n    '
SUFFIX = "\n\nprint(add(1, 2))  # 3\n"


def byte_level(added: list[str], *, special: bool = True, bos: str | None = None) -> Tokenizer:
    """The tiny byte-level vocabulary (tests/model_files.py) with ``added`` tokens after it;
    ``special=False`` adds them as Qwen's tokenizer.json does its FIM tokens."""
    hf = HFTokenizer.from_str(tiny_tokenizer_json())
    tokens = [AddedToken(t, special=special, normalized=False) for t in added]
    if special:
        hf.add_special_tokens(tokens)
    else:
        hf.add_tokens(tokens)
    specials = [i for i, t in hf.get_added_tokens_decoder().items() if t.special]
    bos_id = hf.token_to_id(bos) if bos else None
    return Tokenizer(hf, special_ids=specials, bos_id=bos_id, eos_ids=[2], add_bos=bos is not None)


def sentencepiece(markers: list[str]) -> Tokenizer:
    """A SentencePiece-style vocabulary (a dummy "▁" before any text, as llama.cpp's GGUF
    tokenizers have) with ``markers`` as special tokens; "▁d" is its one merge."""
    pieces = ["<unk>", "<s>", "</s>", "▁", *string.ascii_letters, *string.digits, *"()[]:.,=+#\n"]
    vocab = {p: i for i, p in enumerate([*dict.fromkeys(pieces), "▁d"])}
    hf = HFTokenizer(models.BPE(vocab, [("▁", "d")], unk_token="<unk>"))
    hf.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    hf.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse()])
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in markers])
    specials = [hf.token_to_id(t) for t in ["<s>", "</s>", *markers]]
    return Tokenizer(hf, byte_mode="sentencepiece", special_ids=specials, bos_id=1, eos_ids=[2],
                     add_bos=True)  # fmt: skip


# family, tokens added to the tiny vocabulary, BOS, the prompt's text, the stop tokens found
FAMILIES = [
    ("qwen", QWEN_FIM, None, "<|fim_prefix|>{p}<|fim_suffix|>{s}<|fim_middle|>",
     {*QWEN_FIM, "<|endoftext|>", "<|im_start|>", "<|im_end|>"}),
    ("starcoder", ["<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>", "<file_sep>"],
     None, "<fim_prefix>{p}<fim_suffix>{s}<fim_middle>",
     {"<|endoftext|>", "<fim_pad>", "<file_sep>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>"}),
    ("santacoder", ["<fim-prefix>", "<fim-middle>", "<fim-suffix>", "<fim-pad>"], None,
     "<fim-prefix>{p}<fim-suffix>{s}<fim-middle>", {"<|endoftext|>", "<fim-pad>"}),
    ("codestral", ["[PREFIX]", "[SUFFIX]"], "<|im_start|>", "<|im_start|>[SUFFIX]{s}[PREFIX]{p}",
     set()),
    ("codellama", ["<PRE>", "<SUF>", "<MID>", "<EOT>"], None, "<PRE>{p}<SUF>{s}<MID>", {"<EOT>"}),
    ("deepseek-coder", ["<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", "<|EOT|>"],
     "<|im_start|>", "<|im_start|><｜fim▁begin｜>{p}<｜fim▁hole｜>{s}<｜fim▁end｜>", {"<|EOT|>"}),
]  # fmt: skip


@pytest.mark.parametrize(("family", "added", "bos", "layout", "stops"), FAMILIES,
                         ids=[f[0] for f in FAMILIES])  # fmt: skip
def test_each_family_is_read_from_its_vocabulary(family, added, bos, layout, stops) -> None:
    tok = byte_level(added, bos=bos)
    fmt = find_fim_format(tok)
    assert fmt is not None and fmt.family.name == family
    ids = fim_prompt_ids(tok, PREFIX, SUFFIX)
    assert tok.decode(ids) == layout.format(p=PREFIX, s=SUFFIX)
    # prefix and suffix are tokenized each on its own, as plain text
    pieces = [tok.encode(PREFIX), tok.encode(SUFFIX)]
    text = pieces[0] + pieces[1] if fmt.family.order == "psm" else pieces[1] + pieces[0]
    assert [i for i in ids if i not in fmt.added_ids] == text
    assert {tok.id_to_token(i) for i in fim_stop_ids(tok)} == stops
    # an empty suffix (completion at the end of a file) is still a FIM prompt
    assert tok.decode(fim_prompt_ids(tok, PREFIX, "")) == layout.format(p=PREFIX, s="")


def test_codellama_keeps_sentencepieces_space_off_the_suffix() -> None:
    tok = sentencepiece(["▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"])
    pre, suf, mid, eot = (tok.token_to_id(t) for t in ("▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"))
    fmt = find_fim_format(tok)
    assert fmt is not None and fmt.family.name == "codellama" and fmt.dummy_space
    assert fim_stop_ids(tok) == (eot,)
    prefix = "def f(x):"
    assert tok.encode(prefix)[0] == tok.token_to_id("▁d")  # the dummy space, on the prefix
    for suffix, pieces in (
        ("return x", ["r", "e", "t", "u", "r", "n", "▁", "x"]),
        ("do(x)", ["d", "o", "(", "x", ")"]),  # not "▁d": the space merged into the first piece
        (" x", ["▁", "x"]),  # the text's own space stays
    ):
        ids = fim_prompt_ids(tok, prefix, suffix)
        assert ids[:2] == [1, pre] and ids[-1] == mid
        cut = ids.index(suf)
        assert ids[2:cut] == tok.encode(prefix)
        assert [tok.id_to_token(i) for i in ids[cut + 1 : -1]] == pieces, suffix
    text = tok.decode(fim_prompt_ids(tok, prefix, "return x"))
    assert text == "<s> <PRE> def f(x): <SUF>return x <MID>"  # llama.cpp's spacing


def test_codestral_puts_the_suffix_first_without_a_middle_mark() -> None:
    tok = sentencepiece(["[PREFIX]", "[SUFFIX]"])
    p, s = tok.token_to_id("[PREFIX]"), tok.token_to_id("[SUFFIX]")
    ids = fim_prompt_ids(tok, "x = 1", "do(x)")
    pieces = [tok.id_to_token(i) for i in ids]
    assert ids[:2] == [1, s] and ids.index(p) == 2 + len("do(x)")
    assert pieces[2:7] == ["d", "o", "(", "x", ")"]
    assert ids[ids.index(p) + 1 :] == tok.encode("x = 1")


@pytest.mark.parametrize("special", [True, False], ids=["special", "added-not-special"])
def test_markers_spelled_in_the_users_text_stay_text(special: bool) -> None:
    tok = byte_level(QWEN_FIM, special=special)
    fmt = find_fim_format(tok)
    assert fmt is not None
    prefix = "marker = '<|fim_middle|>'\n# <|endoftext|><|file_sep|>\n"
    suffix = "<|fim_prefix|>x<|fim_suffix|>\n<|im_end|>"
    ids = fim_prompt_ids(tok, prefix, suffix)
    assert ids[0] == fmt.prefix_id and ids[-1] == fmt.middle_id
    for marker in (fmt.prefix_id, fmt.suffix_id, fmt.middle_id):
        assert ids.count(marker) == 1
    assert not set(ids) & (set(fmt.stop_ids) - {fmt.prefix_id, fmt.suffix_id, fmt.middle_id})
    assert tok.decode(ids) == f"<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>"


TEXTS = ["", "plain words", "def f(x):\n    return x  # ok\n\n", "12345 + 678 = 999",
         "  spaces   and\ttabs\n\n\n", "café naïve 東京 🙂", "don't (("]  # fmt: skip


@pytest.mark.parametrize("which", ["embedded", "tiny", "sentencepiece"])
def test_the_unmatched_path_tokenizes_as_the_tokenizer_does(which: str) -> None:
    # Used only for text that spells an added token; for any other text it must agree with encode.
    if which == "embedded":
        tok = load_model(embedded_model_path()).tokenizer
    elif which == "tiny":
        tok = byte_level(QWEN_FIM, special=False)
    else:
        tok = sentencepiece(["▁<PRE>", "▁<SUF>", "▁<MID>"])
    for text in TEXTS:
        assert unmatched_ids(tok, text) == tok.encode(text, parse_special=False), text


def test_a_model_without_fim_tokens_is_a_400_naming_a_catalog_model() -> None:
    tok = load_model(embedded_model_path()).tokenizer
    assert find_fim_format(tok) is None and fim_stop_ids(tok) == ()
    with pytest.raises(InvalidParameterError) as caught:
        fim_prompt_ids(tok, "def f(", ")", model="smollm2-135m")
    message = str(caught.value)
    assert caught.value.http_status == 400
    assert message.startswith("suffix: model 'smollm2-135m' cannot fill in the middle")
    assert FIM_EXAMPLE_MODEL in message and "<|fim_prefix|>" in message
    entry = load_catalog().get(FIM_EXAMPLE_MODEL)
    assert entry is not None and isinstance(entry.source, HFSource)
    assert entry.source.gguf_repo == "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF"


def test_markers_must_all_be_added_tokens() -> None:
    assert find_fim_format(byte_level(["<|fim_prefix|>", "<|fim_suffix|>"])) is None  # no middle
    # spelled by ordinary vocabulary pieces, not added tokens: not a FIM vocabulary
    vocab = {t: i for i, t in enumerate(["<unk>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>"])}
    plain = Tokenizer(HFTokenizer(models.BPE(vocab, [], unk_token="<unk>")))
    assert plain.token_to_id("<fim_middle>") == 3
    assert find_fim_format(plain) is None


# -- localinfer generate --suffix ------------------------------------------------------------


def write_fim_model(root: Path, max_ctx: int = 2048) -> Path:
    """A Hugging Face directory: a tiny random qwen2 model whose tokenizer has Qwen's FIM
    tokens, added (as Qwen's tokenizer.json has them) after the tiny byte-level vocabulary."""
    config = tiny_config("qwen2", vocab_size=TINY_VOCAB_SIZE + len(QWEN_FIM), max_ctx=max_ctx)
    weights = tiny_weights(config)
    write_hf_dir(root, config, {name: weights.get(name) for name in weights.names()})
    hf = HFTokenizer.from_str(tiny_tokenizer_json())
    hf.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN_FIM])
    (root / "tokenizer.json").write_text(hf.to_str())
    return root


@pytest.fixture(scope="module")
def fim_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield write_fim_model(tmp_path_factory.mktemp("fim") / "tiny-fim")


CLI = ["--max-tokens", "12", "--threads", "1", "--ctx", "256"]


def test_generate_suffix_writes_the_engines_greedy_middle(capsys, fim_model: Path) -> None:
    with open_session(str(fim_model), slots=1, ctx=256, threads=1) as session:
        tok = session.tokenizer
        ids = fim_prompt_ids(tok, PREFIX, SUFFIX)
        params = SamplingParams(max_tokens=12, stop_token_ids=fim_stop_ids(tok))
        direct = session.engine.generate(Request(ids, params))
    rc = main(["generate", str(fim_model), PREFIX, "--suffix", SUFFIX, *CLI, "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["token_ids"] == list(direct.token_ids) and doc["text"] == direct.text
    assert doc["usage"]["prompt_tokens"] == len(ids)
    rc = main(["generate", str(fim_model), PREFIX, "--suffix", SUFFIX, *CLI])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out == direct.text + "\n" and f"finish: {direct.finish_reason}" in err


def test_generate_suffix_refuses_a_model_without_fim_tokens(capsys) -> None:
    assert main(["generate", "def f(", "--suffix", ")", *CLI]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("localinfer: error: --suffix: model 'smollm2-135m' cannot fill in")
    assert FIM_EXAMPLE_MODEL in err and "\n" not in err
    assert main(["generate", "def f(", "--suffix", ")", "--system", "be brief", *CLI]) == 1
    assert "--suffix: fill-in-the-middle takes no --system" in capsys.readouterr().err


# -- the autocomplete benchmark's workload and model (scripts/bench-server) -------------------


def test_the_typing_workload_grows_the_prefix_a_line_at_a_time(tmp_path: Path) -> None:
    tok = byte_level(QWEN_FIM)
    lines = [f"value_{i} = {i} * 2  # line {i}\n" for i in range(80)]
    path = tmp_path / "f.py"
    path.write_text("".join(lines))
    work = typing_workload(path, tok, max_tokens=400, lines=5, cursor=0.5)
    whole = work.prefixes[-1] + work.suffix
    n = whole.count("\n")
    assert whole == "".join(lines[:n]) and 4 < n < 80  # cut at a line end...
    assert len(tok.encode(whole)) == work.tokens <= 400 < len(tok.encode(whole + lines[n]))
    assert len(work.prefixes) == 6 and work.first_line == round((n - 5) * 0.5) + 1
    for i, (before, after) in enumerate(itertools.pairwise(work.prefixes)):
        assert after == before + lines[work.first_line - 1 + i]  # one typed line each
    assert work.suffix_tokens == len(tok.encode(work.suffix))
    assert typing_workload(path, tok, 400, 5, cursor=1.0).suffix == ""


def test_the_benchmark_model_is_the_embedded_one_with_fim_markers(tmp_path: Path) -> None:
    path = write_bench_fim_model(tmp_path, "starcoder")
    tok, embedded = load_model(path).tokenizer, load_model(embedded_model_path()).tokenizer
    fmt = find_fim_format(tok)
    assert fmt is not None and fmt.family.name == "starcoder"
    assert tok.vocab_size == embedded.vocab_size and tok.encode(PREFIX) == embedded.encode(PREFIX)
    # the markers are SmolLM2's unused specials, renamed in place (<jupyter_start> -> ...)
    assert fmt.prefix_id == embedded.token_to_id("<jupyter_start>")
    assert fmt.prefix_id in tok.special_ids and fmt.middle_id in tok.special_ids
    ours, theirs = GGUFFile(path), GGUFFile(embedded_model_path())
    assert list(ours.tensors) == list(theirs.tensors)
    assert all(np.array_equal(ours.raw(name), theirs.raw(name)) for name in theirs.tensors)
    ours.close()
    theirs.close()
