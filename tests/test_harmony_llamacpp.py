"""gpt-oss on the llama.cpp runner: the tiny gpt-oss GGUF (tests/harmony_model.py: MXFP4
experts, attention sinks, o200k_harmony's special tokens, the real chat template) opened by
localinfer and served through the real server with the official ``openai`` and ``anthropic``
clients. Its greedy decode opens the analysis channel and reasons until a budget closes it (the
thinker) or calls ``lookup`` on the commentary channel (the caller): the budget is exact, a JSON
schema or a forced call after the analysis validates, and the call is read from commentary."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import jsonschema
import openai
import pytest

from localinfer.errors import ModelFileError, UnsupportedModelError
from localinfer.loading.loader import load_model
from localinfer.server import ServerThread, create_app
from localinfer.session import open_session
from tests.harmony_model import CTX, HARMONY_CALLER, HARMONY_THINKER, write_harmony_gguf
from tests.test_server_support import client_for

pytest.importorskip("llama_cpp")

ASK = [{"role": "user", "content": "hi"}]
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "mood": {"enum": ["good", "bad"]}},
    "required": ["ok", "mood"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": SCHEMA}}]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("gpt-oss")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LOCALINFER_CACHE_DIR", str(path / "cache"))
        yield path


def serve(path: Path) -> Iterator[tuple[str, openai.OpenAI, anthropic.Anthropic]]:
    with open_session(str(path), slots=1, ctx=1024, threads=1) as session:
        assert session.backend == "llamacpp"
        with ServerThread(create_app(session)) as server:
            claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
            yield session.model.name, client_for(server), claude


@pytest.fixture(scope="module")
def thinker(root: Path) -> Iterator[tuple[str, openai.OpenAI, anthropic.Anthropic]]:
    yield from serve(write_harmony_gguf(root / "gpt-oss-thinker.gguf", HARMONY_THINKER))


@pytest.fixture(scope="module")
def caller(root: Path) -> Iterator[tuple[str, openai.OpenAI, anthropic.Anthropic]]:
    yield from serve(write_harmony_gguf(root / "gpt-oss-caller.gguf", HARMONY_CALLER))


def chat(served, **options):
    name, client, _ = served
    options.setdefault("max_tokens", 40)
    return client.chat.completions.create(model=name, messages=ASK, temperature=0, **options)


def streamed(served, **options) -> tuple[str, str, list[tuple[str, str]], str | None]:
    reasoning, content, calls, finish = [], [], {}, None
    for chunk in chat(served, stream=True, **options):
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        reasoning.append(getattr(choice.delta, "reasoning_content", None) or "")
        content.append(choice.delta.content or "")
        for d in choice.delta.tool_calls or ():
            if d.id is not None:
                calls[d.index] = [d.function.name, ""]
            else:
                calls[d.index][1] += d.function.arguments or ""
    return "".join(reasoning), "".join(content), [tuple(c) for c in calls.values()], finish


def the(n: int) -> str:
    return " ".join(["the"] * n)


def test_localinfer_reads_a_gpt_oss_gguf(root: Path) -> None:
    model = load_model(write_harmony_gguf(root / "read.gguf"))
    tok = model.tokenizer
    assert model.config.arch == "gpt_oss" and model.file_quant == "MXFP4_MOE"
    assert model.config.sliding_layers == (0,)  # every other layer slides, as llama.cpp reads
    assert model.config.max_ctx == CTX  # llama.cpp applies YaRN: no cap at the original window
    ends = {tok.id_to_token(i) for i in model.config.eos_token_ids}
    assert ends == {"<|return|>", "<|call|>", "<|endoftext|>"}  # <|end|> ends a message only
    ids = tok.encode("a to=functions.lookup", add_special_tokens=False)
    assert [tok.id_to_token(i) for i in ids] == ["a", "Ġto", "=functions", ".lookup"]  # o200k
    with pytest.raises(UnsupportedModelError, match="torch backend runs"):
        open_session(str(root / "read.gguf"), backend="torch", slots=1, ctx=256, threads=1)


def test_a_malformed_gpt_oss_gguf_is_refused_before_llama_cpp(root: Path) -> None:
    path = write_harmony_gguf(root / "bad.gguf", drop="blk.1.ffn_down_exps.weight")
    with pytest.raises(ModelFileError, match="blk.1.ffn_down_exps.weight"):
        load_model(path)


@pytest.mark.parametrize("budget", [0, 1, 6])
def test_the_thinking_budget_is_exact(thinker, budget: int) -> None:
    response = chat(thinker, extra_body={"thinking_budget": budget})
    message = response.choices[0].message
    thought = getattr(message, "reasoning_content", None) or ""
    assert thought == the(budget)
    # Then the forced end of the analysis and final header, and the answer the chain writes.
    assert message.content.startswith("the the") and "<|" not in message.content
    # The forced end's first token is counted with the reasoning, as </think>'s is.
    assert response.usage.completion_tokens_details.reasoning_tokens == budget + 1
    assert streamed(thinker, extra_body={"thinking_budget": budget})[:2] == (
        thought,
        message.content,
    )


def test_no_end_before_max_tokens_is_all_reasoning(thinker) -> None:
    choice = chat(thinker, max_tokens=12).choices[0]
    assert choice.finish_reason == "length" and not choice.message.content
    assert choice.message.reasoning_content == the(9)  # 12 tokens less the analysis header


def test_effort_none_closes_the_analysis_at_once(thinker) -> None:
    message = chat(thinker, reasoning_effort="none").choices[0].message
    assert getattr(message, "reasoning_content", None) is None
    assert message.content.startswith("the the")


def test_a_json_schema_after_the_analysis_validates(thinker) -> None:
    # Strict: compact JSON (a loose schema allows whitespace runs this random model fills).
    schema = {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA, "strict": True}}
    options = {"response_format": schema, "extra_body": {"thinking_budget": 4}, "max_tokens": 80}
    choice = chat(thinker, **options).choices[0]
    assert choice.message.reasoning_content == the(4) and choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    assert streamed(thinker, **options)[:2] == (the(4), choice.message.content)


def test_a_forced_call_after_the_analysis_validates(thinker) -> None:
    choice = chat(
        thinker,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "lookup"}},
        extra_body={"thinking_budget": 3},
        max_tokens=80,
    ).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.reasoning_content == the(3)
    (call,) = choice.message.tool_calls
    assert call.function.name == "lookup"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMA)


def test_anthropic_thinking_budget(thinker) -> None:
    name, _, claude = thinker
    thinking = {"type": "enabled", "budget_tokens": 3}
    with claude.messages.stream(
        model=name, messages=ASK, max_tokens=20, thinking=thinking
    ) as stream:
        message = stream.get_final_message()
    assert message.content[0].type == "thinking" and message.content[0].thinking == the(3)
    assert message.content[1].type == "text" and message.content[1].text.startswith("the")


def test_a_call_on_the_commentary_channel(caller) -> None:
    choice = chat(caller, tools=TOOLS).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [
        ("lookup", "{}")
    ]
    assert streamed(caller, tools=TOOLS)[2:] == ([("lookup", "{}")], "tool_calls")
    name, _, claude = caller
    tools = [{"name": "lookup", "input_schema": SCHEMA}]
    used = claude.messages.create(model=name, messages=ASK, max_tokens=40, tools=tools)
    assert used.stop_reason == "tool_use"
    assert [(b.type, b.name, b.input) for b in used.content] == [("tool_use", "lookup", {})]
