"""context_fit: which whole turns a conversation past the context leaves out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from localinfer.context_fit import OverflowPolicy, fit_messages, turn_starts
from localinfer.errors import ContextOverflowError
from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.loader import load_model


def words(messages: Sequence[Mapping[str, Any]]) -> int:
    """A counter: one token per word, plus 2 per message (its role markers)."""
    return sum(len(str(m.get("content") or "").split()) + 2 for m in messages)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str, **more: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **more}


def conversation(turns: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for i in range(turns):
        out += [user(f"question {i} " + "w " * 8), assistant(f"answer {i} " + "w " * 8)]
    return out[:-1]  # ends on the question


def test_a_conversation_that_fits_is_untouched() -> None:
    msgs = conversation(3)
    fit = fit_messages(msgs, words, limit=1000, policy="drop-oldest")
    assert fit.messages == msgs and fit.dropped == 0 and fit.describe() == ""
    assert fit.prompt_tokens == words(msgs)


def test_drop_oldest_keeps_the_system_prompt_and_the_newest_whole_turns() -> None:
    msgs = conversation(10)  # 19 messages after the system prompt, 12 tokens each
    limit = 60
    fit = fit_messages(msgs, words, limit, OverflowPolicy.DROP_OLDEST)
    assert fit.prompt_tokens == words(fit.messages) <= limit
    assert fit.messages[0] == msgs[0]  # the system prompt
    assert fit.messages[-1] == msgs[-1]  # the question
    assert fit.messages[1]["role"] == "user"  # a cut never falls inside a turn
    assert fit.messages[1:] == msgs[1 + fit.dropped :]  # the newest messages, in order
    # It keeps as many turns as fit: one more turn would not.
    more = [msgs[0], *msgs[1 + fit.dropped - 2 :]]
    assert words(more) > limit
    assert fit.dropped_turns * 2 == fit.dropped
    assert fit.first_kept == 1 + fit.dropped
    assert fit.describe() == f"{fit.dropped} earlier messages are outside the model's context"


def test_tool_calls_stay_with_their_results() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    msgs = [
        user("first " + "w " * 20),
        assistant("", tool_calls=[call]),
        {"role": "tool", "tool_call_id": "c1", "content": "result " + "w " * 20},
        assistant("done " + "w " * 20),
        user("second"),
        assistant("", tool_calls=[call]),
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
        assistant("ok"),
        user("third"),
    ]
    fit = fit_messages(msgs, words, limit=20, policy="drop-oldest")
    assert fit.messages == msgs[4:] and fit.dropped == 4 and fit.dropped_turns == 1


def test_stop_refuses_and_a_question_too_long_alone_is_refused_under_every_policy() -> None:
    msgs = conversation(10)
    with pytest.raises(ContextOverflowError, match="maximum context length is 60 tokens"):
        fit_messages(msgs, words, 60, "stop")
    long_question = [*msgs[:-1], user("w " * 100)]
    for policy in ("drop-oldest", "summarize"):
        with pytest.raises(ContextOverflowError, match="the last message alone"):
            fit_messages(long_question, words, 60, policy)
    with pytest.raises(ValueError):
        fit_messages(msgs, words, 60, "truncate-middle")


def test_turn_starts_skip_the_system_prompt_and_leading_greeting() -> None:
    msgs = [{"role": "system", "content": "s"}, assistant("hi"), user("a"), assistant("b")]
    assert turn_starts(msgs) == [2]


def test_counted_with_the_embedded_models_own_template() -> None:
    model = load_model(embedded_model_path())
    template, tok = model.chat_template, model.tokenizer
    assert template is not None

    def count(messages: Sequence[Mapping[str, Any]]) -> int:
        text = template.render(messages, add_generation_prompt=True)
        return len(tok.encode(text, add_special_tokens=False))

    msgs = conversation(40)
    limit = 256
    fit = fit_messages(msgs, count, limit, "drop-oldest")
    assert 0 < fit.dropped < len(msgs) - 2
    assert fit.prompt_tokens == count(fit.messages) <= limit
    assert count([msgs[0], *msgs[1 + fit.dropped - 2 :]]) > limit  # one more turn would not fit
