"""gpt-oss's harmony channels through the real server with the official ``openai`` and
``anthropic`` clients, whole and streamed: the tiny gpt-oss GGUF's vocabulary and real chat
template (tests/harmony_model.py) over a model scripted to write analysis, final and commentary
messages. The analysis is ``reasoning_content`` (Anthropic's thinking block, a Responses
reasoning item) and the final channel the content, the headers between neither; a call on the
commentary channel is a tool call, one written inside the analysis never is; a budget is exact;
reasoning_effort and earlier reasoning reach the template as it expects."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import openai
import pytest

from localinfer.loading.loader import load_model
from localinfer.server import ServerThread, create_app
from tests.harmony_model import write_harmony_gguf
from tests.test_server_scripted import ScriptedSession
from tests.test_server_support import client_for

THOUGHT = "The user asks 2+2. That is 4."
ANSWER = "The answer is 4."
ANALYSIS = "<|channel|>analysis<|message|>"
FINAL = "<|end|><|start|>assistant<|channel|>final<|message|>"
SCRIPT = f"{ANALYSIS}{THOUGHT}{FINAL}{ANSWER}"
CALL = (
    "<|end|><|start|>assistant<|channel|>commentary to=functions.lookup <|constrain|>json"
    '<|message|>{"q": "weather"}<|call|>'
)
ASK = [{"role": "user", "content": "What is 2+2?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a thing up.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]
ENABLED = {"type": "enabled", "budget_tokens": 1024}


@pytest.fixture(scope="module")
def served(
    tmp_path_factory,
) -> Iterator[tuple[ScriptedSession, openai.OpenAI, anthropic.Anthropic]]:
    root = tmp_path_factory.mktemp("harmony")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LOCALINFER_CACHE_DIR", str(root / "cache"))
        model = load_model(write_harmony_gguf(root / "tiny-gpt-oss.gguf"))
    session = ScriptedSession(model)
    session.prompts = []  # type: ignore[attr-defined]
    forward = session.runner.forward

    def recording(batch):  # the prompts the runner is fed, as text
        for work in batch:
            if work.start_pos == 0:
                session.prompts.append(model.tokenizer.decode(list(work.tokens)))  # type: ignore[attr-defined]
        return forward(batch)

    session.runner.forward = recording  # type: ignore[method-assign]
    with ServerThread(create_app(session)) as server:  # type: ignore[arg-type]
        claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        yield session, client_for(server), claude
    session.close()


def chat(served, script: str = SCRIPT, **options):
    session, client, _ = served
    session.script(script)
    options.setdefault("messages", ASK)
    return client.chat.completions.create(
        model=session.model.name, max_tokens=200, temperature=0, **options
    )


def streamed(served, script: str = SCRIPT, **options) -> tuple[str, str, list, str | None]:
    """(reasoning, content, [(id, name, arguments)], finish) from a streamed chat answer."""
    reasoning, content, calls, finish = [], [], {}, None
    for chunk in chat(served, script, stream=True, **options):
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        reasoning.append(getattr(choice.delta, "reasoning_content", None) or "")
        assert not (reasoning[-1] and content and "".join(content)), "reasoning after content"
        content.append(choice.delta.content or "")
        for d in choice.delta.tool_calls or ():
            if d.id is not None:
                calls[d.index] = [d.id, d.function.name, ""]
            else:
                calls[d.index][2] += d.function.arguments or ""
    return "".join(reasoning), "".join(content), [tuple(c) for c in calls.values()], finish


def test_analysis_is_reasoning_and_final_is_content(served) -> None:
    response = chat(served)
    message = response.choices[0].message
    assert (message.reasoning_content, message.content) == (THOUGHT, ANSWER)  # type: ignore[attr-defined]
    assert response.choices[0].finish_reason == "stop"
    details = response.usage.completion_tokens_details
    assert 0 < details.reasoning_tokens < response.usage.completion_tokens
    assert streamed(served)[:2] == (THOUGHT, ANSWER)


def test_a_call_on_the_commentary_channel_is_a_tool_call(served) -> None:
    script = f"{ANALYSIS}I should look it up.{CALL}"
    choice = chat(served, script, tools=TOOLS).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.reasoning_content == "I should look it up."  # type: ignore[attr-defined]
    (call,) = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("lookup", {"q": "weather"})
    reasoning, content, calls, finish = streamed(served, script, tools=TOOLS)
    assert (reasoning, content, finish) == ("I should look it up.", "", "tool_calls")
    assert [(c[1], json.loads(c[2])) for c in calls] == [("lookup", {"q": "weather"})]


def test_a_call_written_inside_the_analysis_is_never_made(served) -> None:
    inner = CALL.removeprefix("<|end|><|start|>assistant").removesuffix("<|call|>")
    script = f"{ANALYSIS}Maybe {inner}? No.{FINAL}{ANSWER}"
    choice = chat(served, script, tools=TOOLS).choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert choice.message.content == ANSWER
    assert "to=functions.lookup" in choice.message.reasoning_content  # type: ignore[attr-defined]


@pytest.mark.parametrize("budget", [0, 1, 5])
def test_the_thinking_budget_is_exact(served, budget: int) -> None:
    script = ANALYSIS + " the" * 60 + FINAL + ANSWER
    message = chat(served, script, extra_body={"thinking_budget": budget}).choices[0].message
    # " the" is one token of this vocabulary: the reasoning holds exactly ``budget`` of them,
    # then the forced end and final header (neither part), then the script's next tokens.
    thought = getattr(message, "reasoning_content", None) or ""
    assert thought == " ".join(["the"] * budget)
    assert message.content.startswith("the the")
    reasoning, content, _, _ = streamed(served, script, extra_body={"thinking_budget": budget})
    assert (reasoning, content) == (thought, message.content)


def test_reasoning_effort_is_the_template_s_own(served) -> None:
    session = served[0]
    for effort, level in (("low", "low"), ("high", "high"), ("xhigh", "high")):
        message = chat(served, reasoning_effort=effort).choices[0].message
        assert message.reasoning_content == THOUGHT  # no budget cut it  # type: ignore[attr-defined]
        assert f"Reasoning: {level}\n" in session.prompts[-1]


def test_earlier_reasoning_goes_back_as_the_template_s_thinking(served) -> None:
    session = served[0]
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    turn = {"role": "assistant", "content": "", "reasoning_content": "Look it up.",
            "tool_calls": [call]}  # fmt: skip
    history = [*ASK, turn, {"role": "tool", "tool_call_id": "c1", "content": "4"}]
    chat(served, messages=history, tools=TOOLS)
    assert (
        "<|start|>assistant<|channel|>analysis<|message|>Look it up.<|end|>"
        "<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{}<|call|>"
        '<|start|>functions.lookup to=assistant<|channel|>commentary<|message|>"4"<|end|>'
    ) in session.prompts[-1]


def test_anthropic_thinking_block_text_and_tool_use(served) -> None:
    session, _, claude = served
    session.script(SCRIPT)
    message = claude.messages.create(
        model=session.model.name, messages=ASK, max_tokens=200, thinking=ENABLED
    )
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None))
            for b in message.content] == [("thinking", THOUGHT), ("text", ANSWER)]  # fmt: skip
    session.script(SCRIPT)
    with claude.messages.stream(
        model=session.model.name, messages=ASK, max_tokens=200, thinking=ENABLED
    ) as stream:
        final = stream.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in message.content]
    session.script(f"{ANALYSIS}Look.{CALL}")
    tools = [{"name": "lookup", "input_schema": TOOLS[0]["function"]["parameters"]}]
    used = claude.messages.create(
        model=session.model.name, messages=ASK, max_tokens=200, tools=tools, thinking=ENABLED
    )
    assert used.stop_reason == "tool_use"
    assert [(b.type, getattr(b, "input", None)) for b in used.content] == [
        ("thinking", None),
        ("tool_use", {"q": "weather"}),
    ]


def test_responses_reasoning_item_then_message(served) -> None:
    session, client, _ = served
    session.script(SCRIPT)
    reply = client.responses.create(model=session.model.name, input="What is 2+2?")
    reasoning, message = reply.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == THOUGHT
    assert message.type == "message" and reply.output_text == ANSWER
