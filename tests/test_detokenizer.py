"""Incremental detokenization: UTF-8 safety and stop strings, on bytes and on the real embedded
SmolLM2 tokenizer."""

from __future__ import annotations

import pytest

from localinfer.engine.detokenizer import Detokenizer


def byte_tokens(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def stream(detok: Detokenizer, ids: list[int]) -> tuple[list[str], bool]:
    deltas = []
    for t in ids:
        step = detok.add(t)
        deltas.append(step.text)
        if step.stopped:
            return deltas, True
    deltas.append(detok.finish())
    return deltas, False


def one_byte(i: int) -> bytes:
    return bytes([i])


def test_multibyte_characters_wait_for_their_last_byte() -> None:
    deltas, stopped = stream(Detokenizer(one_byte), byte_tokens("a🙂b中"))
    assert not stopped
    assert deltas == ["a", "", "", "", "🙂", "b", "", "", "中", ""]


def test_invalid_and_dangling_bytes_become_replacement_chars() -> None:
    d = Detokenizer(one_byte)
    assert d.add(0xFF).text == "\ufffd"  # invalid at once: never stalls the stream
    assert d.add(ord("x")).text == "x"
    assert d.add(0xE4).text == ""  # first byte of a 3-byte character ...
    assert d.finish() == "\ufffd"  # ... and the stream ended
    assert d.text == "\ufffdx\ufffd"


def test_stop_string_split_over_tokens_is_held_then_dropped() -> None:
    d = Detokenizer(one_byte, stop=["</s>"])
    deltas, stopped = stream(d, byte_tokens("abc</s>tail"))
    assert stopped
    assert deltas == ["a", "b", "c", "", "", "", ""]
    assert d.text == "abc"


def test_held_text_is_released_when_it_is_not_a_stop() -> None:
    d = Detokenizer(one_byte, stop=["STOP"])
    deltas, stopped = stream(d, byte_tokens("a STOx!"))
    assert not stopped
    assert deltas == ["a", " ", "", "", "", "STOx", "!", ""]
    d2 = Detokenizer(one_byte, stop=["STOP"])
    deltas, _ = stream(d2, byte_tokens("xST"))
    assert deltas == ["x", "", "", "ST"]  # end of stream releases what was held


def test_earliest_of_several_stop_strings_wins_and_overlaps_are_handled() -> None:
    d = Detokenizer(one_byte, stop=["world", "lo w"])
    _, stopped = stream(d, byte_tokens("hello world"))
    assert stopped and d.text == "hel"
    d = Detokenizer(one_byte, stop=["aab"])
    _, stopped = stream(d, byte_tokens("aaab"))
    assert stopped and d.text == "a"


def test_stop_string_inside_one_multi_character_token() -> None:
    pieces = [b"Hello", b" wor", b"ld! And", b" more"]
    d = Detokenizer(lambda i: pieces[i], stop=["! A"])
    deltas, stopped = stream(d, [0, 1, 2, 3])
    assert stopped and deltas == ["Hello", " wor", "ld"]


# -- the real tokenizer of the embedded model -------------------------------------------------


@pytest.fixture(scope="module")
def smol():
    gguf_file = pytest.importorskip("localinfer.loading.gguf_file")
    tok_mod = pytest.importorskip("localinfer.loading.tokenizer_gguf")
    from localinfer.loading.embedded import embedded_model_path

    return tok_mod.tokenizer_from_gguf(gguf_file.GGUFFile(embedded_model_path()))


TEXTS = [
    "Emoji: 🙂👍🏽 and a family 👨‍👩‍👧 end.",
    "中文字符测试，日本語のテキスト、한국어 문장.",
    "Mixed: café naïve — “quotes” ½ 😀😀😀!",
]


@pytest.mark.parametrize("text", TEXTS)
def test_real_tokenizer_streams_exact_text_without_broken_characters(smol, text: str) -> None:
    ids = smol.encode(text)
    pieces = [smol.token_bytes(i) for i in ids]
    # The case under test really occurs: some token is not valid UTF-8 by itself.
    assert any(_invalid_alone(p) for p in pieces), "no split character in this text"
    d = Detokenizer(smol.token_bytes)
    deltas, _ = stream(d, ids)
    assert "".join(deltas) == text == smol.decode(ids)
    assert all("\ufffd" not in x for x in deltas)


def test_real_tokenizer_stop_string_split_over_tokens(smol) -> None:
    text = "The capital is Paris.\nUser: next question"
    ids = smol.encode(text)
    stop = "\nUser:"
    # The stop string spans several tokens of this tokenizer.
    start = text.index(stop)
    spans, pos = [], 0
    for i in ids:
        n = len(smol.token_bytes(i).decode("utf-8"))
        spans.append((pos, pos + n))
        pos += n
    assert sum(1 for a, b in spans if a < start + len(stop) and b > start) >= 2
    d = Detokenizer(smol.token_bytes, stop=[stop, "never"])
    deltas, stopped = stream(d, ids)
    assert stopped and "".join(deltas) == "The capital is Paris."
    assert all("\n" not in x for x in deltas)


def test_real_tokenizer_stop_string_inside_a_split_emoji_sequence(smol) -> None:
    text = "ok 🙂🙃 done"
    ids = smol.encode(text)
    d = Detokenizer(smol.token_bytes, stop=["🙃"])
    deltas, stopped = stream(d, ids)
    assert stopped and "".join(deltas) == "ok 🙂"
    assert all("\ufffd" not in x for x in deltas)


def _invalid_alone(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def test_engine_streams_real_tokens_with_emoji_cjk_and_a_split_stop(smol) -> None:
    from localinfer.engine import Engine, Request, SamplingParams
    from tests.test_engine_model import ScriptRunner

    answer = "Sure 🙂! 中文 ok.\nUser: more"
    script = smol.encode(answer)
    runner = ScriptRunner(script, end=smol.eos_ids[0], vocab_size=smol.vocab_size, slots=1)
    engine = Engine(runner, smol, background=False)
    handle = engine.submit(Request([1, 2, 3], SamplingParams(max_tokens=64, stop=("\nUser:",))))
    events = list(handle)
    assert "".join(e.text for e in events) == "Sure 🙂! 中文 ok."
    assert all("\ufffd" not in e.text and "\n" not in e.text for e in events)
    assert events[-1].finish_reason == "stop"
    # Without the stop string the eos token ends it, and its text is not shown.
    res = engine.generate(Request([1, 2, 3], SamplingParams(max_tokens=64)))
    assert (res.text, res.finish_reason) == (answer, "stop")
    assert res.token_ids == (*script, smol.eos_ids[0])


def test_the_stop_string_that_ended_the_text_is_named_as_given() -> None:
    from localinfer.engine.detokenizer import Detokenizer

    d = Detokenizer(lambda t: bytes([t]), stop=["zz", "b\udcff", "c"])
    assert d.matched_stop is None
    for byte in b"aab":
        d.add(byte)
    step = d.add(ord("c"))
    assert step.stopped and d.text == "aab" and d.matched_stop == "c"
    d = Detokenizer(lambda t: bytes([t]), stop=["zz"])
    d.add(ord("a"))
    d.finish()
    assert d.matched_stop is None
