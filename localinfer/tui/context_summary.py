"""The ``summarize`` policy's summary (#39): before the answer, a separate, bounded generation on
the same engine writes a few sentences about the turns a cut leaves out.

Its prompt is the conversation as the model last saw it, up to the cut, then the request. That is
the beginning of the slot's cached prompt, so only the request is prefilled, and the summary sees
the earlier summary too (it sits in the system prompt): each summary covers everything before it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from localinfer.context_fit import ShownMessage, summary_tokens, window_messages

if TYPE_CHECKING:
    from localinfer.tui.answer_source import AnswerSource

SUMMARY_REQUEST = (
    "Summarize our conversation so far in a few sentences: the facts, names, numbers and "
    "decisions that the rest of it may need. Write only the summary."
)


@dataclass(slots=True, frozen=True)
class Summary:
    """What the generation gave: the text ('' when it failed or was stopped) and why not."""

    text: str
    failure: str = ""


def summary_prompt(
    system_prompt: str, messages: Sequence[ShownMessage], start: int, cut: int
) -> list[dict[str, str]]:
    """The summary's messages: what the model saw of ``messages`` before ``cut`` (from ``start``,
    with the earlier summary), then the request."""
    seen = window_messages(system_prompt, messages[:cut], start)
    return [*seen, {"role": "user", "content": SUMMARY_REQUEST}]


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
