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
from typing import Any, Protocol

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
        return describe_outside(self.dropped)


def describe_outside(n: int) -> str:
    """'12 earlier messages are outside the model's context' ('' for none)."""
    if n <= 0:
        return ""
    messages = "message is" if n == 1 else "messages are"
    return f"{n} earlier {messages} outside the model's context"


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


# -- the chat: room for the answer, and a conversation that remembers where its context begins --

# Said before a summary of left-out turns where it joins the system prompt.
SUMMARY_OPENING = "A summary of the earlier part of this conversation, which you no longer see:"


def answer_reserve(ctx: int, max_tokens: int) -> int:
    """The tokens a cut leaves free for the answer: the max-tokens setting, at most a quarter of
    the context (a max-tokens near the context would leave no room for the conversation)."""
    return max(1, min(max_tokens, ctx // 4))


def cut_slack(ctx: int) -> int:
    """How far below the room a cut goes: an eighth of the context, so that the next few turns
    append to the cached prompt as they are (an exact prefix) before another cut is needed."""
    return ctx // 8


def summary_tokens(ctx: int) -> int:
    """The most tokens a summary of left-out turns may take (it joins the system prompt)."""
    return max(16, min(128, ctx // 16))


SUMMARY_REQUEST_TOKENS = 64  # the request for a summary, as the template renders it (at most)


def summary_room(ctx: int) -> int:
    """What ``summarize`` keeps free besides the answer: the summary is asked after the previous
    answer (where the cache holds the whole conversation), and must fit there with its request."""
    return summary_tokens(ctx) + SUMMARY_REQUEST_TOKENS


def fit_with_room(
    messages: Sequence[Message],
    count: Callable[[Sequence[Message]], int],
    ctx: int,
    max_tokens: int,
    policy: OverflowPolicy | str,
    keep: int = 0,
) -> Fit:
    """The chat's fit of ``messages`` into a context of ``ctx`` tokens under ``policy``.

    Under ``stop`` nothing is left out (the engine refuses a prompt past the context, as before).
    Otherwise a prompt that leaves less than :func:`answer_reserve` free is cut to fit with
    :func:`cut_slack` to spare; where only the question fits, with whatever room is left. ``keep``
    tokens more are kept free (``summarize``'s :func:`summary_room`). A question that alone
    exceeds the context is refused (ContextOverflowError)."""
    policy = OverflowPolicy(policy)
    whole = list(messages)
    counted: dict[int, int] = {}

    def tokens(kept: Sequence[Message]) -> int:  # every candidate is a suffix after the head
        if len(kept) not in counted:
            counted[len(kept)] = count(kept)
        return counted[len(kept)]

    room = ctx - answer_reserve(ctx, max_tokens) - keep
    if policy is OverflowPolicy.STOP or tokens(whole) <= room:
        return Fit(whole, tokens(whole))
    for limit in (room - cut_slack(ctx), room):
        try:
            return fit_messages(whole, tokens, limit, OverflowPolicy.DROP_OLDEST)
        except ContextOverflowError:
            pass
    # Even the question alone leaves less than the reserve: send it alone (the most room left
    # for the answer), if it fits at all.
    starts = turn_starts(whole)
    alone = whole[: _system_count(whole)] + whole[starts[-1] :] if starts else whole
    if tokens(alone) + 1 > ctx:
        raise ContextOverflowError(
            tokens(alone) + 1, ctx, what="the question alone, plus one new token"
        )
    return fit_messages(whole, tokens, tokens(alone), OverflowPolicy.DROP_OLDEST)


class ShownMessage(Protocol):
    """A saved message (conversations.ChatMessage): a "system" one inside the conversation is a
    summary of the messages before it that the model no longer sees."""

    role: str
    content: str

    def as_prompt(self) -> dict[str, str]: ...


def window_start(messages: Sequence[ShownMessage], start: int) -> int:
    """``start`` where it still points into ``messages``; 0 where it does not (the conversation
    was cut shorter since, as a branch does)."""
    return start if 0 <= start <= len(messages) else 0


def window_messages(
    system_prompt: str, messages: Sequence[ShownMessage], start: int = 0
) -> list[dict[str, str]]:
    """What the model sees of a conversation whose context begins at ``messages[start]``: the
    system prompt, with the latest summary before ``start`` after it, then the turns from
    ``start`` on."""
    start = window_start(messages, start)
    notes = [m.content for m in messages[:start] if m.role == "system"]
    system = system_prompt
    if notes:
        system = "\n\n".join(filter(None, (system_prompt, f"{SUMMARY_OPENING} {notes[-1]}")))
    head = [{"role": "system", "content": system}] if system else []
    return head + [m.as_prompt() for m in messages[start:] if m.role != "system"]


def outside_count(messages: Sequence[ShownMessage], start: int) -> int:
    """How many of the conversation's messages the model no longer sees (summaries not counted)."""
    start = window_start(messages, start)
    return sum(1 for m in messages[:start] if m.role != "system")
