"""Request bodies of OpenAI's Responses API (``POST /v1/responses``), validated at the HTTP edge.

Only what this server acts on is typed; other fields clients send (``metadata``, ``user``,
``include``, ``prompt_cache_key``, ``truncation``...) are ignored. Fields that need
state this server does not keep (``store: true``, ``previous_response_id``, ``conversation``,
``background``) are typed so that ``responses_api_translate`` can refuse them by name.

Input items are a union picked by ``type`` (a message may leave ``type`` out); an item of any
other type parses as ``OtherItem`` and is refused with a message that says what it is. Such
forms (other items, content parts and tools) are parsed so that the refusal can name them, and
left out of /openapi.json (``SkipJsonSchema``): the document lists what the server takes.
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
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from localinfer.server.json_numbers import JsonInt
from localinfer.server.model_ids import ModelId
from localinfer.server.schemas import ReasoningEffort, Temperature
from localinfer.server.structured_output import SCHEMA_NAME
from localinfer.server.tool_schemas import (
    MAX_TOOLS,
    NEEDS_TOOLS,
    FlatTool,
    ResponsesToolChoice,
    choice_needs_tools,
)

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

# The item types this server reads; anything else is an OtherItem.
HISTORY_ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
TEXT_PARTS = ("input_text", "output_text")
IMAGE_PART = "input_image"


class ContentPart(BaseModel):
    """One part of a function call's output: text parts (``input_text``, ``output_text``) only;
    other types are checked by the translation so that its error says so."""

    # The document: a text part, with its text.
    model_config = ConfigDict(extra="ignore", json_schema_extra={"required": ["type", "text"]})

    type: Literal["input_text", "output_text"] | SkipJsonSchema[str]
    text: str | SkipJsonSchema[None] = None


# The document: an input_image part has its image_url, a text part its text.
IMAGE_OR_TEXT = {
    "required": ["type"],
    "if": {"properties": {"type": {"const": IMAGE_PART}}, "required": ["type"]},
    "then": {"required": ["image_url"]},
    "else": {"required": ["text"]},
}


class MessagePart(ContentPart):
    """One part of a message's content: text, or an image (``input_image``: a ``data:`` URL or
    base64 in ``image_url``, or an http(s) URL that a server run with ``--allow-image-urls``
    fetches). A ``file_id`` is refused by the translation: this server keeps no files."""

    model_config = ConfigDict(extra="ignore", json_schema_extra=IMAGE_OR_TEXT)

    type: Literal["input_text", "output_text", "input_image"] | SkipJsonSchema[str]
    image_url: str | SkipJsonSchema[None] = None
    file_id: SkipJsonSchema[str | None] = None
    detail: Literal["auto", "low", "high"] | None = None  # accepted; the projector sets the size

    @field_validator("image_url", mode="before")
    @classmethod
    def _url_not_null(cls, value: Any) -> Any:
        # Absent is None here (a text part has none); a null sent is no URL, as documented.
        if value is None:
            raise ValueError("an image_url is a string (leave it out of a text part)")
        return value


class MessageItem(BaseModel):
    """A message of the conversation (``EasyInputMessage`` or a whole message item)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[MessagePart]


class FunctionCallItem(BaseModel):
    """A call the model made earlier (an output item sent back as input)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str


class FunctionCallOutputItem(BaseModel):
    """The client's result of a function call."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[ContentPart]


class ReasoningText(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(BaseModel):
    """A model's reasoning from an earlier turn: its ``reasoning_text`` content goes back to the
    chat template with the assistant turn after it (the template keeps or drops it); a summary
    or encrypted content (another model's) is dropped."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["reasoning"]
    content: list[ReasoningText] | None = None


class ReasoningConfig(BaseModel):
    """``reasoning``: ``effort`` as chat's ``reasoning_effort`` (``none`` turns thinking off;
    the others cap it or set gpt-oss's effort: tools/thinking.py). ``summary`` is accepted and
    ignored: the reasoning item carries the reasoning itself, never a summary."""

    model_config = ConfigDict(extra="ignore")

    effort: ReasoningEffort | None = None
    summary: str | None = None


class OtherItem(BaseModel):
    """An item of any other type (item_reference, built-in tool calls...)."""

    model_config = ConfigDict(extra="allow")

    type: str


def _item_tag(value: Any) -> str:
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in HISTORY_ITEM_TYPES else "other"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")]
    | SkipJsonSchema[Annotated[OtherItem, Tag("other")]],
    Discriminator(_item_tag),
]
# An input list needs a message to answer: one not the system's (chat_history refuses others).
ANSWERABLE = {
    "anyOf": [
        {
            "properties": {"type": {"const": "message"}, "role": {"enum": ["user", "assistant"]}},
            "required": ["role"],
        },
        {
            "properties": {"type": {"enum": ["function_call", "function_call_output"]}},
            "required": ["type"],
        },
    ]
}


def _answerable(item: BaseModel) -> bool:
    """Whether ``item`` is one ANSWERABLE admits."""
    if isinstance(item, MessageItem):
        return item.role in ("user", "assistant")
    return isinstance(item, FunctionCallItem | FunctionCallOutputItem)


class BuiltInTool(BaseModel):
    """A tool of any other type (web search, file search...): refused by name in translation."""

    model_config = ConfigDict(extra="allow")

    type: str


# Tags spelled as pydantic spells its own ("list[...]"), which error messages leave out of the
# field's path (errors._clean_loc): "tools.0.name", not "tools.0.function.name".
FUNCTION_TAG, BUILT_IN_TAG = "tool[function]", "tool[built-in]"


def _tool_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return FUNCTION_TAG if kind == "function" else BUILT_IN_TAG


ResponsesTool = Annotated[
    Annotated[FlatTool, Tag(FUNCTION_TAG)]
    | SkipJsonSchema[Annotated[BuiltInTool, Tag(BUILT_IN_TAG)]],
    Discriminator(_tool_tag),
]


class TextFormat(BaseModel):
    """``text.format``: ``text``, ``json_object``, or ``json_schema`` with its name, schema and
    strict flag at this level (not nested as in chat completions' ``response_format``)."""

    # A json_schema format needs its schema (chat_response_format refuses one without it).
    model_config = ConfigDict(
        extra="ignore",
        populate_by_name=True,
        json_schema_extra={
            "if": {"properties": {"type": {"const": "json_schema"}}, "required": ["type"]},
            "then": {"properties": {"schema": {"type": "object"}}, "required": ["schema"]},
        },
    )

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(default=None, pattern=SCHEMA_NAME)
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

    # What parse_tool_choice refuses without tools, as the document states it.
    model_config = ConfigDict(extra="ignore", json_schema_extra=NEEDS_TOOLS)

    model: ModelId | None = None
    input: str | list[InputItem] = Field(json_schema_extra={"minItems": 1, "contains": ANSWERABLE})
    instructions: str | None = None
    max_output_tokens: Annotated[int, JsonInt(ge=1)] | None = None
    temperature: Temperature | None = None
    top_p: StrictFloat | None = Field(default=None, gt=0.0, le=1.0)
    stream: StrictBool = False
    # Function tools in the Responses' flat shape ({type, name, description, parameters,
    # strict}); built-in tools are refused by name in the translation.
    tools: Annotated[list[ResponsesTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ResponsesToolChoice | None = None
    parallel_tool_calls: StrictBool = True
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None  # a thinking model's (see ReasoningConfig)
    # Not supported: accepted only as 0 (what clients that do not want them send).
    top_logprobs: Annotated[int, JsonInt(ge=0, le=0)] | None = None
    # Stateful features: this server keeps no responses, so only their "off" values are taken
    # (the document says so; _refuse_state says why to a client that sends another).
    store: OffOnly | None = None
    previous_response_id: None = None
    conversation: None = None
    background: OffOnly | None = None
    prompt: None = None  # a stored prompt template, by id

    @model_validator(mode="after")
    def _consistent(self) -> ResponsesRequest:
        # What the document states (NEEDS_TOOLS, ANSWERABLE, TextFormat's schema), as the
        # translation would refuse it, named by field.
        choice_needs_tools(self.tool_choice, self.tools)
        items = self.input if isinstance(self.input, list) else []
        # (an item of another type is left to the translation, whose refusal names it)
        known = not any(isinstance(item, OtherItem) for item in items)
        if isinstance(self.input, list) and known and not any(map(_answerable, items)):
            raise ValueError("input: the input holds no message to answer")
        fmt = self.text.format if self.text is not None else None
        if fmt is not None and fmt.type == "json_schema" and fmt.schema_ is None:
            raise ValueError("text.format.schema: a json_schema format needs its schema")
        return self

    @field_validator(*REFUSED, mode="before")
    @classmethod
    def _refuse_state(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and value is not False and value != 0:
            raise ValueError(REFUSED[info.field_name or ""])
        return value
