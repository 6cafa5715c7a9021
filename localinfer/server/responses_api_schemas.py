"""Request bodies of OpenAI's Responses API (``POST /v1/responses``), validated at the HTTP edge.

Only what this server acts on is typed; other fields clients send (``metadata``, ``user``,
``reasoning``, ``include``, ``prompt_cache_key``, ``truncation``...) are ignored. Fields that need
state this server does not keep (``store: true``, ``previous_response_id``, ``conversation``,
``background``) are typed so that ``responses_api_translate`` can refuse them by name.

Input items are a union picked by ``type`` (a message may leave ``type`` out); an item of any
other type parses as ``OtherItem`` and is refused with a message that says what it is.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictInt,
    Tag,
)

from localinfer.server.schemas import Temperature

# The item types this server turns into a chat history; anything else is an OtherItem.
HISTORY_ITEM_TYPES = ("message", "function_call", "function_call_output")


class ContentPart(BaseModel):
    """One part of a message's content. Only text parts (``input_text``, ``output_text``) are
    supported; the type is checked by the translation so that its error says so."""

    model_config = ConfigDict(extra="ignore")

    type: str
    text: str | None = None


class MessageItem(BaseModel):
    """A message of the conversation (``EasyInputMessage`` or a whole message item)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]


class FunctionCallItem(BaseModel):
    """A call the model made earlier (an output item sent back as input)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(BaseModel):
    """The client's result of a function call."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPart]


class OtherItem(BaseModel):
    """An item of any other type (reasoning, item_reference, built-in tool calls...)."""

    model_config = ConfigDict(extra="allow")

    type: str


def _item_tag(value: Any) -> str:
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in HISTORY_ITEM_TYPES else "other"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[OtherItem, Tag("other")],
    Discriminator(_item_tag),
]


class TextFormat(BaseModel):
    """``text.format``: ``text``, ``json_object``, or ``json_schema`` with its name, schema and
    strict flag at this level (not nested as in chat completions' ``response_format``)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    type: str
    name: str | None = None
    description: str | None = None
    # "schema" would shadow BaseModel.schema; the JSON key stays "schema".
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    format: TextFormat | None = None
    verbosity: str | None = None  # accepted and ignored: a hint this server has no use for


class ResponsesRequest(BaseModel):
    """``POST /v1/responses``."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: Temperature | None = None
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: StrictBool = False
    # Function tools in the Responses' flat shape ({type, name, description, parameters,
    # strict}); built-in tools are refused by name in the translation.
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool = True
    text: TextConfig | None = None
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    # Stateful features, refused: this server keeps no responses.
    store: StrictBool | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: StrictBool | None = None
    prompt: dict[str, Any] | None = None  # a stored prompt template, by id
