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
    StrictFloat,
    Tag,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)

from localinfer.server.json_numbers import JsonInt
from localinfer.server.model_ids import ModelId
from localinfer.server.schemas import Temperature

NO_STORAGE = "this server keeps no responses"
# A flag this server takes only as false (true is refused by _refuse_state, with the reason).
OffOnly = Annotated[StrictBool, WithJsonSchema({"type": "boolean", "const": False})]
# The fields of features this server lacks, and what a client that sends them is told.
REFUSED = {
    "top_logprobs": "log probabilities are not supported on /v1/responses",
    "store": f"true is not supported: {NO_STORAGE}; send store: false (an absent store is taken "
    "as false here, although OpenAI's default is true)",
    "previous_response_id": f"{NO_STORAGE}, so none can be continued; send the whole "
    "conversation as input items",
    "conversation": "this server keeps no conversations; send the whole conversation as input "
    "items",
    "background": "background responses are not supported; stream instead",
    "prompt": "stored prompt templates are not supported; send instructions",
}

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

    model: ModelId | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: Annotated[int, JsonInt(ge=1)] | None = None
    temperature: Temperature | None = None
    top_p: StrictFloat | None = Field(default=None, gt=0.0, le=1.0)
    stream: StrictBool = False
    # Function tools in the Responses' flat shape ({type, name, description, parameters,
    # strict}); built-in tools are refused by name in the translation.
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool = True
    text: TextConfig | None = None
    # Not supported: accepted only as 0 (what clients that do not want them send).
    top_logprobs: Annotated[int, JsonInt(ge=0, le=0)] | None = None
    # Stateful features: this server keeps no responses, so only their "off" values are taken
    # (the document says so; _refuse_state says why to a client that sends another).
    store: OffOnly | None = None
    previous_response_id: None = None
    conversation: None = None
    background: OffOnly | None = None
    prompt: None = None  # a stored prompt template, by id

    @field_validator(*REFUSED, mode="before")
    @classmethod
    def _refuse_state(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and value is not False and value != 0:
            raise ValueError(REFUSED[info.field_name or ""])
        return value
