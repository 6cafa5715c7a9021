"""Tool calls out of a model's answer, as it streams or whole.

The answer is cut into text and call blocks (formats.py). Text streams through as soon as it
cannot be the start of a call marker; a call is sent only once its block is complete and valid
(its id and name, then its arguments), and a malformed block comes back as text, verbatim. So
the client never sees half a marker or a call that turns out not to be one, and nothing the
model wrote is lost.

Content is the text outside valid call blocks, ``None`` when that is only whitespace (so the
stream holds leading whitespace until something else arrives). ``parse_tool_calls`` runs the
same stream over a whole answer: streamed and whole results agree for any chunking.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from localinfer.tools.family import ToolCall, ToolFamily, new_call_id
from localinfer.tools.formats import format_for
from localinfer.tools.specs import FunctionTool


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ToolCallStart:
    """A call begins: its index in the answer's calls, its id and the tool's name."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArguments:
    """A piece of call ``index``'s arguments (the pieces join to ``ToolCall.arguments``)."""

    index: int
    fragment: str


@dataclass(frozen=True)
class ReasoningDelta:
    """A piece of a thinking model's reasoning (engine/reasoning.py split it from the answer;
    tool calls are never read in it)."""

    text: str


StreamDelta = ContentDelta | ToolCallStart | ToolCallArguments | ReasoningDelta


@dataclass(frozen=True)
class ParsedOutput:
    content: str | None
    calls: list[ToolCall] = field(default_factory=list)


def _partial_marker(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest end of ``text`` that a marker starts with (a marker cut short)."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if marker.startswith(text[-size:]):
                longest = size
                break
    return longest


class ToolCallStream:
    """Per-answer state: ``feed`` each text increment, ``finish`` once at the end.

    ``new_id`` makes the call ids (default: ``new_call_id(family)``)."""

    def __init__(
        self,
        family: ToolFamily,
        tools: list[FunctionTool],
        new_id: Callable[[], str] | None = None,
    ) -> None:
        self._format = format_for(family)
        self._tools = frozenset(t.name for t in tools)
        self._new_id = new_id or (lambda: new_call_id(family))
        self._pending = ""  # text not yet emitted nor cut into a block
        self._in_block = False  # _pending starts with a call block
        self._seen_text = False  # some non-whitespace content was emitted
        self._seen_block = False
        self._held_space = ""  # leading whitespace: content only if other content follows
        self._calls: list[ToolCall] = []
        self._finished = False

    @property
    def calls(self) -> list[ToolCall]:
        """The answer's calls so far (all of them after ``finish``)."""
        return list(self._calls)

    def feed(self, text: str) -> list[StreamDelta]:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._pending += text
        return self._advance(final=False)

    def finish(self) -> list[StreamDelta]:
        if self._finished:
            raise RuntimeError("finish() called twice")
        self._finished = True
        return self._advance(final=True)

    def _advance(self, final: bool) -> list[StreamDelta]:
        out: list[StreamDelta] = []
        while True:
            if self._in_block:
                end = self._format.block_end(self._pending, final)
                if end is None:
                    break
                block, self._pending = self._pending[:end], self._pending[end:]
                self._in_block = False
                self._take_block(block, out)
                continue
            at_start = not (self._seen_text or self._seen_block)
            start = self._format.find_start(self._pending, at_start)
            if start >= 0:
                self._content(self._pending[:start], out)
                self._pending = self._pending[start:]
                self._in_block = self._seen_block = True
                continue
            keep = 0 if final else _partial_marker(self._pending, self._format.markers)
            cut = len(self._pending) - keep
            self._content(self._pending[:cut], out)
            self._pending = self._pending[cut:]
            break
        return out

    def _take_block(self, block: str, out: list[StreamDelta]) -> None:
        found = self._format.read_block(block, self._tools)
        if found is None:
            self._content(block, out)  # malformed: the model's text, as written
            return
        for call_text in found:
            call = ToolCall(self._new_id(), call_text.name, call_text.arguments)
            index = len(self._calls)
            self._calls.append(call)
            out.append(ToolCallStart(index, call.id, call.name))
            out.append(ToolCallArguments(index, call.arguments))

    def _content(self, text: str, out: list[StreamDelta]) -> None:
        if not text:
            return
        if not self._seen_text:
            self._held_space += text
            if not self._held_space.strip():
                return
            text, self._held_space = self._held_space, ""
            self._seen_text = True
        out.append(ContentDelta(text))


def parse_tool_calls(
    text: str,
    family: ToolFamily,
    tools: list[FunctionTool],
    new_id: Callable[[], str] | None = None,
) -> ParsedOutput:
    """A whole answer as content and calls (see the module's docstring for the rules)."""
    stream = ToolCallStream(family, tools, new_id)
    deltas = stream.feed(text) + stream.finish()
    content = "".join(d.text for d in deltas if isinstance(d, ContentDelta))
    return ParsedOutput(content or None, stream.calls)
