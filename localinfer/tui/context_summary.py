"""The ``summarize`` policy's summary (#39): before the answer, a separate, bounded generation on
the same engine writes a few sentences about the turns a cut leaves out.

Its prompt is the conversation as the model last saw it (the previous prompt and its answer),
then a request for a summary of what came before the first message kept. That is what the slot's
cache holds, so only the request is prefilled, and the kept turns stay cached behind it: the
question after the summary still finds their KV to move into place (with one slot, a prompt of
the left-out turns alone would have taken the slot, and the kept turns been prefilled again).
Where the summary would not fit after it, the prompt is the left-out turns alone, then the
request (their KV is still the cache's beginning; the kept turns' is lost). The summary sees the
earlier summary too (it sits in the system prompt): each one covers everything before it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from localinfer.context_fit import ShownMessage, summary_tokens, window_messages

if TYPE_CHECKING:
    from localinfer.tui.answer_source import AnswerSource

SUMMARY_REQUEST = (
    "Summarize our conversation so far in a few sentences: the facts, names, numbers and "
    "decisions that the rest of it may need. Write only the summary."
)
SUMMARY_BEFORE = (
    'Summarize our conversation before my message that begins "{opening}" in a few '
    "sentences: the facts, names, numbers and decisions that the rest of it may need. Write only "
    "the summary."
)
OPENING_WORDS = 8


@dataclass(slots=True, frozen=True)
class Summary:
    """What the generation gave: the text ('' when it failed or was stopped) and why not."""

    text: str
    failure: str = ""


def summary_prompt(
    system_prompt: str,
    messages: Sequence[ShownMessage],
    start: int,
    cut: int,
    count: Callable[[list[dict[str, str]]], int],
    ctx: int,
) -> list[dict[str, str]]:
    """The summary's messages for a cut at ``cut`` of ``messages`` (whose last is the new
    question; the model saw them from ``start``): the previous prompt and answer then the request,
    or where that leaves no room for the summary (``count``: a prompt's tokens), the left-out
    turns then the request (module doc)."""
    dropped = [*window_messages(system_prompt, messages[:cut], start), _ask(SUMMARY_REQUEST)]
    if cut >= len(messages) - 1:  # only the question is kept: the two prompts are one
        return dropped
    words = messages[cut].content.split()
    opening = " ".join(words[:OPENING_WORDS]) + ("…" if len(words) > OPENING_WORDS else "")
    seen = window_messages(system_prompt, messages[:-1], start)
    whole = [*seen, _ask(SUMMARY_BEFORE.format(opening=opening))]
    return whole if count(whole) + summary_tokens(ctx) <= ctx else dropped


def _ask(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def write_summary(
    source: AnswerSource,
    prompt_messages: list[dict[str, str]],
    ctx: int,
    request_id: str,
    stop: threading.Event,
) -> Summary:
    """Generate the summary (greedy, thinking off, at most ``summary_tokens(ctx)`` tokens);
    ``stop`` set (Esc) aborts it. Never raises: a failure is said in ``Summary.failure``."""
    from localinfer.engine.types import SamplingParams
    from localinfer.tools.thinking import Thinking

    params = SamplingParams(max_tokens=summary_tokens(ctx), temperature=0.0)
    parts: list[str] = []
    try:
        prompt = source.prepare(prompt_messages, Thinking(enabled=False))
        for event in source.stream(prompt, params, request_id):
            parts.append(event.text)
            if stop.is_set():
                source.abort(request_id)
            if event.finish_reason is not None:
                if event.finish_reason in ("error", "abort"):
                    return Summary("", event.error or "stopped")
                break
    except Exception as exc:  # noqa: BLE001 - the cut goes on without a summary
        source.abort(request_id)
        return Summary("", str(exc) or type(exc).__name__)
    return Summary(" ".join("".join(parts).split()))
