"""Anthropic's Messages API on a thinking model, through the real server with the official
``anthropic`` client (tests/test_server_thinking.py's Qwen3-templated scripted model):
``thinking`` enabled gives a ``thinking`` block (with a signature) before the text, whole and
streamed as ``thinking_delta`` and ``signature_delta`` events; not asked, the reasoning is
neither shown nor in the text; ``disabled`` turns the template's thinking off; ``budget_tokens``
is the engine's exact budget; earlier ``thinking`` blocks go back to the template."""

from __future__ import annotations

import anthropic
import pytest

from localinfer.server.anthropic_render import signature
from tests.test_server_thinking import ANSWER, ASK, SCRIPT, THOUGHT, chat, served  # noqa: F401

ENABLED = {"type": "enabled", "budget_tokens": 1024}
LONG = "<think>\n" + "step " * 80 + "</think>\n\nDone."


def ask(served, script: str = SCRIPT, **options):  # noqa: F811
    session, _, claude = served
    session.script(script)
    options.setdefault("max_tokens", 200)
    return claude.messages.create(model=session.model.name, messages=ASK, **options)


def streamed(served, script: str = SCRIPT, **options) -> list:  # noqa: F811
    """The stream's raw events, in order."""
    with ask(served, script, stream=True, **options) as stream:
        return list(stream)


def test_enabled_thinking_is_a_block_before_the_text(served) -> None:  # noqa: F811
    message = ask(served, thinking=ENABLED)
    thinking, text = message.content
    assert thinking.type == "thinking" and thinking.thinking == THOUGHT
    assert thinking.signature == signature(THOUGHT)
    assert text.type == "text" and text.text == ANSWER
    assert message.stop_reason == "end_turn"
    # Thinking tokens are output tokens, as Anthropic counts them.
    assert message.usage.output_tokens == len(served[0].runner.script) + 1


def test_enabled_thinking_streams_thinking_then_signature_then_text(served) -> None:  # noqa: F811
    events = streamed(served, thinking=ENABLED)
    kinds = [
        e.content_block.type if e.type == "content_block_start" else e.delta.type
        for e in events
        if e.type in ("content_block_start", "content_block_delta")
    ]
    # One thinking block (its text, then its signature), then one text block.
    assert kinds[0] == "thinking" and kinds.index("text") == kinds.index("signature_delta") + 1
    assert set(kinds[1 : kinds.index("signature_delta")]) == {"thinking_delta"}
    assert set(kinds[kinds.index("text") + 1 :]) == {"text_delta"}
    stop = [e.index for e in events if e.type == "content_block_stop"]
    assert stop == [0, 1]
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert "".join(d.thinking for d in deltas if d.type == "thinking_delta") == THOUGHT
    sign = [d.signature for d in deltas if d.type == "signature_delta"]
    assert sign == [signature(THOUGHT)]


def test_the_sdk_stream_builds_the_same_message_as_the_whole_answer(served) -> None:  # noqa: F811
    session, _, claude = served
    session.script(SCRIPT)
    with claude.messages.stream(
        model=session.model.name, messages=ASK, max_tokens=200, thinking=ENABLED
    ) as stream:
        final = stream.get_final_message()
    whole = ask(served, thinking=ENABLED)
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_not_asked_the_reasoning_is_neither_shown_nor_text(served) -> None:  # noqa: F811
    assert [(b.type, b.text) for b in ask(served).content] == [("text", ANSWER)]
    events = streamed(served)
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["text"]
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == ANSWER


def test_display_omitted_keeps_the_block_without_its_text(served) -> None:  # noqa: F811
    omitted = {**ENABLED, "display": "omitted"}
    thinking, text = ask(served, thinking=omitted).content
    assert (thinking.thinking, thinking.signature) == ("", signature(THOUGHT))
    assert text.text == ANSWER
    kinds = [
        e.delta.type for e in streamed(served, thinking=omitted) if e.type == "content_block_delta"
    ]
    assert "thinking_delta" not in kinds and kinds.count("signature_delta") == 1


def test_disabled_thinking_is_turned_off_by_the_template(served) -> None:  # noqa: F811
    session, _, claude = served
    # Qwen3's template closes an empty block in the prompt when enable_thinking is false: what
    # the model writes is all answer, even text that looks like a tag.
    message = ask(served, "<think>x</think> hi", thinking={"type": "disabled"})
    assert [(b.type, b.text) for b in message.content] == [("text", "<think>x</think> hi")]

    def count(**options) -> int:
        return claude.messages.count_tokens(
            model=session.model.name, messages=ASK, **options
        ).input_tokens

    closed = count(thinking={"type": "disabled"})
    assert closed > count() == count(thinking=ENABLED)


def test_budget_tokens_is_the_engines_exact_budget(served) -> None:  # noqa: F811
    thinking, text = ask(served, LONG, thinking={"type": "enabled", "budget_tokens": 5}).content
    reasoning = chat(served, LONG, extra_body={"thinking_budget": 5}).choices[0].message
    assert thinking.thinking == reasoning.reasoning_content  # type: ignore[attr-defined]
    assert len(served[0].model.tokenizer.encode(thinking.thinking, add_special_tokens=False)) <= 5
    assert text.type == "text" and text.text


def test_cut_inside_the_reasoning_is_all_thinking(served) -> None:  # noqa: F811
    message = ask(served, LONG, thinking=ENABLED, max_tokens=12)
    assert message.stop_reason == "max_tokens"
    (block,) = message.content
    assert block.type == "thinking" and block.thinking.startswith("step step")
    events = streamed(served, LONG, thinking=ENABLED, max_tokens=12)
    assert [e.content_block.type for e in events if e.type == "content_block_start"] == ["thinking"]
    assert events[-2].delta.stop_reason == "max_tokens"


def test_an_enabled_thinking_needs_its_budget(served) -> None:  # noqa: F811
    with pytest.raises(anthropic.BadRequestError, match="budget_tokens"):
        ask(served, thinking={"type": "enabled"})


def test_earlier_thinking_goes_back_to_the_template(served) -> None:  # noqa: F811
    session, _, claude = served
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}
    tools = [{"name": "get_weather", "input_schema": {"type": "object"}}]
    thought = {"type": "thinking", "thinking": "I should look it up.", "signature": "x"}

    def count(assistant: list[dict], tail: list[dict]) -> int:
        messages = [*ASK, {"role": "assistant", "content": assistant}, *tail]
        counted = claude.messages.count_tokens(
            model=session.model.name, messages=messages, tools=tools
        )
        return counted.input_tokens

    # In a tool loop (after the last user message) Qwen3's template keeps the reasoning...
    result = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                            "content": "12 C"}]}]  # fmt: skip
    assert count([thought, call], result) > count([call], result)
    # ... and drops it from turns before the last user message.
    later = [{"role": "user", "content": "Thanks."}]
    text = {"type": "text", "text": "It is 12 C."}
    assert count([thought, text], later) == count([text], later)
