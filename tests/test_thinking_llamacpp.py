"""The ``<think>`` formats on the llama.cpp runner: a tiny random GGUF per format with its model's
real chat template (tests/think_model.py: Qwen3, a DeepSeek-R1 distill whose template opens the
block in the prompt, SmolLM3), served through the real server with the official ``openai`` and
``anthropic`` clients, streamed and whole (#36).

Each model's greedy decode thinks `` one two three four five six`` (writing ``<think>`` where
its template does not), closes with ``</think>`` and answers ``Hello!``. So: the reasoning comes
back apart from the answer and is counted in the usage; a thinking budget of N puts the closing
tag right after the N-th reasoning token; thinking turned off gives the answer alone; Anthropic's
thinking blocks and text blocks hold each part; a JSON schema is applied only once the reasoning
is over, and what follows validates.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import jsonschema
import openai
import pytest

from localinfer.loading.loader import load_model
from localinfer.server import ServerThread, create_app
from localinfer.session import Session, open_session
from localinfer.tools.thinking import Thinking, detect_thinking, thinking_prompt
from tests.test_server_support import client_for
from tests.think_model import ANSWER, FORMATS, STEPS, THOUGHT, ThinkFormat, write_think_gguf

pytest.importorskip("llama_cpp")

ASK = [{"role": "user", "content": "hi"}]
SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "mood": {"enum": ["good", "bad"]},
        "count": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["ok", "mood", "count"],
    "additionalProperties": False,
}
# Strict: compact JSON (a loose schema allows whitespace runs that a random model fills).
JSON_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "r", "schema": SCHEMA, "strict": True},
}
OFF = [
    {"reasoning_effort": "none"},
    {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
]


@dataclass
class Served:
    fmt: ThinkFormat
    session: Session
    client: openai.OpenAI
    claude: anthropic.Anthropic

    @property
    def name(self) -> str:
        return self.session.model.name


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("thinkers")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LOCALINFER_CACHE_DIR", str(path / "cache"))
        yield path


@pytest.fixture(scope="module", params=FORMATS, ids=[f.key for f in FORMATS])
def served(request: pytest.FixtureRequest, root: Path) -> Iterator[Served]:
    fmt: ThinkFormat = request.param
    path = write_think_gguf(root / f"tiny-{fmt.key}.gguf", fmt)
    # ctx: SmolLM3's thinking prompt is ~1,200 tokens of this vocabulary.
    with open_session(str(path), slots=1, ctx=2048, threads=1) as session:
        assert session.backend == "llamacpp"
        with ServerThread(create_app(session)) as server:
            claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
            yield Served(fmt, session, client_for(server), claude)


def chat(served: Served, **options: Any) -> Any:
    options.setdefault("max_tokens", 30)
    return served.client.chat.completions.create(
        model=served.name, messages=ASK, temperature=0, **options
    )


@dataclass
class Streamed:
    reasoning: str
    content: str
    order: str  # "r" for each reasoning piece, "c" for each content piece, in arrival order
    finish: str | None
    usage: Any


def streamed(served: Served, **options: Any) -> Streamed:
    reasoning, content, order, finish, usage = [], [], [], None, None
    chunks = chat(served, stream=True, stream_options={"include_usage": True}, **options)
    for chunk in chunks:
        usage = chunk.usage or usage
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        piece = getattr(choice.delta, "reasoning_content", None)
        if piece:
            reasoning.append(piece)
            order.append("r")
        if choice.delta.content:
            content.append(choice.delta.content)
            order.append("c")
    return Streamed("".join(reasoning), "".join(content), "".join(order), finish, usage)


def tokens(response: Any) -> list[str]:
    """The answer's tokens as the logprobs name them."""
    return [t.token for t in response.choices[0].logprobs.content]


def reasoning_tokens(usage: Any) -> int:
    return usage.completion_tokens_details.reasoning_tokens


def test_the_file_carries_its_thinking_format(served: Served) -> None:
    model = load_model(served.session.model.path)
    assert detect_thinking(model.chat_template.source) is not None
    tok = model.tokenizer
    for tag in ("<think>", "</think>"):
        assert [tok.id_to_token(i) for i in tok.encode(tag, add_special_tokens=False)] == [tag]
    # Whether the template opens the block in the generation prompt, read off the prompt.
    spec = thinking_prompt(served.session, ASK, Thinking()).reasoning
    assert spec is not None and spec.starts_inside is not served.fmt.opens


def test_reasoning_comes_apart_from_the_answer(served: Served) -> None:
    response = chat(served)
    choice = response.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.reasoning_content == THOUGHT
    assert choice.message.content == ANSWER
    # Every step and the closing tag; not <think>, the blank line, the answer nor the end.
    assert reasoning_tokens(response.usage) == len(STEPS) + 1
    assert response.usage.completion_tokens == len(STEPS) + 1 + served.fmt.opens + 4
    stream = streamed(served)
    assert (stream.reasoning, stream.content, stream.finish) == (THOUGHT, ANSWER, "stop")
    assert stream.order == "".join(sorted(stream.order, reverse=True))  # reasoning, then answer
    assert reasoning_tokens(stream.usage) == len(STEPS) + 1


@pytest.mark.parametrize("budget", [0, 1, 4])
def test_the_thinking_budget_is_exact(served: Served, budget: int) -> None:
    response = chat(served, logprobs=True, extra_body={"thinking_budget": budget})
    message = response.choices[0].message
    opener = ["<think>"] if served.fmt.opens else []
    # The closing tag is forced right after the budget's last reasoning token (after <think>
    # where the model opens the block; at once where the prompt opened it and the budget is 0).
    head = [*opener, *(s.replace("Ġ", " ") for s in STEPS[:budget]), "</think>", "\n\n"]
    assert tokens(response)[: len(head) + 2] == [*head, "Hello", "!"]
    thought = getattr(message, "reasoning_content", None) or ""  # budget 0: none at all
    assert thought == " ".join(THOUGHT.split()[:budget])
    assert message.content == ANSWER
    assert reasoning_tokens(response.usage) == budget + 1  # the forced tag's token counts
    stream = streamed(served, extra_body={"thinking_budget": budget})
    assert (stream.reasoning, stream.content) == (thought, ANSWER)
    assert reasoning_tokens(stream.usage) == budget + 1


@pytest.mark.parametrize("options", OFF, ids=["effort-none", "enable_thinking-false"])
def test_thinking_off_gives_the_answer_alone(served: Served, options: dict) -> None:
    # The template's switch closes the block in the prompt (SmolLM3's also says /no_think,
    # which its model's switch reads); what the model writes after it is all answer, as written:
    # R1's template leaves the blank line after </think> to the model.
    response = chat(served, logprobs=True, **options)
    message = response.choices[0].message
    assert "<think>" not in tokens(response) and "</think>" not in tokens(response)
    assert getattr(message, "reasoning_content", None) is None
    assert message.content.lstrip("\n") == ANSWER
    assert reasoning_tokens(response.usage) == 0
    stream = streamed(served, **options)
    assert (stream.reasoning, stream.content) == ("", message.content)


@pytest.mark.parametrize("budget", [None, 2])
def test_a_json_schema_after_the_reasoning_validates(served: Served, budget: int | None) -> None:
    options = {"response_format": JSON_FORMAT, "max_tokens": 60}
    if budget is not None:
        options["extra_body"] = {"thinking_budget": budget}
    thought = THOUGHT if budget is None else " ".join(THOUGHT.split()[:budget])
    choice = chat(served, **options).choices[0]
    # The reasoning is the model's own (no grammar holds <think> or the steps back); the
    # grammar starts after </think>, and the answer is the schema's.
    assert choice.finish_reason == "stop" and choice.message.reasoning_content == thought
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    stream = streamed(served, **options)
    assert (stream.reasoning, stream.content, stream.finish) == (
        thought,
        choice.message.content,
        "stop",
    )


def test_a_json_schema_with_thinking_off_validates(served: Served) -> None:
    choice = chat(served, response_format=JSON_FORMAT, max_tokens=60, **OFF[0]).choices[0]
    assert getattr(choice.message, "reasoning_content", None) is None
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def block_text(block: Any) -> tuple[str, str]:
    return block.type, block.thinking if block.type == "thinking" else block.text


def test_anthropic_thinking_blocks(served: Served) -> None:
    thinking = {"type": "enabled", "budget_tokens": 3}
    ask = {"model": served.name, "messages": ASK, "max_tokens": 30, "thinking": thinking}
    message = served.claude.messages.create(**ask)
    assert [block_text(b) for b in message.content] == [
        ("thinking", "one two three"),
        ("text", ANSWER),
    ]
    assert message.stop_reason == "end_turn"
    deltas = []
    with served.claude.messages.stream(**ask) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                deltas.append(event.delta.type)
        final = stream.get_final_message()
    assert [block_text(b) for b in final.content] == [
        ("thinking", "one two three"),
        ("text", ANSWER),
    ]
    # Every thinking delta (then its signature) before the first text delta.
    kinds = [d for d in deltas if d != "signature_delta"]
    assert kinds == sorted(kinds, reverse=True) and {"thinking_delta", "text_delta"} <= set(kinds)
    assert deltas.index("signature_delta") < deltas.index("text_delta")


def test_anthropic_thinking_disabled(served: Served) -> None:
    ask = {"model": served.name, "messages": ASK, "max_tokens": 30}
    message = served.claude.messages.create(**ask, thinking={"type": "disabled"})
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text.lstrip("\n") == ANSWER
    with served.claude.messages.stream(**ask, thinking={"type": "disabled"}) as stream:
        final = stream.get_final_message()
    assert [(b.type, b.text) for b in final.content] == [("text", message.content[0].text)]
