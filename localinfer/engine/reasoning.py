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

A thinking budget (``ReasoningSpec.budget``) is enforced by the sequence: after that many
reasoning tokens it forces ``end_ids``, and the answer follows.
"""

from __future__ import annotations

from dataclasses import dataclass

THINK_START = "<think>"
THINK_END = "</think>"


@dataclass(slots=True, frozen=True)
class ReasoningSpec:
    """How one request's output holds reasoning, and its budget."""

    start: str = THINK_START
    end: str = THINK_END
    starts_inside: bool = False  # the prompt ends inside an opened reasoning block
    budget: int | None = None  # reasoning tokens before ``end_ids`` is forced; None: no limit
    end_ids: tuple[int, ...] = ()  # the closing tag (and the newlines after it) as token ids

    def __post_init__(self) -> None:
        if self.budget is not None and self.budget < 0:
            raise ValueError(f"the thinking budget must be >= 0, got {self.budget}")
        if self.budget is not None and not self.end_ids:
            raise ValueError("a thinking budget needs the closing tag's token ids")


class ReasoningSplitter:
    """Splits one request's streamed text into reasoning and answer (see the module doc)."""

    def __init__(self, spec: ReasoningSpec) -> None:
        self._spec = spec
        # before: nothing decided yet; reasoning; gap: after the closing tag, before the answer
        # text; answer.
        self._state = "reasoning" if spec.starts_inside else "before"
        self._held = ""
        self._fresh = True  # no reasoning text sent yet: leading whitespace is dropped

    @property
    def in_reasoning(self) -> bool:
        """True inside the reasoning block: after its opening tag, before its closing one."""
        return self._state == "reasoning"

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
            return (held.lstrip() if self._fresh else held).rstrip(), ""
        if self._state == "before":
            return "", held
        return "", held.lstrip() if self._state == "gap" else held

    def _advance(self, reasoning: list[str], answer: list[str]) -> bool:
        """Consume what can be decided of ``_held``; False when the rest must wait."""
        spec, held = self._spec, self._held
        if self._state == "before":
            stripped = held.lstrip()
            if not stripped:
                return False  # leading whitespace: wait for what follows it
            if stripped.startswith(spec.start):
                self._state, self._held = "reasoning", stripped[len(spec.start) :]
                return True
            if spec.start.startswith(stripped):
                return False  # "<thi": wait
            self._state = "answer"
            return True
        if self._state == "reasoning":
            if self._fresh:
                held = self._held = held.lstrip()
            at = held.find(spec.end)
            if at >= 0:
                self._emit(reasoning, held[:at].rstrip())
                self._state, self._held = "gap", held[at + len(spec.end) :]
                return True
            # Hold what may begin the closing tag, and trailing whitespace (it may end the
            # reasoning, which drops it).
            body = held[: len(held) - _partial_suffix(held, spec.end)]
            sent = body.rstrip()
            self._emit(reasoning, sent)
            self._held = held[len(sent) :]
            return False
        if self._state == "gap":
            stripped = held.lstrip()
            if not stripped:
                self._held = ""
                return False
            self._state, self._held = "answer", stripped
            return True
        answer.append(held)
        self._held = ""
        return False

    def _emit(self, reasoning: list[str], text: str) -> None:
        if text:
            reasoning.append(text)
            self._fresh = False


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that begins ``tag`` (to hold back)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
