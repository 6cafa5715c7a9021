"""A thinking model through the real server with the official ``openai`` and ``anthropic``
clients: Qwen3's real chat template over a model scripted to write ``<think>...</think>`` then
an answer (its tags split over several tokens of the embedded tokenizer). The reasoning comes
back as ``reasoning_content`` (whole and streamed) and never inside the content; thinking turns
off by ``reasoning_effort`` or ``chat_template_kwargs``; a budget cuts it exactly; Anthropic's
text blocks carry the answer alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from localinfer.loading.chat_template import ChatTemplate
from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.loader import load_model
from localinfer.server import ServerThread, create_app
from tests.test_server_scripted import ScriptedSession
from tests.test_server_support import client_for

QWEN3 = Path(__file__).parent / "fixtures" / "templates" / "Qwen-Qwen3-0.6B.jinja"
THOUGHT = "The user asks 2+2.\nThat is 4."
ANSWER = "The answer is 4."
SCRIPT = f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}"
ASK = [{"role": "user", "content": "What is 2+2?"}]


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[ScriptedSession, openai.OpenAI, anthropic.Anthropic]]:
    model = load_model(embedded_model_path())
    model.chat_template = ChatTemplate(QWEN3.read_text(), eos_token="<|im_end|>")
    session = ScriptedSession(model)
    with ServerThread(create_app(session)) as server:  # type: ignore[arg-type]
        claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        yield session, client_for(server), claude
    session.close()


def chat(served, script: str = SCRIPT, **options):
    session, client, _ = served
    session.script(script)
    return client.chat.completions.create(
        model=session.model.name, messages=ASK, max_tokens=200, temperature=0, **options
    )


def test_reasoning_comes_apart_from_the_answer(served) -> None:
    response = chat(served)
    message = response.choices[0].message
    assert message.content == ANSWER
    assert message.reasoning_content == THOUGHT  # type: ignore[attr-defined]
    details = response.usage.completion_tokens_details
    assert 0 < details.reasoning_tokens < response.usage.completion_tokens


def test_streamed_reasoning_then_content(served) -> None:
    reasoning, content, order = [], [], []
    for chunk in chat(served, stream=True):
        delta = chunk.choices[0].delta
        piece = getattr(delta, "reasoning_content", None)
        if piece:
            reasoning.append(piece)
            order.append("r")
        if delta.content:
            content.append(delta.content)
            order.append("c")
    assert "".join(reasoning) == THOUGHT and "".join(content) == ANSWER
    assert order == sorted(order, reverse=True)  # every reasoning piece before the content


@pytest.mark.parametrize(
    "options",
    [
        {"reasoning_effort": "none"},
        {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
    ],
)
def test_thinking_off_leaves_the_answer_whole(served, options) -> None:
    # The template closed the block in the prompt: what the model writes is all answer.
    message = chat(served, ANSWER, **options).choices[0].message
    assert message.content == ANSWER
    assert getattr(message, "reasoning_content", None) is None


def test_a_thinking_budget_closes_the_reasoning(served) -> None:
    long_thought = "<think>\n" + "step " * 80 + "</think>\n\nDone."
    response = chat(served, long_thought, extra_body={"thinking_budget": 5})
    message = response.choices[0].message
    assert len(served[0].model.tokenizer.encode(message.reasoning_content)) <= 5  # type: ignore[attr-defined]
    assert message.content  # the answer follows the forced closing tag


def test_the_template_kwargs_may_not_replace_the_messages(served) -> None:
    with pytest.raises(openai.BadRequestError, match="chat_template_kwargs"):
        chat(served, extra_body={"chat_template_kwargs": {"messages": []}})


def test_anthropic_text_blocks_hold_the_answer_alone(served) -> None:
    session, _, claude = served
    session.script(SCRIPT)
    message = claude.messages.create(model=session.model.name, messages=ASK, max_tokens=200)
    text = "".join(block.text for block in message.content if block.type == "text")
    assert text == ANSWER


def test_earlier_reasoning_content_goes_back_to_the_template(served) -> None:
    session, client, _ = served
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    turn = {"role": "assistant", "content": "", "tool_calls": [call]}
    result = {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]

    def prompt_length(assistant: dict) -> int:
        session.script(ANSWER)
        messages = [*ASK, assistant, result]
        client.chat.completions.create(
            model=session.model.name, messages=messages, tools=tools, max_tokens=20
        )
        return session.runner.prompt_len[0]

    # Qwen3's template keeps the reasoning of a turn after the last user message (a tool loop).
    assert prompt_length({**turn, "reasoning_content": "Look it up."}) > prompt_length(turn)
