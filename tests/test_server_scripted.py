"""``tool_choice: auto`` through the real server, on answers the model is scripted to write.

The session is the embedded model's tokenizer and chat template over a ScriptRunner whose greedy
output is exactly the scripted text, so every parsing rule — a call, prose then a call, two calls,
JSON-looking prose, a malformed call, ``tool_choice: none`` — is checked end to end through HTTP,
streamed and whole, with the official ``openai`` client.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from localinfer.constraints import ConstraintSpec
from localinfer.engine import Engine
from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.loader import load_model
from localinfer.loading.model import LoadedModel
from localinfer.server import ServerThread, create_app
from localinfer.session import Session
from tests.test_engine_model import ScriptRunner
from tests.test_server_support import client_for
from tests.test_server_tools import TOOLS

CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
    "\n</tool_call>"
)


class ScriptedSession:
    """What the server needs from a session, with a model that writes ``script``."""

    chat_prompt_ids = Session.chat_prompt_ids
    render_chat = Session.render_chat
    raw_prompt_ids = Session.raw_prompt_ids
    base_model = False

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        tok = model.tokenizer
        eos = next(iter(tok.eos_ids))
        self.runner = ScriptRunner([], end=eos, vocab_size=tok.vocab_size, slots=1, max_ctx=4096)
        self.engine = Engine(self.runner, tok, prefill_chunk=4096)

    def script(self, text: str) -> None:
        self.runner.script = self.model.tokenizer.encode(text, add_special_tokens=False)

    def compile_constraint(self, spec: ConstraintSpec) -> object:
        raise AssertionError("auto tool choice needs no constraint")

    def close(self) -> None:
        self.engine.close()


@pytest.fixture(scope="module")
def scripted() -> Iterator[tuple[ScriptedSession, openai.OpenAI]]:
    session = ScriptedSession(load_model(embedded_model_path()))
    with ServerThread(create_app(session)) as server:  # type: ignore[arg-type]
        yield session, client_for(server)
    session.close()


def ask(scripted: tuple[ScriptedSession, openai.OpenAI], text: str, **options: object):
    session, client = scripted
    session.script(text)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    return client.chat.completions.create(
        model=session.model.name,
        messages=messages,
        tools=TOOLS,
        max_tokens=200,
        temperature=0,
        **options,
    )


def streamed(scripted: tuple[ScriptedSession, openai.OpenAI], text: str, **options: object):
    """(content, {index: (id, name, arguments)}, finish_reason) from a streamed answer."""
    content, calls, finish = [], {}, None
    for chunk in ask(scripted, text, stream=True, **options):
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        content.append(choice.delta.content or "")
        for d in choice.delta.tool_calls or ():
            if d.id is not None:
                assert d.index not in calls, "one start per call"
                calls[d.index] = [d.id, d.function.name, ""]
            else:
                calls[d.index][2] += d.function.arguments or ""
    return "".join(content), calls, finish


def test_a_call_becomes_tool_calls(scripted) -> None:
    choice = ask(scripted, CALL).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}
    content, calls, finish = streamed(scripted, CALL)
    assert finish == "tool_calls" and content == ""
    assert [(c[1], json.loads(c[2])) for c in calls.values()] == [
        ("get_weather", {"city": "Paris", "unit": "celsius"})
    ]


def test_prose_then_two_calls(scripted) -> None:
    second = CALL.replace("get_weather", "get_time").replace(
        '{"city": "Paris", "unit": "celsius"}', '{"zone": "Europe/Paris"}'
    )
    text = "Let me look that up.\n" + CALL + "\n" + second
    choice = ask(scripted, text).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content.strip() == "Let me look that up."
    assert [c.function.name for c in choice.message.tool_calls] == ["get_weather", "get_time"]
    content, calls, finish = streamed(scripted, text)
    assert content.strip() == "Let me look that up." and finish == "tool_calls"
    assert sorted(calls) == [0, 1] and calls[1][1] == "get_time"
    assert json.loads(calls[1][2]) == {"zone": "Europe/Paris"}


@pytest.mark.parametrize(
    "text",
    [
        'A call looks like {"name": "get_weather", "arguments": {"city": "Paris"}} in JSON.',
        '{"name": "get_weather", "arguments": {"city": "Paris"}}',  # bare JSON, no tags
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>',  # bad JSON
        '<tool_call>\n{"name": "launch_rocket", "arguments": {}}\n</tool_call>',  # unknown tool
    ],
)
def test_json_looking_prose_and_malformed_calls_stay_content(scripted, text: str) -> None:
    choice = ask(scripted, text).choices[0]
    assert choice.finish_reason == "stop"
    assert not choice.message.tool_calls
    assert choice.message.content == text
    content, calls, finish = streamed(scripted, text)
    assert (content, calls, finish) == (text, {}, "stop")


def test_tool_choice_none_never_parses_calls(scripted) -> None:
    choice = ask(scripted, CALL, tool_choice="none").choices[0]
    assert choice.finish_reason == "stop" and choice.message.content == CALL
