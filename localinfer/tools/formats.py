"""Where tool calls sit in a model's answer, per family: how a call block starts, where it ends,
and what calls it holds.

The stream (stream.py) cuts an answer into text and call blocks with these. Each function is a
pure function of the text it is given, and a block's end, once found, is the same however much
more text follows: that is what makes the result the same whatever the chunking.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

from localinfer.tools.call_json import (
    CallText,
    arguments_text,
    decode_at,
    read_arguments,
    read_call,
)
from localinfer.tools.family import ToolFamily
from localinfer.tools.harmony_calls import HarmonyFormat


class CallFormat(Protocol):
    """One family's call syntax."""

    # Text that starts a block: a partial one at the end of the text so far is held back.
    markers: tuple[str, ...]

    def find_start(self, text: str, at_start: bool) -> int:
        """Index of the first block start in ``text`` (-1: none). ``at_start``: nothing but
        whitespace came before ``text`` in the answer."""
        ...

    def block_end(self, text: str, final: bool) -> int | None:
        """Where the block that starts ``text`` ends (None: not yet known). ``final``: the
        answer ends with ``text``."""
        ...

    def read_block(self, block: str, tools: Collection[str]) -> list[CallText] | None:
        """The calls in a block, or None when it is malformed (it then stays text)."""
        ...


def _calls_in(value: object, tools: Collection[str]) -> list[CallText] | None:
    """One call object, or a non-empty array of them; None if any is not a valid call."""
    items = value if isinstance(value, list) else [value]
    calls = [read_call(item, tools) for item in items]
    if not calls or any(c is None for c in calls):
        return None
    return calls  # type: ignore[return-value]


def _whole_json(text: str) -> object | None:
    """``text`` (surrounding whitespace aside) as one JSON value, else None."""
    start = len(text) - len(text.lstrip())
    decoded = decode_at(text, start)
    if decoded is None or text[decoded[1] :].strip():
        return None
    return decoded[0]


@dataclass(frozen=True)
class TaggedFormat:
    """``<tool_call>JSON</tool_call>`` (HERMES, and GENERIC through its prompt). A block left
    open when the answer ends still counts when its JSON is whole (small models often stop
    before the closing tag)."""

    open_tag: str = "<tool_call>"
    close_tag: str = "</tool_call>"

    @property
    def markers(self) -> tuple[str, ...]:
        return (self.open_tag,)

    def find_start(self, text: str, at_start: bool) -> int:
        return text.find(self.open_tag)

    def block_end(self, text: str, final: bool) -> int | None:
        close = text.find(self.close_tag, len(self.open_tag))
        if close >= 0:
            return close + len(self.close_tag)
        return len(text) if final else None

    def read_block(self, block: str, tools: Collection[str]) -> list[CallText] | None:
        body = block[len(self.open_tag) :]
        if body.endswith(self.close_tag):
            body = body[: -len(self.close_tag)]
        value = _whole_json(body)
        return None if value is None else _calls_in(value, tools)


# Mistral's newer syntax: [TOOL_CALLS]name[ARGS]{...}, optionally with [CALL_ID]id before [ARGS].
_MISTRAL_NAMED = re.compile(r"\s*([a-zA-Z0-9_-]{1,64})(?:\[CALL_ID\][a-zA-Z0-9]{1,64})?\[ARGS\]")


@dataclass(frozen=True)
class MistralFormat:
    """``[TOOL_CALLS]`` then a JSON array of calls (or one call object), or Mistral's newer
    ``[TOOL_CALLS]name[ARGS]{arguments}``; the block ends where that JSON ends."""

    marker: str = "[TOOL_CALLS]"

    @property
    def markers(self) -> tuple[str, ...]:
        return (self.marker,)

    def find_start(self, text: str, at_start: bool) -> int:
        return text.find(self.marker)

    def _json_start(self, text: str) -> int | None:
        """Where the block's JSON starts: after the marker when an array or object follows it,
        after ``name[ARGS]`` otherwise (None: neither, so far)."""
        after = len(text) - len(text[len(self.marker) :].lstrip())
        if text[after : after + 1] in ("[", "{"):
            return after
        named = _MISTRAL_NAMED.match(text, len(self.marker))
        return named.end() if named else None

    def block_end(self, text: str, final: bool) -> int | None:
        # JSON can only have ended on a closing bracket: skip the decode until one arrives.
        if not final and text.rstrip()[-1:] not in ("]", "}"):
            return None
        start = self._json_start(text)
        decoded = None if start is None else decode_at(text, start)
        if decoded is not None:
            return decoded[1]
        return len(text) if final else None

    def read_block(self, block: str, tools: Collection[str]) -> list[CallText] | None:
        named = _MISTRAL_NAMED.match(block, len(self.marker))
        if named is None:
            value = _whole_json(block[len(self.marker) :])
            return None if value is None else _calls_in(value, tools)
        arguments = read_arguments(_whole_json(block[named.end() :]))
        name = named.group(1)
        if arguments is None or name not in tools:
            return None
        return [CallText(name, arguments_text(arguments))]


_LLAMA_KEYS = ("name", "parameters", "arguments", "type")


@dataclass(frozen=True)
class LlamaFormat:
    """Llama 3.x: the answer is one or more ``{"name": ..., "parameters": {...}}`` objects
    separated by ``;`` — from its first character, or after ``<|python_tag|>``. Without a tag,
    only JSON that is the whole answer, names an offered tool, has arguments and no other keys
    is a call: an ordinary JSON answer stays an answer."""

    tag: str = "<|python_tag|>"

    @property
    def markers(self) -> tuple[str, ...]:
        return (self.tag,)

    def find_start(self, text: str, at_start: bool) -> int:
        tagged = text.find(self.tag)
        if at_start:
            first = len(text) - len(text.lstrip())
            if first < len(text) and text[first] == "{" and (tagged < 0 or first < tagged):
                return first
        return tagged

    def block_end(self, text: str, final: bool) -> int | None:
        return len(text) if final else None  # a call is the rest of the answer

    def read_block(self, block: str, tools: Collection[str]) -> list[CallText] | None:
        body = block[len(self.tag) :] if block.startswith(self.tag) else block
        calls: list[CallText] = []
        for part in _semicolon_separated(body):
            call = read_call(part, tools, require_arguments=True, allowed_keys=_LLAMA_KEYS)
            if call is None:
                return None
            calls.append(call)
        return calls or None


def _semicolon_separated(text: str) -> list[object]:
    """JSON values separated by ``;`` (a trailing one allowed) that make up all of ``text``;
    a value that is not JSON is returned as None."""
    values: list[object] = []
    at = 0
    while text[at:].strip():
        at = len(text) - len(text[at:].lstrip())
        decoded = decode_at(text, at)
        if decoded is None:
            return [None]
        values.append(decoded[0])
        rest = text[decoded[1] :].lstrip()
        if rest and not rest.startswith(";"):
            return [None]
        at = len(text) - len(rest) + (1 if rest else 0)
    return values


def format_for(family: ToolFamily) -> CallFormat:
    if family == ToolFamily.LLAMA3:
        return LlamaFormat()
    if family == ToolFamily.MISTRAL:
        return MistralFormat()
    if family == ToolFamily.HARMONY:
        return HarmonyFormat()
    return TaggedFormat()
