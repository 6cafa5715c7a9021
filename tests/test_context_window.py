"""The chat's context window (#39): the room a cut leaves for the answer, and a conversation that
remembers where the model's context begins (saved, reopened, summaries included)."""

from __future__ import annotations

import pytest

from localinfer.context_fit import (
    SUMMARY_OPENING,
    answer_reserve,
    cut_slack,
    fit_with_room,
    outside_count,
    summary_room,
    window_messages,
)
from localinfer.conversations import ChatMessage, Conversation
from localinfer.errors import ContextOverflowError
from tests.test_context_fit import conversation, user, words


def test_the_reserve_is_max_tokens_at_most_a_quarter_of_the_context() -> None:
    assert answer_reserve(2048, 100) == 100
    assert answer_reserve(2048, 4096) == 512
    assert answer_reserve(64, 0) == 1


def test_a_prompt_that_leaves_room_for_the_answer_is_untouched() -> None:
    msgs = conversation(3)
    fit = fit_with_room(msgs, words, ctx=words(msgs) + 10, max_tokens=10, policy="drop-oldest")
    assert fit.dropped == 0 and fit.messages == msgs


def test_a_cut_leaves_the_reserve_and_the_slack_free() -> None:
    msgs = conversation(30)  # 12 tokens a message
    ctx, max_tokens = 256, 32
    fit = fit_with_room(msgs, words, ctx, max_tokens, "drop-oldest")
    assert fit.dropped > 0 and fit.messages[0] == msgs[0] and fit.messages[-1] == msgs[-1]
    assert fit.prompt_tokens <= ctx - answer_reserve(ctx, max_tokens) - cut_slack(ctx)
    assert fit.messages[1]["role"] == "user"


def test_stop_leaves_everything_in_and_the_engine_refuses() -> None:
    msgs = conversation(30)
    fit = fit_with_room(msgs, words, 256, 32, "stop")
    assert fit.dropped == 0 and fit.prompt_tokens > 256


def test_a_question_that_fits_only_alone_is_sent_with_less_room() -> None:
    msgs = [*conversation(5)[:-1], user("w " * 200)]
    fit = fit_with_room(msgs, words, ctx=256, max_tokens=64, policy="drop-oldest")
    assert fit.messages == [msgs[0], msgs[-1]]
    too_long = [*msgs[:-1], user("w " * 300)]
    with pytest.raises(ContextOverflowError, match="maximum context length is 256 tokens"):
        fit_with_room(too_long, words, ctx=256, max_tokens=64, policy="summarize")


def test_the_window_sends_the_turns_from_its_start_with_the_latest_summary() -> None:
    msgs = [ChatMessage("user", "q0"), ChatMessage("assistant", "a0")]
    msgs += [ChatMessage("system", "they said hello"), ChatMessage("user", "q1")]
    msgs += [ChatMessage("assistant", "a1", reasoning="hm"), ChatMessage("user", "q2")]
    assert window_messages("Be brief.", msgs, 0)[1:] == [
        {"role": "user", "content": "q0"},
        {"role": "assistant", "content": "a0"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "hm"},
        {"role": "user", "content": "q2"},
    ]
    window = window_messages("Be brief.", msgs, 3)
    assert window[0] == {
        "role": "system",
        "content": f"Be brief.\n\n{SUMMARY_OPENING} they said hello",
    }
    assert [m["content"] for m in window[1:]] == ["q1", "a1", "q2"]
    assert window_messages("", msgs, 3)[0]["content"] == f"{SUMMARY_OPENING} they said hello"
    assert outside_count(msgs, 3) == 2  # the summary is not a message the user wrote or read
    assert window_messages("", msgs, 99)[0] == {"role": "user", "content": "q0"}  # stale: all


def test_a_saved_conversation_keeps_its_context_start() -> None:
    conv = Conversation(system_prompt="s")
    for i in range(3):
        conv.add("user", f"q{i}")
        conv.add("assistant", f"a{i}")
    conv.context_start = 4
    data = conv.to_json()
    assert data["context_start"] == 4
    again = Conversation.from_json(data)
    assert again.context_start == 4 and again.prompt_messages() == conv.prompt_messages()
    assert [m["content"] for m in again.prompt_messages()] == ["s", "q2", "a2"]
    for bad in (-1, 99, "2", True, None):
        assert Conversation.from_json({**data, "context_start": bad}).context_start == 0
    assert "context_start" not in Conversation().to_json()  # older readers see what they knew


def test_summarize_keeps_room_for_the_summary_too() -> None:
    msgs = conversation(30)
    ctx, max_tokens = 512, 32
    plain = fit_with_room(msgs, words, ctx, max_tokens, "summarize")
    kept = fit_with_room(msgs, words, ctx, max_tokens, "summarize", keep=summary_room(ctx))
    assert kept.dropped > plain.dropped
    assert kept.prompt_tokens <= ctx - max_tokens - summary_room(ctx) - cut_slack(ctx)
