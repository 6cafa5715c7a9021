"""A streamed token's SSE message from the content template equals the whole chunk encoded,
byte for byte, for chat and text completions, whatever the text holds."""

from __future__ import annotations

import pytest

from localinfer.server.openai_render import CONTENT_MARKER, OpenAIRenderer, ResponseBuilder
from localinfer.server.streaming import sse
from localinfer.tools import ContentDelta, ReasoningDelta

TEXTS = ["Hello", " world", '"quoted"', "back\\slash", "tab\tnew\nline", "\x00\x1f", "é漢字",
         "🙂", "\ud800", "</script>", " ", "{}"]  # fmt: skip


def builder(kind: str, **kw: object) -> ResponseBuilder:
    return ResponseBuilder(kind=kind, model="bench", token_bytes=lambda i: b"", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("include_usage", [False, True])
def test_the_template_gives_the_bytes_of_the_whole_chunk(kind: str, include_usage: bool) -> None:
    fast, slow = (
        builder(kind, include_usage=include_usage),
        builder(kind, include_usage=include_usage),
    )
    slow.id, slow.created = fast.id, fast.created
    for text in TEXTS:
        expected = sse(slow.delta_chunk(text, ()))
        assert fast.content_sse(text) == expected, text
    assert fast._text_pos == slow._text_pos == sum(len(t) for t in TEXTS)


def test_a_marker_in_a_fixed_field_falls_back_to_encoding_the_whole_chunk() -> None:
    fast = ResponseBuilder(kind="chat", model=CONTENT_MARKER, token_bytes=lambda i: b"")
    slow = ResponseBuilder(kind="chat", model=CONTENT_MARKER, token_bytes=lambda i: b"")
    slow.id, slow.created = fast.id, fast.created
    assert fast.content_sse(CONTENT_MARKER) == sse(slow.delta_chunk(CONTENT_MARKER, ()))


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_the_renderer_takes_the_template_only_where_it_gives_the_same_messages(kind: str) -> None:
    def pair(**kw: object) -> tuple[OpenAIRenderer, OpenAIRenderer]:
        a, b = builder(kind, **kw), builder(kind, **kw)
        b.id, b.created = a.id, a.created
        return OpenAIRenderer(a), OpenAIRenderer(b)

    events = [[ContentDelta("a")], [ContentDelta(""), ContentDelta("b")], [],
              [ReasoningDelta("why"), ContentDelta("c")]]  # fmt: skip
    fast, slow = pair()
    for deltas in events:
        expected = [sse(c) for c in slow.builder.delta_chunks(deltas, ())]
        assert fast.deltas(deltas, ()) == expected
    # Logprobs asked for: every chunk goes through delta_chunks (they ride on the first).
    fast, _ = pair(want_logprobs=True)
    fast.deltas([ContentDelta("a")], ())
    assert fast.builder._content_parts is None  # the template was never made
