"""The one SSE decoder (localinfer/sse_decoder.py) the chat's remote answers and the benchmark
share: events cut anywhere across chunks, multi-line data, comments, CR/LF/CRLF line ends, and
OpenAI's closing ``data: [DONE]``."""

from __future__ import annotations

import asyncio
import random

import pytest

from localinfer.bench import sse as bench_sse
from localinfer.sse_decoder import DONE, SSEDecoder, sse_data, sse_events

STREAM = (
    ": keep-alive\r\n"
    'data: {"a": 1}\r\n'
    "\r\n"
    "event: ignored\n"
    "id: 7\n"
    "data: line one\n"
    "data:line two\n"
    "data:  two spaces keep one\n"
    "\n"
    ":another comment\r"
    "data: cr only\r"
    "\r"
    "data: [DONE]\n"
    "\n"
)
EVENTS = ['{"a": 1}', "line one\nline two\n two spaces keep one", "cr only", DONE]


def cut(text: str, points: list[int]) -> list[str]:
    edges = [0, *sorted(points), len(text)]
    return [text[a:b] for a, b in zip(edges, edges[1:], strict=False)]


def test_one_chunk_gives_every_event() -> None:
    assert list(sse_events([STREAM])) == EVENTS


def test_every_single_cut_gives_the_same_events() -> None:
    """Cut at every place, CRLFs and ``data:`` prefixes included."""
    for at in range(len(STREAM) + 1):
        assert list(sse_events(cut(STREAM, [at]))) == EVENTS, at


def test_random_cuts_and_character_by_character() -> None:
    rng = random.Random(25)
    for _ in range(200):
        points = rng.sample(range(len(STREAM) + 1), rng.randint(1, 12))
        assert list(sse_events(cut(STREAM, points))) == EVENTS
    assert list(sse_events(STREAM)) == EVENTS  # one character per chunk


def test_a_crlf_cut_between_chunks_is_one_line_end() -> None:
    decoder = SSEDecoder()
    assert decoder.feed_text("data: x\r") == []
    assert decoder.feed_text("") == []  # an empty chunk keeps the pending CR
    assert decoder.feed_text("\n\r") == ["x"]  # CR LF | CR: one event end, not two lines
    assert decoder.feed_text("\ndata: y\r\n\r\n") == ["y"]


def test_an_event_the_stream_ends_before_its_blank_line_is_discarded() -> None:
    assert list(sse_events(["data: a\n\n", "data: b"])) == ["a"]  # half a line
    assert list(sse_events(["data: a\n\n", "data: b\n"])) == ["a"]  # a line, no blank one
    assert list(sse_events([": only a comment\n\n", "event: x\n\n"])) == []

    async def lines():
        for line in ["data: a", "", "data: b"]:
            yield line

    async def collect() -> list[str]:
        return [data async for data in sse_data(lines())]

    assert asyncio.run(collect()) == ["a"]


def test_a_byte_order_mark_opening_the_stream_is_dropped() -> None:
    assert list(sse_events(["\ufeffdata: a\n\n"])) == ["a"]
    assert list(sse_events(["\ufeff", "data: a\n\n"])) == ["a"]  # a chunk of its own
    assert list(sse_events(["\ufeff:comment\n\ndata: a\n\n"])) == ["a"]
    # Only the stream's first: a later one is part of the text.
    assert list(sse_events(["data: a\n\n", "\ufeffdata: b\n\n"])) == ["a"]
    decoder = SSEDecoder()
    assert decoder.feed("\ufeffdata: a") is None
    assert decoder.feed("") == "a"


def test_a_long_line_in_many_chunks_is_one_line() -> None:
    payload = "x" * 20_000
    chunks = ["data: ", *payload, "\n", "\n"]
    assert list(sse_events(chunks)) == [payload]


def test_the_line_interface_and_the_async_lines() -> None:
    decoder = SSEDecoder()
    assert decoder.feed("data: a") is None
    assert decoder.feed("data: b") is None
    assert decoder.feed(": comment") is None
    assert decoder.feed("") == "a\nb"

    async def lines():
        for line in STREAM.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
            yield line

    async def collect() -> list[str]:
        return [data async for data in sse_data(lines())]

    assert asyncio.run(collect()) == EVENTS


@pytest.mark.parametrize("name", ["SSEDecoder", "sse_data", "sse_events", "DONE"])
def test_the_benchmark_imports_the_same_decoder(name: str) -> None:
    import localinfer.sse_decoder as shared

    assert getattr(bench_sse, name) is getattr(shared, name)
