"""Request bodies of the OpenAI-compatible endpoints, validated with pydantic at the HTTP edge.

Unknown fields are ignored (editors send many: ``user``, ``metadata``, ``store``),
but every field this server acts on is type-checked, so a bad body is a 400 before any compute.
Responses are plain dicts built in ``openai_render.py``: they follow OpenAI's JSON exactly and
carry a few extras (``timings``) that a response model would only get in the way of.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    ValidationInfo,
    field_validator,
    model_validator,
)

from localinfer.server.json_numbers import JsonInt
from localinfer.server.model_ids import ModelId

# OpenAI's own bounds; the engine's SamplingParams checks its own again.
# Strict: JSON numbers only, never "0.7" or true (the document says number; so does the check).
Temperature = Annotated[StrictFloat, Field(ge=0.0, le=2.0)]
Penalty = Annotated[StrictFloat, Field(ge=-2.0, le=2.0)]


class TextPart(BaseModel):
    """One element of an array ``content``; only text parts are supported."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: str


class _Message(BaseModel):
    """What every message of a chat history has. Tool calls and results are checked (and turned
    into what the chat template expects) by ``localinfer.tools.template_messages``, which names
    the field a malformed history gets wrong."""

    model_config = ConfigDict(extra="ignore")

    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # assistant turns that called tools
    tool_call_id: str | None = None  # tool results: the call they answer

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def as_openai(self) -> dict[str, Any]:
        """The message as an OpenAI client sent it (text parts joined, absent fields left out)."""
        message: dict[str, Any] = {"role": self.role}  # type: ignore[attr-defined]
        if self.content is not None:
            message["content"] = self.text()
        for key in ("name", "tool_calls", "tool_call_id"):
            value = getattr(self, key)
            if value is not None:
                message[key] = value
        return message


class InputMessage(_Message):
    """A system, developer, user or tool message: it has content (an assistant's may be only
    tool calls). "developer" is OpenAI's newer name for the system role (o1 and later)."""

    role: Literal["system", "developer", "user", "tool"]
    content: str | list[TextPart]


class AssistantMessage(_Message):
    role: Literal["assistant"]


# One message of a chat history, told apart by its role (so the document says which need content).
ChatMessage = Annotated[InputMessage | AssistantMessage, Field(discriminator="role")]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: StrictBool = False


class SamplingFields(BaseModel):
    """Fields shared by chat and text completions."""

    model_config = ConfigDict(extra="ignore")

    model: ModelId | None = None
    max_tokens: Annotated[int, JsonInt(ge=1)] | None = None
    temperature: Temperature | None = None
    top_p: StrictFloat | None = Field(default=None, gt=0.0, le=1.0)
    top_k: Annotated[int, JsonInt(ge=0)] | None = None  # llama.cpp / vLLM extension
    min_p: StrictFloat | None = Field(default=None, ge=0.0, le=1.0)  # llama.cpp / vLLM extension
    repetition_penalty: StrictFloat | None = Field(default=None, gt=0.0, le=10.0)
    # An int64 or a uint64, as clients send them (the sampler takes it modulo 2**64). The bound
    # is inclusive: 2**64 - 1 is exact in every JSON parser's 64-bit integers, 2**64 is not.
    seed: Annotated[int, JsonInt(ge=-(2**63), le=2**64 - 1)] | None = None
    stop: str | list[str] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    n: Annotated[int, JsonInt(ge=1)] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = False  # vLLM extension, handy for benchmarks
    logit_bias: dict[str, float] | None = None  # accepted only empty (see translate.py)
    # text | json_object | json_schema (structured_output.py reads it)
    response_format: dict[str, Any] | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> str | list[str] | None:
        # OpenAI allows up to 4; a few more do no harm, but an unbounded list is a DoS vector.
        if isinstance(value, list) and len(value) > 16:
            raise ValueError("at most 16 stop sequences")
        return value


class ChatCompletionRequest(SamplingFields):
    # _needs_logprobs, as the document states it.
    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "if": {
                "properties": {"top_logprobs": {"type": "integer"}},
                "required": ["top_logprobs"],
            },
            "then": {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]},
        },
    )
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Annotated[int, JsonInt(ge=1)] | None = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[int, JsonInt(ge=0, le=20)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool = True
    # Thinking models (tools/thinking.py): "none" turns thinking off; the others set a budget
    # of reasoning tokens (REASONING_BUDGETS). thinking_budget (localinfer's) sets one exactly.
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    thinking_budget: Annotated[int, JsonInt(ge=0, le=1_000_000)] | None = None
    # Variables for the chat template (vLLM, llama-server): {"enable_thinking": false}.
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("logprobs") is not True:
            raise ValueError("needs logprobs=true")
        return value

    @field_validator("chat_template_kwargs")
    @classmethod
    def _own_template_names(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        reserved = {"messages", "tools", "bos_token", "eos_token", "add_generation_prompt"}
        taken = sorted(reserved & set(value or {}))
        if taken:
            raise ValueError(f"{', '.join(taken)} cannot be set through chat_template_kwargs")
        return value


TokenId = Annotated[int, JsonInt(ge=0)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
# Only text (FIM's prefix: the text before the cursor, "" at the start of a file) may be empty.
Prompt = str | Annotated[list[str], Field(min_length=1, max_length=1)] | TokenIds
# Without a suffix a text completion continues the prompt, which then needs some text.
EMPTY_PROMPTS: list[Any] = ["", [""]]


class CompletionRequest(SamplingFields):
    # _prompt_has_text, as the document states it.
    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            # (the document names the empty text; [""] is refused the same way)
            "if": {"properties": {"prompt": {"const": ""}}, "required": ["prompt"]},
            "then": {"properties": {"suffix": {"type": "string"}}, "required": ["suffix"]},
        },
    )

    # A string, a list of one string, or token ids (a list of ints / a list of one such list).
    prompt: Prompt | Annotated[list[TokenIds], Field(min_length=1, max_length=1)]
    logprobs: Annotated[int, JsonInt(ge=0, le=5)] | None = None
    echo: StrictBool = False
    suffix: str | None = None
    best_of: Annotated[int, JsonInt(ge=1)] | None = None

    @model_validator(mode="after")
    def _prompt_has_text(self) -> CompletionRequest:
        if self.suffix is None and self.prompt in EMPTY_PROMPTS:
            raise ValueError("prompt: the prompt is empty")
        return self
