"""A Responses API request -> an OpenAI ChatCompletionRequest, planned like any chat request.

The Responses API is chat completions with other names: ``instructions`` is a system message,
``input`` items are messages, ``function_call`` items are an assistant's ``tool_calls`` and
``function_call_output`` items are tool messages, ``input_image`` parts are ``image_url`` parts
(image_parts.py decodes or fetches them); tools are flat (``{type, name, parameters}``),
``text.format`` is ``response_format`` and ``reasoning.effort`` is ``reasoning_effort``; a
``reasoning`` item's text is the ``reasoning_content`` of the assistant turn that follows it.
Translated, the request goes through ``plan_chat`` and ``sampling_params`` unchanged, so no
sampling, stop or tool logic is written twice.

A mistake the chat planning finds is named in chat terms (``messages[2].tool_calls[0].function.
arguments``); ``FieldNames`` maps it back to the field the client sent (``input[3].arguments``).

This server keeps no responses: ``store: true``, ``previous_response_id``, ``conversation``,
``background`` and stored prompts are 400s that say so. OpenAI's ``store`` defaults to true; an
absent ``store`` is taken as false here (clients that leave it out want an answer, not storage).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from localinfer.errors import LocalinferError
from localinfer.server.chat_plan import ChatPlan, ChatSource, plan_chat
from localinfer.server.errors import APIError, from_localinfer_error
from localinfer.server.responses_api_schemas import (
    IMAGE_PART,
    NO_STORAGE,
    TEXT_PARTS,
    BuiltInTool,
    ContentPart,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    MessagePart,
    OtherItem,
    ReasoningItem,
    ResponsesRequest,
    TextConfig,
)
from localinfer.server.schemas import ChatCompletionRequest
from localinfer.server.tool_schemas import FlatTool, choice_value


def bad(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", code="invalid_parameter", param=param)


@dataclass(slots=True)
class MessageSource:
    """Where one chat message came from: ``input[3]``, ``instructions`` or ``input`` (a string
    input); an assistant message also lists the ``function_call`` items merged into it."""

    path: str
    calls: list[str] = field(default_factory=list)
    content_key: str = "content"  # "output" for a function_call_output item


# A call's chat fields -> its Responses fields (``.function.arguments`` -> ``.arguments``).
_CALL_FIELDS = {".function.arguments": ".arguments", ".function.name": ".name", ".id": ".call_id"}
_MESSAGE = re.compile(r"^messages\[(\d+)\](.*)$")
_CALL = re.compile(r"^\.tool_calls\[(\d+)\](.*)$")
_IMAGE = re.compile(r"^\.content\[(\d+)\]\.image_url")
_TOOL = re.compile(r"^tools\[(\d+)\]\.function(.*)$")
_FORMAT = (("response_format.json_schema", "text.format"), ("response_format", "text.format"))


@dataclass(slots=True, frozen=True)
class FieldNames:
    """Maps the chat request's field names back to the Responses request's."""

    sources: Sequence[MessageSource]

    def responses_field(self, chat_field: str) -> str:
        tool = _TOOL.match(chat_field)
        if tool is not None:
            return f"tools[{tool[1]}]{tool[2]}"
        for chat, responses in _FORMAT:
            if chat_field == chat or chat_field.startswith(chat + "."):
                return responses + chat_field[len(chat) :]
        if chat_field == "messages":
            return "input"
        found = _MESSAGE.match(chat_field)
        if found is None or int(found[1]) >= len(self.sources):
            return chat_field
        source, rest = self.sources[int(found[1])], found[2]
        call = _CALL.match(rest)
        if call is not None:
            if int(call[1]) >= len(source.calls):
                return source.path
            return source.calls[int(call[1])] + _CALL_FIELDS.get(call[2], "")
        if rest == ".tool_call_id":
            return source.path + ".call_id"
        image = _IMAGE.match(rest)
        if image is not None:  # a message's parts are translated one for one
            return f"{source.path}.content[{image[1]}].image_url"
        if rest.startswith(".content") and source.path.startswith("input["):
            return f"{source.path}.{source.content_key}"
        return source.path

    def renamed(self, error: APIError | LocalinferError) -> APIError:
        """``error`` with its field (and the message's leading field) in Responses terms."""
        api = from_localinfer_error(error) if isinstance(error, LocalinferError) else error
        if api.param is None:
            return api
        param = self.responses_field(api.param)
        message = api.message
        if message.startswith(api.param):
            message = param + message[len(api.param) :]
        return APIError(api.status, message, code=api.code, param=param, headers=api.headers)


@dataclass(slots=True, frozen=True)
class TranslatedRequest:
    chat: ChatCompletionRequest
    names: FieldNames


def translate_request(body: ResponsesRequest) -> TranslatedRequest:
    """The chat request ``body`` amounts to; 400s name the Responses field at fault."""
    messages, sources = chat_history(body)
    fields = {
        "model": body.model,
        "messages": messages,
        "max_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "stream": body.stream,
        "tools": chat_tools(body.tools),
        "tool_choice": choice_value(body.tool_choice),
        "parallel_tool_calls": body.parallel_tool_calls,
        "response_format": chat_response_format(body.text),
        "reasoning_effort": body.reasoning.effort if body.reasoning is not None else None,
    }
    names = FieldNames(sources)
    try:
        chat = ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:  # a rule of the chat body this one's model lacks: still a 400
        err = exc.errors()[0]
        loc = err.get("loc", ())
        field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)[1:] or "input"
        raise names.renamed(bad(field, err.get("msg", "invalid value"))) from None
    return TranslatedRequest(chat, names)


def plan_responses(source: ChatSource, translated: TranslatedRequest) -> ChatPlan:
    """``plan_chat`` on the translated request, its errors named in Responses terms."""
    try:
        return plan_chat(source, translated.chat)
    except (APIError, LocalinferError) as exc:
        raise translated.names.renamed(exc) from None


def chat_history(body: ResponsesRequest) -> tuple[list[dict[str, Any]], list[MessageSource]]:
    """``instructions`` and ``input`` as chat messages, and where each came from."""
    history = _History()
    if body.instructions is not None:
        history.add({"role": "system", "content": body.instructions}, MessageSource("instructions"))
    if isinstance(body.input, str):
        history.add({"role": "user", "content": body.input}, MessageSource("input"))
    else:
        for i, item in enumerate(body.input):
            history.item(i, item)
    if not any(m["role"] != "system" for m in history.messages):
        raise bad("input", "the input holds no message to answer")
    return history.messages, history.sources


class _History:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.sources: list[MessageSource] = []
        self.reasoning: list[str] = []  # reasoning items' text, for the next assistant turn

    def add(self, message: dict[str, Any], source: MessageSource) -> None:
        if message["role"] == "assistant" and self.reasoning:
            message["reasoning_content"] = "\n\n".join(self.reasoning)
        if message["role"] != "system":
            self.reasoning = []  # reasoning before a user turn belongs to no answer: dropped
        self.messages.append(message)
        self.sources.append(source)

    def item(
        self,
        i: int,
        item: MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem | OtherItem,
    ) -> None:
        where = f"input[{i}]"
        if isinstance(item, MessageItem):
            content = _content(f"{where}.content", item.content)
            self.add({"role": item.role, "content": content}, MessageSource(where))
        elif isinstance(item, FunctionCallItem):
            self._call(where, item)
        elif isinstance(item, FunctionCallOutputItem):
            text = _text(f"{where}.output", item.output)
            message = {"role": "tool", "tool_call_id": item.call_id, "content": text}
            self.add(message, MessageSource(where, content_key="output"))
        elif isinstance(item, OtherItem):
            _other(where, item)
        else:
            # Its text joins the assistant turn it came before. A summary or encrypted content
            # (another model's) is none this model can read: dropped.
            self.reasoning += [part.text for part in item.content or () if part.text]

    def _call(self, where: str, item: FunctionCallItem) -> None:
        """A call joins the assistant turn it follows (text, then calls), or opens one."""
        last = self.messages[-1] if self.messages else None
        if last is None or last["role"] != "assistant":
            self.add({"role": "assistant", "content": None, "tool_calls": []}, MessageSource(where))
            last = self.messages[-1]
        elif self.reasoning:  # reasoning between the turn's text and this call: the turn's too
            earlier = [last["reasoning_content"]] if "reasoning_content" in last else []
            last["reasoning_content"] = "\n\n".join([*earlier, *self.reasoning])
            self.reasoning = []
        call = {"name": item.name, "arguments": item.arguments}
        last.setdefault("tool_calls", []).append(
            {"id": item.call_id, "type": "function", "function": call}
        )
        self.sources[-1].calls.append(where)


def _other(where: str, item: OtherItem) -> None:
    if item.type == "item_reference":
        raise bad(where, f"an item_reference needs stored items: {NO_STORAGE}; send the item")
    raise bad(
        f"{where}.type",
        f"{item.type[:80]!r} items are not supported; input takes messages, function_call and "
        "function_call_output items",
    )


def _text(where: str, content: str | list[ContentPart]) -> str:
    if isinstance(content, str):
        return content
    return "".join(_text_part(f"{where}[{j}]", part, TEXT_PARTS) for j, part in enumerate(content))


def _text_part(at: str, part: ContentPart, takes: tuple[str, ...]) -> str:
    if part.type not in takes:
        raise bad(
            f"{at}.type", f"only {', '.join(takes)} parts are supported, not {part.type[:80]!r}"
        )
    if part.text is None:
        raise bad(f"{at}.text", "a text part needs its text")
    return part.text


def _content(where: str, content: str | list[MessagePart]) -> str | list[dict[str, Any]]:
    """A message's content: its text, or with images chat's parts, one for each of its own (so
    that an image's field maps back by index: FieldNames)."""
    if isinstance(content, str):
        return content
    parts = [_chat_part(f"{where}[{j}]", part) for j, part in enumerate(content)]
    if any(part["type"] == "image_url" for part in parts):
        return parts
    return "".join(part["text"] for part in parts)


def _chat_part(at: str, part: MessagePart) -> dict[str, Any]:
    if part.type != IMAGE_PART:
        return {"type": "text", "text": _text_part(at, part, (*TEXT_PARTS, IMAGE_PART))}
    if part.file_id is not None and part.image_url is None:
        raise bad(
            f"{at}.file_id",
            "images by file_id are not supported: this server keeps no files; send the image "
            "in image_url as a data: URL (data:image/png;base64,...)",
        )
    if part.image_url is None:
        raise bad(f"{at}.image_url", "an input_image part needs its image_url")
    return {"type": "image_url", "image_url": {"url": part.image_url}}


def chat_tools(tools: list[FlatTool | BuiltInTool] | None) -> list[dict[str, Any]] | None:
    """Flat Responses function tools in chat's nested shape; built-in tools are refused."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if isinstance(tool, BuiltInTool):
            raise bad(
                f"tools[{i}].type",
                f"{tool.type[:80]!r} is not supported: this server runs no built-in tools "
                "(web search, file search, code interpreter, computer use...); only "
                "function tools (type 'function')",
            )
        function = tool.model_dump(exclude_none=True, exclude={"type"})
        out.append({"type": "function", "function": function})
    return out


def echoed_tools(tools: list[FlatTool | BuiltInTool] | None) -> list[dict[str, Any]]:
    """The request's function tools as a Response object repeats them."""
    return [
        {
            "type": "function",
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
            "strict": tool.strict,
        }
        for tool in tools or ()
        if isinstance(tool, FlatTool)
    ]


def chat_response_format(text: TextConfig | None) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format`` (the schema wrapped in ``json_schema``)."""
    fmt = text.format if text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.schema_ is None:
        raise bad("text.format.schema", "a json_schema format needs its schema")
    wrapper = {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict}
    given = {k: v for k, v in wrapper.items() if v is not None}
    return {"type": "json_schema", "json_schema": given}


def echoed_text(text: TextConfig | None) -> dict[str, Any]:
    """The request's ``text`` as a Response object repeats it."""
    fmt = text.format if text is not None else None
    out: dict[str, Any] = {"format": {"type": "text"}}
    if fmt is not None:
        out["format"] = fmt.model_dump(by_alias=True, exclude_none=True)
    if text is not None and text.verbosity is not None:
        out["verbosity"] = text.verbosity
    return out
