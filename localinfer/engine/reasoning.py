"""A thinking model's reasoning kept apart from its answer, as the text streams.

Thinking models (Qwen3, QwQ, DeepSeek-R1 distills, SmolLM3) write ``<think> ... </think>`` before
their answer; some templates open the ``<think>`` in the generation prompt themselves, so the
output starts inside the reasoning. The engine runs each thinking request's text through a
:class:`ReasoningSplitter`, and every StreamEvent carries the two parts apart (``reasoning``,
``text``); the server, the chat and ``generate`` only route them.

Rules (llama-server's ``--reasoning-format deepseek`` and vLLM's reasoning parsers agree):

- reasoning is one block at the start of the output: the opening tag after optional
  whitespace, or from the first token when the prompt opened it (``starts_inside``);
- an answer that starts with anything else has no reasoning, and a tag later in it stays text;
- the whitespace between the closing tag and the answer is dropped, and so is the whitespace
  at either end of the reasoning (templates write the tags on lines of their own);
- no closing tag before the end: all of it was reasoning;
- a tag split over tokens is held back until it is whole (or proves not to be one).

gpt-oss's harmony format writes its reasoning as a message on the ``analysis`` channel
(``<|channel|>analysis<|message|>...<|end|>``) and its answer as one on the ``final`` channel.
Its spec names the message headers that open the answer (``headers``, each running on to
``header_end``, ``<|message|>``): they are neither reasoning nor answer, and are dropped where
the answer starts (first in the output, or after the closing marker). After the closing
marker, a header that reopens the reasoning (``reopen``: a second analysis message) continues it;
anything else (a tool call on the commentary channel) is answer text, as written, for the
tool-call parser.

A thinking budget (``ReasoningSpec.budget``) is enforced by the sequence: after that many
reasoning tokens it forces ``end_ids``, and the answer follows. A constraint waits for the
answer; where a header must open it (harmony), the sequence forces ``header_ids`` when the
reasoning closes, so the constrained text is the final channel's.
"""

from __future__ import annotations

from dataclasses import dataclass

THINK_START = "<think>"
THINK_END = "</think>"
# Text a header may hold between its start and its end (harmony: `` <|constrain|>json``).
MAX_HEADER = 64


@dataclass(slots=True, frozen=True)
class ReasoningSpec:
    """How one request's output holds reasoning, and its budget."""

    start: str = THINK_START
    end: str = THINK_END
    starts_inside: bool = False  # the prompt ends inside an opened reasoning block
    budget: int | None = None  # reasoning tokens before ``end_ids`` is forced; None: no limit
    end_ids: tuple[int, ...] = ()  # the closing tag (and the newlines after it) as token ids
    headers: tuple[str, ...] = ()  # texts that open the answer, dropped (harmony's final header)
    header_end: str = ""  # a header runs on to this (harmony: <|message|>); "": it is exact
    reopen: str = ""  # after the closing marker, text that opens more reasoning (harmony)
    header_ids: tuple[int, ...] = ()  # the header forced after the reasoning (a constraint waits)

    def __post_init__(self) -> None:
        if self.budget is not None and self.budget < 0:
            raise ValueError(f"the thinking budget must be >= 0, got {self.budget}")
        if self.budget is not None and not self.end_ids:
            raise ValueError("a thinking budget needs the closing tag's token ids")


class ReasoningSplitter:
    """Splits one request's streamed text into reasoning and answer (see the module doc)."""

    def __init__(self, spec: ReasoningSpec) -> None:
        self._spec = spec
        # before: nothing decided yet; reasoning; closed: after the closing marker, before the
        # answer's header (harmony); gap: before the answer text (whitespace dropped); answer.
        self._state = "reasoning" if spec.starts_inside else "before"
        self._held = ""
        self._fresh = True  # at the start of a reasoning message: leading whitespace is dropped
        self._sent = False  # some reasoning text was sent
        self._owed = False  # a reopened reasoning owes a paragraph break before its text

    @property
    def in_reasoning(self) -> bool:
        """True inside the reasoning block: after its opening tag, before its closing one."""
        return self._state == "reasoning"

    @property
    def closed(self) -> bool:
        """The reasoning ended and the header that opens the answer is not written yet."""
        return self._state == "closed"

    @property
    def answering(self) -> bool:
        return self._state in ("gap", "answer")

    @property
    def reasoning_started(self) -> bool:
        return self._state != "before"

    def feed(self, text: str) -> tuple[str, str]:
        """New ``(reasoning, answer)`` text for ``text``; a part that could be a tag is held."""
        self._held += text
        reasoning: list[str] = []
        answer: list[str] = []
        while self._held:
            if not self._advance(reasoning, answer):
                break
        return "".join(reasoning), "".join(answer)

    def finish(self) -> tuple[str, str]:
        """What is held at the end of the output: a tag that never completed is text."""
        held, self._held = self._held, ""
        if self._state == "reasoning":
            reasoning: list[str] = []
            self._emit(reasoning, (held.lstrip() if self._fresh else held).rstrip())
            return "".join(reasoning), ""
        if self._state in ("before", "closed"):
            return "", "" if self._cut_header(held) else held
        return "", held.lstrip() if self._state == "gap" else held

    def _advance(self, reasoning: list[str], answer: list[str]) -> bool:
        """Consume what can be decided of ``_held``; False when the rest must wait."""
        if self._state == "before":
            return self._opening((self._spec.start, "reasoning"))
        if self._state == "reasoning":
            return self._reasoning(reasoning)
        if self._state == "closed":
            return self._opening((self._spec.reopen, "reopened"))
        if self._state == "gap":
            stripped = self._held.lstrip()
            if not stripped:
                self._held = ""
                return False
            self._state, self._held = "answer", stripped
            return True
        answer.append(self._held)
        self._held = ""
        return False

    def _opening(self, opener: tuple[str, str]) -> bool:
        """Before the reasoning or after it: the text that opens reasoning (``opener``: the
        marker and the state it leads to), a header that opens the answer, or the answer."""
        stripped = self._held.lstrip()
        if not stripped:
            return False  # leading whitespace: wait for what follows it
        marker, state = opener
        if marker and stripped.startswith(marker):
            self._held = stripped[len(marker) :]
            self._state, self._fresh = "reasoning", True
            self._owed = state == "reopened" and self._sent
            return True
        for header in self._spec.headers:
            if stripped.startswith(header):
                end = self._header_end(stripped, len(header))
                if end is None:
                    return False  # the header's end may still come
                if end >= 0:
                    self._state, self._held = "gap", stripped[end:]
                    return True
        if any(m.startswith(stripped) for m in (marker, *self._spec.headers) if m):
            return False  # "<thi": wait
        if self._state == "closed":
            self._held = stripped
        self._state = "answer"
        return True

    def _cut_header(self, held: str) -> bool:
        """``held`` (at the end of the output) is a message header cut short: markup of a
        format with headers (harmony), not text."""
        spec, text = self._spec, held.lstrip()
        if not spec.headers or not text:
            return False
        markers = (spec.start, spec.reopen, *spec.headers)
        return any(m.startswith(text) or text.startswith(m) for m in markers if m)

    def _header_end(self, text: str, at: int) -> int | None:
        """Where a header found at the start of ``text`` (its first ``at`` characters) ends: -1
        when it does not (too long to be one), None when its end may still come."""
        mark = self._spec.header_end
        if not mark:
            return at
        found = text.find(mark, at, at + MAX_HEADER + len(mark))
        if found >= 0:
            return found + len(mark)
        return None if len(text) < at + MAX_HEADER + len(mark) else -1

    def _reasoning(self, reasoning: list[str]) -> bool:
        spec, held = self._spec, self._held
        if self._fresh:
            held = self._held = held.lstrip()
        at = held.find(spec.end)
        if at >= 0:
            self._emit(reasoning, held[:at].rstrip())
            self._state = "closed" if spec.headers else "gap"
            self._held = held[at + len(spec.end) :]
            return True
        # Hold what may begin the closing tag, and trailing whitespace (it may end the
        # reasoning, which drops it).
        body = held[: len(held) - _partial_suffix(held, spec.end)]
        sent = body.rstrip()
        self._emit(reasoning, sent)
        self._held = held[len(sent) :]
        return False

    def _emit(self, reasoning: list[str], text: str) -> None:
        if text:
            if self._owed:
                reasoning.append("\n\n")
                self._owed = False
            reasoning.append(text)
            self._fresh = False
            self._sent = True


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that begins ``tag`` (to hold back)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
