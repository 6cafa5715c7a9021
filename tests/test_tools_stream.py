"""localinfer.tools: tool calls read from a streamed answer agree with the whole-answer parse for
every chunking, ordinary text is not held back, and a call is sent only once it is whole."""

from __future__ import annotations

import itertools
import random

import pytest

from localinfer.tools import (
    ContentDelta,
    StreamDelta,
    ToolCallArguments,
    ToolCallStart,
    ToolCallStream,
    ToolFamily,
    parse_tool_calls,
)
from tests.test_tools_parse import CALL_P, CASES, LLAMA_P, TOOLS

H, L, M = ToolFamily.HERMES, ToolFamily.LLAMA3, ToolFamily.MISTRAL


def counter():
    numbers = itertools.count()
    return lambda: f"id{next(numbers)}"


def run(family: ToolFamily, chunks: list[str]) -> tuple[list[StreamDelta], ToolCallStream]:
    stream = ToolCallStream(family, TOOLS, new_id=counter())
    deltas: list[StreamDelta] = []
    for chunk in chunks:
        deltas += stream.feed(chunk)
    deltas += stream.finish()
    return deltas, stream


def check_stream(family: ToolFamily, text: str, chunks: list[str]) -> None:
    assert "".join(chunks) == text
    whole = parse_tool_calls(text, family, TOOLS, new_id=counter())
    deltas, stream = run(family, chunks)
    content = "".join(d.text for d in deltas if isinstance(d, ContentDelta))
    assert content == (whole.content or ""), chunks
    assert all(d.text for d in deltas if isinstance(d, ContentDelta))
    assert stream.calls == whole.calls, chunks
    # Each call: its start (id, name) first, then argument pieces that join to its arguments.
    starts = [d for d in deltas if isinstance(d, ToolCallStart)]
    assert [(s.index, s.id, s.name) for s in starts] == [
        (i, c.id, c.name) for i, c in enumerate(whole.calls)
    ]
    for i, call in enumerate(whole.calls):
        start_at = deltas.index(starts[i])
        pieces = [d for d in deltas if isinstance(d, ToolCallArguments) and d.index == i]
        assert all(deltas.index(p) > start_at for p in pieces)
        assert "".join(p.fragment for p in pieces) == call.arguments


@pytest.mark.parametrize("name", CASES)
def test_every_two_piece_split_agrees_with_the_whole_parse(name):
    case = CASES[name]
    for cut in range(len(case.text) + 1):
        check_stream(case.family, case.text, [case.text[:cut], case.text[cut:]])


@pytest.mark.parametrize("name", CASES)
def test_character_by_character_and_random_chunks_agree(name):
    case = CASES[name]
    check_stream(case.family, case.text, list(case.text))
    rng = random.Random(name)
    for _ in range(30):
        cuts = sorted(rng.sample(range(len(case.text) + 1), min(len(case.text) + 1, 4)))
        bounds = [0, *cuts, len(case.text)]
        chunks = [case.text[a:b] for a, b in itertools.pairwise(bounds)]
        check_stream(case.family, case.text, chunks)


def test_random_answers_built_from_pieces_agree():
    # Text, whole calls, broken calls and marker fragments in random order, for every family.
    pieces = {
        H: [
            "Sure. ",
            "\n",
            f"<tool_call>{CALL_P}</tool_call>",
            "<tool_call>{bad",
            "</tool_call>",
            "<tool",
            "<",
            '{"name": "now"}',
            " done",
        ],
        L: ["\n", LLAMA_P, "<|python_tag|>", "; ", "Hi ", "{", "}", "<|python"],
        M: [
            "ok ",
            f"[TOOL_CALLS][{CALL_P}]",
            "[TOOL_CALLS]now[ARGS]{}",
            "[TOOL_CALLS]",
            "[",
            "]",
            '{"x": 1}',
            "[TOOL_",
        ],
    }
    rng = random.Random(20)
    for _ in range(300):
        family = rng.choice(list(pieces))
        text = "".join(rng.choice(pieces[family]) for _ in range(rng.randint(1, 6)))
        size = rng.randint(1, 7)
        chunks = [text[i : i + size] for i in range(0, len(text), size)] or [""]
        check_stream(family, text, chunks)


def contents(deltas: list[StreamDelta]) -> str:
    return "".join(d.text for d in deltas if isinstance(d, ContentDelta))


def test_ordinary_text_streams_at_once():
    stream = ToolCallStream(H, TOOLS)
    assert contents(stream.feed("The weather ")) == "The weather "
    assert contents(stream.feed("is <b>fine</b> <tool")) == "is <b>fine</b> "  # "<tool" held
    assert contents(stream.feed("s> are ok")) == "<tools> are ok"
    llama = ToolCallStream(L, TOOLS)
    assert contents(llama.feed("It is {sunny}")) == "It is {sunny}"
    assert contents(llama.feed(" <|pyt")) == " "
    mistral = ToolCallStream(M, TOOLS)
    assert contents(mistral.feed("[1, 2] and [TOOL")) == "[1, 2] and "


def test_a_call_is_sent_when_its_block_closes_not_at_the_end():
    stream = ToolCallStream(H, TOOLS)
    assert stream.feed('<tool_call>{"name": "get_weather", ') == []
    deltas = stream.feed('"arguments": {"city": "Paris"}}</tool_call>')
    assert [type(d) for d in deltas] == [ToolCallStart, ToolCallArguments]
    assert deltas[0].name == "get_weather" and deltas[1].fragment == '{"city":"Paris"}'
    assert contents(stream.feed("\nDone.")) == "\nDone."
    assert stream.finish() == [] and len(stream.calls) == 1

    mistral = ToolCallStream(M, TOOLS)
    assert mistral.feed("[TOOL_CALLS]get_weather[ARGS]{") == []
    assert [type(d) for d in mistral.feed('"city": "Paris"}')] == [ToolCallStart, ToolCallArguments]


def test_a_malformed_call_comes_back_as_content_at_the_end():
    stream = ToolCallStream(H, TOOLS)
    assert stream.feed('<tool_call>{"name": "get_weather", "arguments": {"ci') == []
    assert contents(stream.finish()) == '<tool_call>{"name": "get_weather", "arguments": {"ci'
    assert stream.calls == []


def test_llama_json_waits_for_the_end_of_the_answer():
    stream = ToolCallStream(L, TOOLS)
    assert stream.feed("  " + LLAMA_P) == []  # a JSON answer might go on with prose
    deltas = stream.finish()
    assert [type(d) for d in deltas] == [ToolCallStart, ToolCallArguments]
    prose = ToolCallStream(L, TOOLS)
    assert prose.feed('{"name": "Alice", "parameters": {}}') == []
    assert contents(prose.finish()) == '{"name": "Alice", "parameters": {}}'


def test_leading_whitespace_is_content_only_when_text_follows():
    stream = ToolCallStream(H, TOOLS)
    assert stream.feed("\n\n") == []
    assert contents(stream.feed("Hi")) == "\n\nHi"
    blank = ToolCallStream(H, TOOLS)
    assert blank.feed("\n") == [] and blank.finish() == []


def test_feed_after_finish_is_a_bug():
    stream = ToolCallStream(H, TOOLS)
    stream.finish()
    with pytest.raises(RuntimeError):
        stream.feed("x")
    with pytest.raises(RuntimeError):
        stream.finish()
