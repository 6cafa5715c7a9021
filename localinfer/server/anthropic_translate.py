"""Anthropic Messages requests -> OpenAI ChatCompletionRequests, so that ``plan_chat`` and
``sampling_params`` plan them like any chat request (no tool, stop or sampling logic here).

* ``system`` (a string or text blocks) -> a system message;
* a user turn's ``tool_result`` blocks -> ``tool`` messages, its text -> one user message after;
* a user turn's ``image`` blocks -> ``image_url`` parts of that message, in place among its text
  (a base64 source as a ``data:`` URL, a ``url`` source as its URL: image_parts.py decodes or
  fetches them);
* an assistant turn's ``tool_use`` blocks -> ``tool_calls`` (``input`` as JSON arguments);
* an assistant turn's ``thinking`` blocks -> its ``reasoning_content`` (the chat template keeps
  or drops earlier reasoning: Qwen3 keeps it only after the last user message);
* ``tools`` -> function tools; ``tool_choice`` any -> required, tool -> a named function,
  ``disable_parallel_tool_use`` -> ``parallel_tool_calls: false``;
* ``thinking`` disabled -> ``reasoning_effort: none`` (the template's switch, or a budget of 0),
  enabled -> ``thinking_budget: budget_tokens``; adaptive or absent -> the template's default.

What only Anthropic's shape can get wrong is refused here, naming the Anthropic field
(``messages[2].content[0].tool_use_id: ...``); errors raised later by planning name the OpenAI
message a turn became, so ``anthropic_fields`` renames them back through ``origins`` (and an
image part's through ``parts``: ``messages[0].content[1].source.data``).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from localinfer.errors import InvalidParameterError
from localinfer.server.anthropic_schemas import (
    AnthropicTool,
    AnthropicToolChoice,
    AssistantMessage,
    Base64Source,
    CountTokensRequest,
    DocumentBlock,
    ImageBlock,
    MediaBlock,
    MessagesRequest,
    TextBlock,
    ThinkingBlock,
    ThinkingConfig,
    ToolResultBlock,
    ToolUseBlock,
    URLSource,
    UserMessage,
)
from localinfer.server.errors import FIELD_PREFIX, APIError
from localinfer.server.schemas import ChatCompletionRequest

# Anthropic's default when a request leaves temperature out.
ANTHROPIC_DEFAULT_TEMPERATURE = 1.0
# What a failed tool's result says to the model: OpenAI's tool messages have no error flag.
ERROR_RESULT_PREFIX = "Error: "


@dataclass(slots=True, frozen=True)
class TranslatedChat:
    request: ChatCompletionRequest
    origins: list[str]  # per message of ``request``: the Anthropic field it came from
    # (message, part) of ``request`` -> the Anthropic field of the image it came from
    parts: dict[tuple[int, int], str] = dataclasses.field(default_factory=dict)


def _bad(field: str, message: str) -> InvalidParameterError:
    return InvalidParameterError(f"{field}: {message}")


def _refuse_media(where: str, block: MediaBlock, turn: str) -> InvalidParameterError:
    if isinstance(block, ImageBlock):
        return _bad(where, f"image blocks are not supported in {turn}; put it in a user turn")
    return _bad(where, "document blocks are not supported: this server reads no documents")


def _image_part(at: str, block: ImageBlock) -> tuple[dict[str, Any], str]:
    """The OpenAI ``image_url`` part of an image block, and the field that holds the image."""
    source = block.source
    if isinstance(source, Base64Source):
        url, where = f"data:{source.media_type};base64,{source.data}", f"{at}.source.data"
    elif isinstance(source, URLSource):
        url, where = source.url, f"{at}.source.url"
    else:
        raise _bad(
            f"{at}.source.type",
            f"{source.type[:80]!r} image sources are not supported (this server keeps no "
            "files); send the image as base64 (or a url source)",
        )
    return {"type": "image_url", "image_url": {"url": url}}, where


class _History:
    """The OpenAI messages being built, with the origin of each and the tool_use ids so far."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.origins: list[str] = []
        self.parts: dict[tuple[int, int], str] = {}  # TranslatedChat.parts
        self.call_ids: set[str] = set()

    def add(self, message: dict[str, Any], origin: str) -> None:
        self.messages.append(message)
        self.origins.append(origin)

    def user(self, i: int, message: UserMessage) -> None:
        where = f"messages[{i}]"
        if isinstance(message.content, str):
            self.add({"role": "user", "content": message.content}, where)
            return
        parts: list[dict[str, Any]] = []
        images: dict[int, str] = {}  # part index -> the image's field
        for j, block in enumerate(message.content):
            at = f"{where}.content[{j}]"
            if isinstance(block, TextBlock):
                parts.append({"type": "text", "text": block.text})
            elif isinstance(block, ToolResultBlock):
                self.add(self._tool_result(at, block), at)
            elif isinstance(block, ImageBlock):
                part, images[len(parts)] = _image_part(at, block)  # (its index, before append)
                parts.append(part)
            else:
                raise _refuse_media(at, block, "a user turn")
            # (tool_use and thinking blocks are an assistant's: the body's model refused them)
        if not images and (parts or not message.content):
            self.add({"role": "user", "content": "".join(p["text"] for p in parts)}, where)
        elif images:
            self.parts.update({(len(self.messages), k): name for k, name in images.items()})
            self.add({"role": "user", "content": parts}, where)

    def _tool_result(self, at: str, block: ToolResultBlock) -> dict[str, Any]:
        if block.tool_use_id not in self.call_ids:
            raise _bad(
                f"{at}.tool_use_id",
                f"no earlier tool_use block has the id {block.tool_use_id[:80]!r}",
            )
        content = block.content
        if isinstance(content, list):
            pieces = []
            for k, part in enumerate(content):
                if isinstance(part, ImageBlock | DocumentBlock):
                    raise _refuse_media(f"{at}.content[{k}]", part, "a tool_result")
                pieces.append(part.text)
            content = "".join(pieces)
        text = content or ""
        if block.is_error:
            text = ERROR_RESULT_PREFIX + text
        return {"role": "tool", "tool_call_id": block.tool_use_id, "content": text}

    def assistant(self, i: int, message: AssistantMessage) -> None:
        where = f"messages[{i}]"
        blocks = message.content
        if isinstance(blocks, str):
            self.add({"role": "assistant", "content": blocks}, where)
            return
        texts: list[str] = []
        thoughts: list[str] = []
        calls: list[dict[str, Any]] = []
        for j, block in enumerate(blocks):
            at = f"{where}.content[{j}]"
            if isinstance(block, TextBlock):
                texts.append(block.text)
            elif isinstance(block, ToolUseBlock):
                if block.id in self.call_ids:
                    raise _bad(f"{at}.id", f"another tool_use block has the id {block.id[:80]!r}")
                self.call_ids.add(block.id)
                arguments = json.dumps(block.input, ensure_ascii=False)
                function = {"name": block.name, "arguments": arguments}
                calls.append({"id": block.id, "type": "function", "function": function})
            elif isinstance(block, ImageBlock | DocumentBlock):
                raise _refuse_media(at, block, "an assistant turn")
            else:
                assert isinstance(block, ThinkingBlock)
                thoughts.append(block.thinking)  # a redacted block's text is ""
        turn: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
        if any(thoughts):
            turn["reasoning_content"] = "\n\n".join(t for t in thoughts if t)
        if calls:
            turn["tool_calls"] = calls
        self.add(turn, where)


def _system_text(system: str | list[TextBlock] | None) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    return "".join(block.text for block in system)


def _tools(tools: list[AnthropicTool] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.type not in (None, "custom"):
            raise _bad(
                f"tools[{i}].type",
                f"{tool.type[:80]!r} is a server tool, which this server does not run; "
                "only client tools (name, description, input_schema) are supported",
            )
        if tool.input_schema is None:
            raise _bad(f"tools[{i}].input_schema", "a client tool needs its input's JSON schema")
        function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
        if tool.description is not None:
            function["description"] = tool.description
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(
    choice: AnthropicToolChoice | None, tools: Sequence[AnthropicTool] | None
) -> str | dict[str, Any] | None:
    if choice is None or choice.type == "auto":
        return None if choice is None else "auto"
    if choice.type == "none":
        return "none"
    if choice.type == "any":
        if not tools:
            raise _bad("tool_choice", "type 'any' needs at least one tool in tools")
        return "required"
    if not choice.name:
        raise _bad("tool_choice.name", "type 'tool' needs the name of the tool to call")
    return {"type": "function", "function": {"name": choice.name}}


def _thinking_fields(thinking: ThinkingConfig | None) -> dict[str, Any]:
    """The chat request's fields for Anthropic's ``thinking`` (see the module doc)."""
    if thinking is None or thinking.type == "adaptive":
        return {}
    if thinking.type == "disabled":
        return {"reasoning_effort": "none"}
    return {"thinking_budget": thinking.budget_tokens}


def chat_request(body: CountTokensRequest) -> TranslatedChat:
    """``body`` as a chat completion request (a MessagesRequest brings its sampling fields)."""
    history = _History()
    system = _system_text(body.system)
    if system:
        history.add({"role": "system", "content": system}, "system")
    for i, message in enumerate(body.messages):
        if isinstance(message, UserMessage):
            history.user(i, message)
        else:
            history.assistant(i, message)
    if body.messages[-1].role == "assistant":
        last = len(body.messages) - 1
        raise _bad(
            f"messages[{last}].role",
            "the last message must be a user message (continuing an assistant prefill is not "
            "supported)",
        )
    choice = body.tool_choice
    fields: dict[str, Any] = {
        "model": body.model,
        "messages": history.messages,
        "tools": _tools(body.tools),
        "tool_choice": _tool_choice(choice, body.tools),
        "parallel_tool_calls": not (choice is not None and choice.disable_parallel_tool_use),
        **_thinking_fields(body.thinking),
    }
    if isinstance(body, MessagesRequest):
        temperature = body.temperature
        fields.update(
            max_tokens=body.max_tokens,
            temperature=ANTHROPIC_DEFAULT_TEMPERATURE if temperature is None else temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            stop=body.stop_sequences,
            stream=body.stream,
        )
    try:
        request = ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:  # a bound the OpenAI body has and ours lacks: still a 400
        err = exc.errors()[0]
        field = ".".join(str(part) for part in err.get("loc", ())) or "body"
        raise _bad(field, err.get("msg", "invalid value")) from None
    return TranslatedChat(request, history.origins, history.parts)


# Field names as planning writes them -> as the Anthropic request has them.
_TOOL_FIELD = re.compile(r"^tools\[(\d+)\]\.function\.(name|parameters|description)")
_TOOL_NAMES = {"name": "name", "parameters": "input_schema", "description": "description"}
_MESSAGE_FIELD = re.compile(r"^messages\[(\d+)\][\w.\[\]-]*")
_PART_FIELD = re.compile(r"^messages\[(\d+)\]\.content\[(\d+)\]")


def anthropic_field(
    field: str, origins: Sequence[str], parts: Mapping[tuple[int, int], str] | None = None
) -> str:
    """An OpenAI request field (``messages[3].tool_calls[0].function.arguments``) as the field
    of the Anthropic request it came from (``messages[2].content[1]``); an image part's
    (``messages[0].content[1].image_url.url``) as its block's (``...content[1].source.data``)."""
    if field == "stop":
        return "stop_sequences"
    if field == "thinking_budget":
        return "thinking.budget_tokens"
    tool = _TOOL_FIELD.match(field)
    if tool:
        return f"tools[{tool.group(1)}].{_TOOL_NAMES[tool.group(2)]}" + field[tool.end() :]
    part = _PART_FIELD.match(field)
    if part and parts and (int(part[1]), int(part[2])) in parts:
        return parts[int(part[1]), int(part[2])]
    message = _MESSAGE_FIELD.match(field)
    if message and int(message.group(1)) < len(origins):
        return origins[int(message.group(1))]
    return field


@contextmanager
def anthropic_fields(
    origins: Sequence[str], parts: Mapping[tuple[int, int], str] | None = None
) -> Iterator[None]:
    """Planning's 400s re-raised with the field they name renamed for the Anthropic request."""
    try:
        yield
    except (InvalidParameterError, APIError) as exc:
        message = exc.message if isinstance(exc, APIError) else str(exc)
        named = FIELD_PREFIX.match(message)
        if not named:
            raise
        field = anthropic_field(named.group(1), origins, parts)
        renamed = f"{field}: {message[named.end() :]}"
        if isinstance(exc, APIError):
            raise APIError(
                exc.status, renamed, code=exc.code, param=field, headers=exc.headers
            ) from None
        raise InvalidParameterError(renamed) from None
