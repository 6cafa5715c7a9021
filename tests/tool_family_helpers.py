"""Tiny random models that carry the real chat templates of Qwen 2.5, Llama 3.1 and Mistral Nemo,
served by the real server, for the tool-calling tests in tests/test_tool_families_tiny.py.

The tiny byte-level tokenizer (tests/model_files.py) spells every template marker as bytes
(``<tool_call>``, ``<|start_header_id|>``, ``[TOOL_CALLS]``); its ``<|im_end|>`` is the models'
end-of-sequence token. What the tests check is the server's side: prompts rendered in each
family's syntax, forced calls, and answers parsed by each family's rules.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

from localinfer.server import ServerThread, create_app
from localinfer.session import Session, open_session
from localinfer.tools import (
    ToolChoice,
    ToolFamily,
    detect_family,
    parse_tools,
    prompt_inputs,
    template_messages,
)
from tests.model_files import TINY_VOCAB_SIZE, write_hf_dir
from tests.test_server_support import client_for
from tests.tiny import tiny_config, tiny_weights

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"

# Llama 3.1 writes every tool's schema, indented, into the first user turn: ~1,500 prompt tokens
# for two tools with this byte-level tokenizer, ~1,900 with a tool history. Room for that plus
# a forced call's whole budget (CALL_BUDGET in the tests).
CTX = 3072


@dataclass(frozen=True)
class TemplateFamily:
    key: str  # the test id
    arch: str  # the tiny model's architecture
    template: str  # tests/fixtures/templates/<template>.jinja
    family: ToolFamily

    def template_source(self) -> str:
        return (TEMPLATES / f"{self.template}.jinja").read_text()


FAMILIES = (
    TemplateFamily("qwen2.5", "qwen2", "Qwen-Qwen2.5-7B-Instruct", ToolFamily.HERMES),
    TemplateFamily("llama3.1", "llama", "meta-llama-Llama-3.1-8B-Instruct", ToolFamily.LLAMA3),
    TemplateFamily(
        "mistral-nemo", "mistral", "mistralai-Mistral-Nemo-Instruct-2407", ToolFamily.MISTRAL
    ),
)

# Ids of the calls a server makes: OpenAI's shape, or Mistral's 9 alphanumerics (its templates
# raise on anything else when the call comes back in the history).
CALL_IDS = {
    ToolFamily.HERMES: re.compile(r"call_[0-9a-f]{24}"),
    ToolFamily.LLAMA3: re.compile(r"call_[0-9a-f]{24}"),
    ToolFamily.MISTRAL: re.compile(r"[A-Za-z0-9]{9}"),
}


def write_family_model(root: Path, spec: TemplateFamily, max_ctx: int = CTX) -> Path:
    """A Hugging Face directory: a tiny random ``spec.arch`` model (trained context
    ``max_ctx``), the tiny tokenizer and ``spec``'s real chat template."""
    config = tiny_config(spec.arch, vocab_size=TINY_VOCAB_SIZE, max_ctx=max_ctx)
    weights = tiny_weights(config)
    tensors = {name: weights.get(name) for name in weights.names()}
    return write_hf_dir(root, config, tensors, chat_template=spec.template_source())


@dataclass
class FamilyServer:
    spec: TemplateFamily
    session: Session
    server: ServerThread
    client: openai.OpenAI

    @property
    def name(self) -> str:
        return self.session.model.name


@contextmanager
def served_family(root: Path, spec: TemplateFamily, ctx: int = CTX) -> Iterator[FamilyServer]:
    """``spec``'s tiny model opened as a session (one slot, one thread) behind a real server."""
    path = write_family_model(root / f"tiny-{spec.key}", spec, max_ctx=ctx)
    session = open_session(str(path), slots=1, ctx=ctx, threads=1)
    try:
        with ServerThread(create_app(session)) as server:  # type: ignore[arg-type]
            yield FamilyServer(spec, session, server, client_for(server))
    finally:
        session.close()


@dataclass(frozen=True)
class StreamedCall:
    id: str
    name: str
    arguments: str


@dataclass
class StreamedAnswer:
    content: str
    calls: list[StreamedCall] = field(default_factory=list)
    finish: str | None = None
    token_bytes: bytes = b""  # the answer's tokens, from the logprobs (when asked for)


def read_stream(chunks: Iterable[Any]) -> StreamedAnswer:
    """A streamed chat answer put together, checking OpenAI's tool-call delta order on the way:
    each call starts once (index in order, with its id, type and name, no argument text), and
    only then do its argument pieces come."""
    content: list[str] = []
    starts: dict[int, tuple[str, str]] = {}
    pieces: dict[int, list[str]] = {}
    token_bytes: list[bytes] = []
    finish = None
    for chunk in chunks:
        if not chunk.choices:  # the usage chunk
            continue
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        content.append(choice.delta.content or "")
        if choice.logprobs is not None and choice.logprobs.content:
            token_bytes.extend(bytes(t.bytes) for t in choice.logprobs.content)
        for delta in choice.delta.tool_calls or ():
            if delta.id is not None:
                assert delta.index == len(starts), "calls start once each, in order"
                assert delta.type == "function" and delta.function.name
                assert not delta.function.arguments, "the name comes before any argument text"
                starts[delta.index] = (delta.id, delta.function.name)
                pieces[delta.index] = []
            else:
                assert delta.index in starts, "argument pieces come after the call's start"
                pieces[delta.index].append(delta.function.arguments or "")
    calls = [StreamedCall(i, n, "".join(pieces[k])) for k, (i, n) in sorted(starts.items())]
    return StreamedAnswer("".join(content), calls, finish, b"".join(token_bytes))


def rendered_prompt(
    session: Session, history: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> tuple[list[int], str]:
    """The prompt ids of ``history`` with ``tools`` (tool_choice auto), rendered as the server
    renders it, and their text."""
    template = session.model.chat_template
    assert template is not None
    family = detect_family(template.source)
    inputs = prompt_inputs(
        family, template_messages(history, family), parse_tools(tools), ToolChoice("auto")
    )
    ids = session.chat_prompt_ids(inputs.messages, tools=inputs.tools)
    return ids, session.tokenizer.decode(ids)


def _json(value: Any) -> str:
    # As the templates' ``tojson`` writes it (json.dumps' separators, non-ASCII kept).
    return json.dumps(value, ensure_ascii=False)


def call_in_prompt(
    family: ToolFamily, call_id: str, name: str, arguments: Mapping[str, Any]
) -> str:
    """How ``family``'s template writes one call of an assistant turn."""
    if family == ToolFamily.HERMES:
        return f'<tool_call>\n{{"name": "{name}", "arguments": {_json(arguments)}}}\n</tool_call>'
    if family == ToolFamily.LLAMA3:
        return (
            "<|start_header_id|>assistant<|end_header_id|>\n\n"
            f'{{"name": "{name}", "parameters": {_json(arguments)}}}<|eot_id|>'
        )
    return f'{{"name": "{name}", "arguments": {_json(arguments)}, "id": "{call_id}"}}'


def result_in_prompt(family: ToolFamily, call_id: str, content: str) -> str:
    """How ``family``'s template writes a tool result."""
    if family == ToolFamily.HERMES:
        return f"<tool_response>\n{content}\n</tool_response>"
    if family == ToolFamily.LLAMA3:
        # Llama 3.1's template writes a result through ``tojson`` whenever it is iterable, and
        # in Jinja a string is: the result comes out quoted, as with Hugging Face's rendering.
        return f"<|start_header_id|>ipython<|end_header_id|>\n\n{_json(content)}<|eot_id|>"
    return f'[TOOL_RESULTS]{{"content": {content}, "call_id": "{call_id}"}}[/TOOL_RESULTS]'


def assert_in_order(text: str, parts: Iterable[str]) -> None:
    at = 0
    for part in parts:
        found = text.find(part, at)
        assert found >= 0, f"{part!r} not found after position {at} in:\n{text}"
        at = found + len(part)
