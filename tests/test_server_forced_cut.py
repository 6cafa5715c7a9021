"""A forced tool call cut short by max_tokens, through the real server and the official clients,
on a model scripted to write the call (tests/test_server_scripted.py's session, here with the
engine's real constraint): the half-written JSON never comes back as content. The call being
written comes back with the arguments so far and finish ``length``, as OpenAI and vLLM return
it (Anthropic: a ``tool_use`` block, input ``{}``, stop_reason ``max_tokens``; Responses: an
incomplete ``function_call`` item); cut before its name is whole, there is no call at all."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import openai
import pytest

from localinfer.constraints import ConstraintCompiler, ConstraintSpec, vocabulary_from_tokenizer
from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.loader import load_model
from localinfer.server import ServerThread, create_app
from tests.test_server_scripted import ScriptedSession
from tests.test_server_support import client_for
from tests.test_server_tools import ASK, TOOLS

CALL = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
FLAT_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
CLAUDE_TOOLS = [
    {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS
]


class ConstrainedSession(ScriptedSession):
    """The scripted session with the engine's real constraint: the script is the call."""

    def __init__(self, model) -> None:
        super().__init__(model)
        self._compiler = ConstraintCompiler(vocabulary_from_tokenizer(model.tokenizer))

    def compile_constraint(self, spec: ConstraintSpec) -> object:
        return self._compiler.compile(spec)

    def tokens_until(self, text: str) -> int:
        """The script's tokens up to the end of ``text`` in it."""
        script = self.model.tokenizer.decode(self.runner.script)
        ids = self.model.tokenizer.encode(script[: script.index(text) + len(text)])
        return len(ids)


Served = tuple[ConstrainedSession, openai.OpenAI, anthropic.Anthropic, ServerThread]


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    session = ConstrainedSession(load_model(embedded_model_path()))
    session.script(json.dumps(CALL))
    with ServerThread(create_app(session)) as server:  # type: ignore[arg-type]
        claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        yield session, client_for(server), claude, server
    session.close()


def chat(served: Served, max_tokens: int, **options):
    session, client, _, _ = served
    return client.chat.completions.create(
        model=session.model.name,
        messages=ASK,
        tools=TOOLS,
        tool_choice=NAMED,
        max_tokens=max_tokens,
        temperature=0,
        **options,
    )


def test_the_whole_call_fits(served: Served) -> None:
    choice = chat(served, 100).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert json.loads(call.function.arguments) == CALL["arguments"]


def test_a_cut_call_keeps_its_name_and_the_arguments_so_far(served: Served) -> None:
    cut = served[0].tokens_until('"Par')
    choice = chat(served, cut).choices[0]
    assert choice.finish_reason == "length" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert call.function.arguments.startswith('{"city": "Par')
    streamed = list(chat(served, cut, stream=True))
    assert not any(c.choices[0].delta.content for c in streamed if c.choices)
    deltas = [d for c in streamed for d in c.choices[0].delta.tool_calls or ()]
    assert deltas[0].function.name == "get_weather"
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
    assert streamed[-1].choices[0].finish_reason == "length"


def test_cut_before_the_name_is_whole_there_is_no_call_and_no_content(served: Served) -> None:
    cut = served[0].tokens_until('"get_')
    choice = chat(served, cut).choices[0]
    assert choice.finish_reason == "length"
    assert not choice.message.tool_calls and not choice.message.content


def test_anthropic_and_responses_say_the_call_was_cut(served: Served) -> None:
    session, client, claude, _ = served
    cut = session.tokens_until('"Par')
    message = claude.messages.create(
        model=session.model.name,
        messages=ASK,
        tools=CLAUDE_TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
        max_tokens=cut,
    )
    assert message.stop_reason == "max_tokens"
    assert [(b.type, b.name, b.input) for b in message.content] == [("tool_use", "get_weather", {})]
    reply = client.responses.create(
        model=session.model.name,
        input=ASK[0]["content"],
        tools=FLAT_TOOLS,
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=cut,
    )
    assert reply.status == "incomplete"
    (item,) = reply.output
    assert (item.type, item.name, item.status) == ("function_call", "get_weather", "incomplete")
    assert item.arguments.startswith('{"city": "Par')
