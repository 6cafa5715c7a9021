"""``serve --context-overflow``: a chat past the context, answered with its oldest turns left out.

OpenAI's semantics stay the default (``stop``: a 400 ``context_length_exceeded``). With
``drop-oldest`` a chat request (OpenAI chat, Anthropic Messages, Responses: all planned by
``chat_plan``) whose messages do not fit keeps its system prompt and newest whole turns
(``context_fit``), and the response says how many messages were left out: the header
``X-Context-Dropped-Messages`` and, on OpenAI chat, ``usage.dropped_messages``.

The policy reaches the planner through a context variable that the answer route sets for the
request (it crosses into the worker thread that plans it): the planners' signatures are the
same for every API and carry no server settings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from localinfer.context_fit import Fit, OverflowPolicy, fit_messages

DROPPED_HEADER = "X-Context-Dropped-Messages"
SERVE_POLICIES = (OverflowPolicy.STOP.value, OverflowPolicy.DROP_OLDEST.value)
# Left free for the answer when the request names no max_tokens: a quarter of the context, at
# most this many tokens, so a cut leaves the model room to say something.
DEFAULT_ANSWER_ROOM = 1024


@dataclass(slots=True, frozen=True)
class OverflowSetting:
    policy: OverflowPolicy
    max_ctx: int  # the served model's context per request


REQUEST_OVERFLOW: ContextVar[OverflowSetting | None] = ContextVar("overflow", default=None)


def answer_room(max_ctx: int, max_tokens: int | None) -> int:
    """Tokens a cut leaves free for the answer."""
    room = max_tokens if max_tokens else min(DEFAULT_ANSWER_ROOM, max_ctx // 4)
    return max(1, min(room, max_ctx // 2))


def fit_for_request(
    messages: Sequence[Mapping[str, Any]],
    count: Callable[[Sequence[Mapping[str, Any]]], int],
    max_tokens: int | None,
) -> Fit | None:
    """The messages to plan under this request's policy; None when the policy is ``stop`` (the
    caller renders everything and the engine refuses what does not fit)."""
    setting = REQUEST_OVERFLOW.get()
    if setting is None or setting.policy is OverflowPolicy.STOP:
        return None
    limit = setting.max_ctx - answer_room(setting.max_ctx, max_tokens)
    return fit_messages(messages, count, limit, setting.policy)


class Rendered(Protocol):
    ids: list[int]


P = TypeVar("P", bound=Rendered)


def fitted_prompt(
    messages: Sequence[Mapping[str, Any]],
    render: Callable[[Sequence[Mapping[str, Any]]], P],
    max_tokens: int | None,
) -> tuple[P, int]:
    """``render``'s prompt of ``messages`` under this request's policy, and how many messages
    it left out. Each candidate is rendered once: the one counted last is the one returned
    (candidates are the system prompt and a suffix, so their lengths tell them apart)."""
    rendered: dict[int, P] = {}

    def once(kept: Sequence[Mapping[str, Any]]) -> P:
        if len(kept) not in rendered:
            rendered[len(kept)] = render(kept)
        return rendered[len(kept)]

    fit = fit_for_request(messages, lambda kept: len(once(kept).ids), max_tokens)
    if fit is None:
        return once(messages), 0
    return once(fit.messages), fit.dropped
