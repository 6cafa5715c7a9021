"""gpt-oss's tool calls (the HARMONY family): messages on the ``commentary`` channel addressed to
a function, read out of the answer the reasoning split left (engine/reasoning.py took the
``analysis`` channel and the ``final`` channel's header away).

A call is ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}``, the
recipient also written in the role header (``<|start|>assistant to=functions.NAME<|channel|>
commentary json<|message|>``, as the template renders earlier calls); it ends at ``<|call|>``
(an end of generation, so usually the end of the text), or ``<|end|>``. Harmony's other
structure in the answer is no text either: a message header without a recipient (a commentary
preamble's, whose body is content) and ``<|end|>`` are dropped. Only these blocks are read, never
the reasoning, so a call the model mentions while it thinks is never made.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

from localinfer.tools.call_json import CallText, arguments_text, decode_at, read_arguments

MESSAGE = "<|message|>"
END = "<|end|>"
# Texts that end a call's body; <|call|> and <|return|> end generation, so only a stop string
# or a model that writes on would leave them in the text.
BODY_ENDS = ("<|call|>", END, "<|return|>")
MAX_HEADER = 256  # a header longer than this without its <|message|> is text
_RECIPIENT = re.compile(r"\bto=functions\.([A-Za-z0-9_.\-]{1,64})")


@dataclass(frozen=True)
class HarmonyFormat:
    """One harmony message (or its end marker) per block: see the module doc."""

    @property
    def markers(self) -> tuple[str, ...]:
        return ("<|start|>", "<|channel|>", END)

    def find_start(self, text: str, at_start: bool) -> int:
        found = [at for at in (text.find(m) for m in self.markers) if at >= 0]
        return min(found, default=-1)

    def block_end(self, text: str, final: bool) -> int | None:
        if text.startswith(END):
            return len(END)
        body = text.find(MESSAGE)
        if body < 0:
            if final or len(text) > MAX_HEADER:
                return len(text)  # never a whole header: text
            return None
        body += len(MESSAGE)
        if _RECIPIENT.search(text, 0, body) is None:
            return body  # a header alone: its message's body is content
        ends = [at for at in (text.find(m, body) for m in BODY_ENDS) if at >= 0]
        if ends:
            at = min(ends)
            return at + len(next(m for m in BODY_ENDS if text.startswith(m, at)))
        return len(text) if final else None

    def read_block(self, block: str, tools: Collection[str]) -> list[CallText] | None:
        if block == END:
            return []
        body = block.find(MESSAGE)
        if body < 0:
            return None
        recipient = _RECIPIENT.search(block, 0, body)
        if recipient is None:
            return []
        name = recipient.group(1)
        text = block[body + len(MESSAGE) :]
        for end in BODY_ENDS:
            text = text.removesuffix(end)
        if name not in tools:
            return None
        if not text.strip():
            return [CallText(name, "{}")]  # a call without arguments
        start = len(text) - len(text.lstrip())
        decoded = decode_at(text, start)
        if decoded is None or text[decoded[1] :].strip():
            return None
        arguments = read_arguments(decoded[0])
        return None if arguments is None else [CallText(name, arguments_text(arguments))]
