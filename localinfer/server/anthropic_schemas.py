"""Request bodies of Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens).

Validated with pydantic at the HTTP edge, like the OpenAI bodies in ``schemas``: unknown fields
are ignored (Claude Code sends ``cache_control`` on blocks), every field this server acts on
is type-checked. Content blocks are told apart by ``type``. A user turn's image blocks are read
(issue #37: translation makes them OpenAI ``image_url`` parts); document blocks, and images where
Anthropic's API takes none, are accepted here so that translation can refuse them with a message
that names the block, rather than a bare "tag not expected". What is parsed only to be refused
(those blocks, other image sources, server tools) is left out of /openapi.json
(``SkipJsonSchema``): the document lists what the server takes.
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
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from localinfer.server.json_numbers import JsonInt
from localinfer.server.model_ids import ModelId
from localinfer.server.tool_schemas import FUNCTION_NAME, Parameters

# Anthropic's own bound: temperature runs from 0 to 1 (OpenAI's to 2).
AnthropicTemperature = Annotated[StrictFloat, Field(ge=0.0, le=1.0)]


class _Block(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextBlock(_Block):
    type: Literal["text"]
    text: str


class Base64Source(_Block):
    """An image inline: a JPEG, PNG, GIF or WebP file in base64."""

    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str = Field(min_length=1)


class URLSource(_Block):
    """An image at a URL: fetched only by a server run with ``--allow-image-urls``."""

    type: Literal["url"]
    url: str = Field(min_length=1)


class OtherSource(_Block):
    """Another source (``file``: Anthropic's Files API, which this server does not keep)."""

    type: str


def _source_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    # Tags spelled with brackets, which error messages leave out of the field's path.
    return f"source[{kind if kind in ('base64', 'url') else 'other'}]"


ImageSource = Annotated[
    Annotated[Base64Source, Tag("source[base64]")]
    | Annotated[URLSource, Tag("source[url]")]
    | SkipJsonSchema[Annotated[OtherSource, Tag("source[other]")]],
    Discriminator(_source_tag),
]


class ImageBlock(_Block):
    """An image in a user turn, read by a model with a vision projector."""

    type: Literal["image"]
    source: ImageSource


class DocumentBlock(_Block):
    """A document (PDF): refused by translation, this server reads no documents."""

    type: Literal["document"]


# Blocks parsed only to be refused where they stand (an assistant's image, a tool result's).
MediaBlock = ImageBlock | DocumentBlock


class ThinkingBlock(_Block):
    """A model's own reasoning from an earlier turn: its text goes back to the chat template as
    the turn's reasoning (the template keeps or drops it). A redacted block has no text; the
    signature is not checked (see ``anthropic_render.signature``)."""

    type: Literal["thinking", "redacted_thinking"]
    thinking: str = ""
    signature: str | None = None


class ToolUseBlock(_Block):
    """An assistant's call of a tool."""

    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]


class ToolResultBlock(_Block):
    """A user turn's answer to a ``tool_use`` of the turn before."""

    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: (
        str
        | list[
            Annotated[
                TextBlock | SkipJsonSchema[ImageBlock] | SkipJsonSchema[DocumentBlock],
                Field(discriminator="type"),
            ]
        ]
    ) | None = None
    is_error: StrictBool = False


# The blocks each role's turns hold, as in Anthropic's API: a user turn shows images and answers
# tool calls (tool_result), an assistant turn makes them (tool_use) and carries its reasoning
# (thinking).
# Stating it per role puts the rule in the document; the translation relies on it.
UserBlock = Annotated[
    TextBlock | ImageBlock | SkipJsonSchema[DocumentBlock] | ToolResultBlock,
    Field(discriminator="type"),
]
AssistantBlock = Annotated[
    TextBlock
    | SkipJsonSchema[ImageBlock]
    | SkipJsonSchema[DocumentBlock]
    | ThinkingBlock
    | ToolUseBlock,
    Field(discriminator="type"),
]


class UserMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["user"]
    content: str | list[UserBlock]


class AssistantMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["assistant"]
    content: str | list[AssistantBlock]


AnthropicMessage = Annotated[UserMessage | AssistantMessage, Field(discriminator="role")]


class AnthropicTool(BaseModel):
    """A client tool (``input_schema`` is its input's JSON schema). Anthropic's server tools
    (``type`` such as "web_search_20250305", no ``input_schema``) are refused by translation."""

    # The document: a client tool, with its input's schema.
    model_config = ConfigDict(
        extra="ignore", json_schema_extra={"required": ["name", "input_schema"]}
    )

    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    input_schema: Parameters | SkipJsonSchema[None] = None
    type: Literal["custom"] | SkipJsonSchema[str] | None = None


class AnthropicToolChoice(BaseModel):
    """``auto``: the model decides; ``any``: some tool; ``tool``: the tool ``name``; ``none``."""

    # _tool_needs_name, as the document states it.
    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "if": {"properties": {"type": {"const": "tool"}}, "required": ["type"]},
            "then": {
                "properties": {"name": {"type": "string", "minLength": 1}},
                "required": ["name"],
            },
        },
    )

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(default=None, pattern=FUNCTION_NAME)
    disable_parallel_tool_use: StrictBool = False

    @model_validator(mode="after")
    def _tool_needs_name(self) -> AnthropicToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError("type 'tool' needs the name of the tool to call")
        return self


class ThinkingConfig(BaseModel):
    """``thinking``: ``enabled`` shows the reasoning as thinking blocks, at most
    ``budget_tokens`` of it; ``adaptive`` shows it with no budget; ``disabled`` turns thinking
    off. ``display: omitted`` shows the blocks with their text left out."""

    # _enabled_needs_budget, as the document states it.
    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "if": {"properties": {"type": {"const": "enabled"}}, "required": ["type"]},
            "then": {
                "properties": {"budget_tokens": {"type": "integer"}},  # a number, not null
                "required": ["budget_tokens"],
            },
        },
    )

    type: Literal["enabled", "adaptive", "disabled"]
    # Anthropic asks for at least 1,024; a local model may be given less (0: no reasoning).
    budget_tokens: Annotated[int, JsonInt(ge=0, le=1_000_000)] | None = None
    display: Literal["summarized", "omitted"] | None = None

    @model_validator(mode="after")
    def _enabled_needs_budget(self) -> ThinkingConfig:
        if self.type == "enabled" and self.budget_tokens is None:
            raise ValueError("type 'enabled' needs budget_tokens")
        return self

    @property
    def shown(self) -> bool:
        """Whether the answer carries thinking blocks."""
        return self.type != "disabled"


# A tool choice of "any" or "tool" needs tools (_choice_has_tools); the document says so.
CHOICE_NEEDS_TOOLS = {
    "if": {
        "properties": {
            "tool_choice": {"properties": {"type": {"enum": ["any", "tool"]}}, "required": ["type"]}
        },
        "required": ["tool_choice"],
    },
    "then": {"properties": {"tools": {"type": "array", "minItems": 1}}, "required": ["tools"]},
}


class CountTokensRequest(BaseModel):
    """What a prompt is made of; /v1/messages/count_tokens takes just this."""

    model_config = ConfigDict(extra="ignore", json_schema_extra=CHOICE_NEEDS_TOOLS)

    model: ModelId | None = None
    system: str | list[TextBlock] | None = None
    messages: list[AnthropicMessage] = Field(min_length=1)
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    # A thinking model's reasoning (anthropic_translate); it changes the prompt, so counted too.
    thinking: ThinkingConfig | None = None

    @model_validator(mode="after")
    def _choice_has_tools(self) -> CountTokensRequest:
        choice = self.tool_choice
        if choice is not None and choice.type in ("any", "tool") and not self.tools:
            raise ValueError(f"tool_choice: type {choice.type!r} needs at least one tool in tools")
        return self


class MessagesRequest(CountTokensRequest):
    max_tokens: Annotated[int, JsonInt(ge=1)]  # required, as in Anthropic's API
    stop_sequences: list[str] | None = Field(default=None, max_length=16)
    temperature: AnthropicTemperature | None = None  # None: Anthropic's default, 1.0
    top_p: StrictFloat | None = Field(default=None, gt=0.0, le=1.0)
    top_k: Annotated[int, JsonInt(ge=0)] | None = None
    stream: StrictBool = False
    metadata: dict[str, Any] | None = None  # accepted and ignored (a user id for abuse checks)
