"""A conversation longer than the context: which whole turns to leave out, and saying so.

The chat and ``serve --context-overflow`` share this policy:

* ``stop`` (the server's default, OpenAI's semantics): nothing is left out; a conversation that
  does not fit is refused with ``context_length_exceeded``;
* ``drop-oldest`` (the chat's default): the system prompt and the newest whole turns stay, the
  oldest whole turns go;
* ``summarize`` (the chat only): as ``drop-oldest``, and the model writes a short summary of what
  was left out, kept as a system note (the chat's summary step does that part).

A turn is a user message and everything after it up to the next user message (the assistant's
answer, its tool calls and their results), so a tool call is never separated from its result and
a cut never falls inside a turn. The system prompt and the question (the last turn) always stay:
a question that alone exceeds the room is refused, as under ``stop``.

Which turns fit is measured with the caller's counter (the chat template rendered and tokenized),
not estimated: fewer turns never make a longer prompt, so a binary search over how many turns to
leave out needs about log2(turns) renderings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from localinfer.errors import ContextOverflowError

Message = Mapping[str, Any]
SYSTEM_ROLES = ("system", "developer")


class OverflowPolicy(StrEnum):
    STOP = "stop"
    DROP_OLDEST = "drop-oldest"
    SUMMARIZE = "summarize"


POLICIES = tuple(p.value for p in OverflowPolicy)


@dataclass(slots=True, frozen=True)
class Fit:
    """What goes to the template: ``messages``, after leaving out ``dropped`` messages (the
    oldest whole turns, ``dropped_turns`` of them) right after the system prompt."""

    messages: list[Message]
    prompt_tokens: int
    dropped: int = 0
    dropped_turns: int = 0

    @property
    def first_kept(self) -> int:
        """Index, in the full conversation, of the first message after the system prompt that
        the model still sees (where the chat draws its marker)."""
        return self.dropped + _system_count(self.messages)

    def describe(self) -> str:
        """One line that says what was left out ('' when nothing was)."""
        if not self.dropped:
            return ""
        s = "" if self.dropped == 1 else "s"
        return f"{self.dropped} earlier message{s} are outside the model's context"


def _system_count(messages: Sequence[Message]) -> int:
    n = 0
    while n < len(messages) and messages[n].get("role") in SYSTEM_ROLES:
        n += 1
    return n


def turn_starts(messages: Sequence[Message]) -> list[int]:
    """Indices of the user messages that open a turn, after the leading system messages."""
    head = _system_count(messages)
    return [i for i in range(head, len(messages)) if messages[i].get("role") == "user"]


def fit_messages(
    messages: Sequence[Message],
    count: Callable[[Sequence[Message]], int],
    limit: int,
    policy: OverflowPolicy | str = OverflowPolicy.STOP,
) -> Fit:
    """The messages to render so that ``count(messages) <= limit`` under ``policy``.

    ``count`` gives the prompt's tokens for a list of messages (rendered as the template renders
    them). Raises ContextOverflowError when even the system prompt and the last turn exceed
    ``limit`` (or, under ``stop``, when the whole conversation does)."""
    policy = OverflowPolicy(policy)
    whole = list(messages)
    tokens = count(whole)
    if tokens <= limit:
        return Fit(whole, tokens)
    starts = turn_starts(whole)
    if policy is OverflowPolicy.STOP or len(starts) < 2:
        raise ContextOverflowError(tokens, limit, what="the whole conversation")
    head = whole[: _system_count(whole)]

    def kept(k: int) -> list[Message]:  # the system prompt, then turns k and later
        return head + whole[starts[k] :]

    counted: dict[int, int] = {}

    def tokens_of(k: int) -> int:
        if k not in counted:
            counted[k] = count(kept(k))
        return counted[k]

    last = len(starts) - 1
    if tokens_of(last) > limit:
        raise ContextOverflowError(
            tokens_of(last), limit, what="the system prompt and the last message alone"
        )
    lo, hi = 0, last  # kept(hi) fits; find the smallest k that does
    while lo < hi:
        mid = (lo + hi) // 2
        if tokens_of(mid) <= limit:
            hi = mid
        else:
            lo = mid + 1
    dropped = starts[hi] - len(head)
    return Fit(kept(hi), tokens_of(hi), dropped=dropped, dropped_turns=hi)
