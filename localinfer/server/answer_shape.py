"""What a chat answer's text becomes: content, or tool calls, streamed as deltas.

The engine streams text; an answer shape turns it into the deltas a response carries:

* ``PlainAnswer`` — content as it comes (no tools offered, ``tool_choice: none``, JSON mode);
* ``ToolAnswer`` — ``tool_choice: auto``: the model's own tool-call syntax is recognised by its
  template family; a call is sent once it is whole and valid, a malformed one stays content;
* ``ForcedCallAnswer`` — ``required`` or a named function: the engine's constraint made the
  answer a JSON call (or an array of them), read back as calls when the answer ends. Never
  content: an answer cut short keeps the calls it completed (finish ``tool_calls``), else the
  call it was writing with the arguments written so far and the engine's finish (``length``),
  as OpenAI and vLLM return a call cut by the limit; else no call and no content.

Finish reasons follow OpenAI: ``"tool_calls"`` when the answer holds calls, otherwise the
engine's own (``"stop"``, ``"length"``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from localinfer.tools import (
    ContentDelta,
    FunctionTool,
    StreamDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallStart,
    ToolCallStream,
    ToolFamily,
    calls_from_forced,
    partial_forced_call,
)

# Argument text is sent in pieces of this many characters, so a client sees OpenAI's shape
# (name first, then argument fragments) however short the call.
ARGUMENT_PIECE = 32


class AnswerShape(Protocol):
    """Per-response state: ``feed`` each text increment, then ``finish`` once."""

    calls: list[ToolCall]

    def feed(self, text: str) -> list[StreamDelta]: ...

    def finish(self, reason: str) -> tuple[list[StreamDelta], str]: ...


ShapeFactory = Callable[[], AnswerShape]


class PlainAnswer:
    def __init__(self) -> None:
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> list[StreamDelta]:
        return [ContentDelta(text)] if text else []

    def finish(self, reason: str) -> tuple[list[StreamDelta], str]:
        return [], reason


class ToolAnswer:
    def __init__(self, family: ToolFamily, tools: list[FunctionTool]) -> None:
        self._stream = ToolCallStream(family, tools)
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> list[StreamDelta]:
        return self._stream.feed(text) if text else []

    def finish(self, reason: str) -> tuple[list[StreamDelta], str]:
        deltas = self._stream.finish()
        self.calls = list(self._stream.calls)
        return deltas, "tool_calls" if self.calls else reason


class ForcedCallAnswer:
    def __init__(self, family: ToolFamily, parallel: bool) -> None:
        self._family = family
        self._parallel = parallel
        self._parts: list[str] = []
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> list[StreamDelta]:
        self._parts.append(text)
        return []  # the JSON is only a call once it is whole

    def finish(self, reason: str) -> tuple[list[StreamDelta], str]:
        text = "".join(self._parts)
        cut = reason == "length"
        self.calls = calls_from_forced(text, self._parallel, self._family, cut=cut)
        if self.calls:
            return call_deltas(self.calls), "tool_calls"
        # Cut short (by max_tokens, or a stop string) before a call was whole: the half-written
        # JSON is no content; the call being written, if its name was, under the engine's finish.
        partial = partial_forced_call(text, self._family)
        self.calls = [partial] if partial is not None else []
        return call_deltas(self.calls), reason


def call_deltas(calls: list[ToolCall]) -> list[StreamDelta]:
    """Whole calls as stream deltas: each call's id and name, then its argument pieces."""
    deltas: list[StreamDelta] = []
    for index, call in enumerate(calls):
        deltas.append(ToolCallStart(index, call.id, call.name))
        args = call.arguments
        for start in range(0, len(args), ARGUMENT_PIECE):
            deltas.append(ToolCallArguments(index, args[start : start + ARGUMENT_PIECE]))
    return deltas
