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

from localinfer.server.chat_messages import ChatMessage
from localinfer.server.json_numbers import JsonInt
from localinfer.server.model_ids import ModelId
from localinfer.server.structured_output import ResponseFormat
from localinfer.server.tool_schemas import (
    NEEDS_TOOLS,
    ChatToolChoice,
    ChatTools,
    choice_needs_tools,
)

# OpenAI's own bounds; the engine's SamplingParams checks its own again.
# Strict: JSON numbers only, never "0.7" or true (the document says number; so does the check).
Temperature = Annotated[StrictFloat, Field(ge=0.0, le=2.0)]
Penalty = Annotated[StrictFloat, Field(ge=-2.0, le=2.0)]
MAX_STOPS = 16
# OpenAI's reasoning efforts (chat's reasoning_effort, the Responses API's reasoning.effort).
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


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
    repetition_penalty: StrictFloat | None = Field(default=None, ge=0.01, le=10.0)
    # An int64 or a uint64, as clients send them (the sampler takes it modulo 2**64). The bound
    # is inclusive: 2**64 - 1 is exact in every JSON parser's 64-bit integers, 2**64 is not.
    seed: Annotated[int, JsonInt(ge=-(2**63), le=2**64 - 1)] | None = None
    # OpenAI allows up to 4; a few more do no harm, but an unbounded list is a DoS vector.
    stop: str | Annotated[list[str], Field(max_length=MAX_STOPS)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    n: Annotated[int, JsonInt(ge=1, le=1)] | None = Field(
        default=None, description="Only 1: this server returns one choice"
    )
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = False  # vLLM extension, handy for benchmarks
    # Refused rather than ignored: a client relying on a ban would silently get other text.
    logit_bias: Annotated[dict[str, float], Field(max_length=0)] | None = Field(
        default=None, description="Only empty: this server applies no logit bias"
    )
    # text | json_object | json_schema (structured_output.py reads it)
    response_format: ResponseFormat | None = None

    @model_validator(mode="after")
    def _format_has_its_schema(self) -> SamplingFields:
        # Here, not in ResponseFormat, so that the error names the field itself.
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_schema" and fmt.json_schema is None:
            raise ValueError(
                "response_format.json_schema: an object with 'name' and 'schema' is needed"
            )
        return self


class ChatCompletionRequest(SamplingFields):
    # _needs_logprobs, and what parse_tool_choice refuses without tools, as the document states.
    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "if": {
                "properties": {"top_logprobs": {"type": "integer"}},
                "required": ["top_logprobs"],
            },
            "then": {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]},
            "allOf": [NEEDS_TOOLS],
        },
    )
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Annotated[int, JsonInt(ge=1)] | None = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[int, JsonInt(ge=0, le=20)] | None = None
    tools: ChatTools | None = None
    tool_choice: ChatToolChoice | None = None
    parallel_tool_calls: StrictBool = True
    # Thinking models (tools/thinking.py): "none" turns thinking off; the others set a budget
    # of reasoning tokens (EFFORT_BUDGETS), or gpt-oss's template's own reasoning_effort.
    # thinking_budget (localinfer's) sets one exactly.
    reasoning_effort: ReasoningEffort | None = None
    thinking_budget: Annotated[int, JsonInt(ge=0, le=1_000_000)] | None = None
    # Variables for the chat template (vLLM, llama-server): {"enable_thinking": false}.
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _choice_has_tools(self) -> ChatCompletionRequest:
        choice_needs_tools(self.tool_choice, self.tools)
        return self

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
# EMPTY_PROMPTS as the document states it (schemathesis' generator cannot use an enum of them).
EMPTY_TEXT = {
    "anyOf": [
        {"type": "string", "maxLength": 0},
        {"type": "array", "items": {"type": "string", "maxLength": 0}},
    ]
}
# The prompt as text: a string or a list of one.
TEXT_PROMPT = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}


class CompletionRequest(SamplingFields):
    # _prompt_has_text and _consistent, as the document states them.
    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "if": {"properties": {"prompt": EMPTY_TEXT}, "required": ["prompt"]},
            "then": {"properties": {"suffix": {"type": "string"}}, "required": ["suffix"]},
            "allOf": [
                {  # fill-in-the-middle needs the text before the cursor, not token ids
                    "if": {"properties": {"suffix": {"type": "string"}}, "required": ["suffix"]},
                    "then": {"properties": {"prompt": TEXT_PROMPT}},
                },
                {  # echo and logprobs, not both
                    "if": {
                        "properties": {"echo": {"const": True}, "logprobs": {"type": "integer"}},
                        "required": ["echo", "logprobs"],
                    },
                    "then": False,
                },
            ],
        },
    )

    # A string, a list of one string, or token ids (a list of ints / a list of one such list).
    prompt: Prompt | Annotated[list[TokenIds], Field(min_length=1, max_length=1)]
    logprobs: Annotated[int, JsonInt(ge=0, le=5)] | None = None
    echo: StrictBool = False
    suffix: str | None = None
    best_of: Annotated[int, JsonInt(ge=1, le=1)] | None = Field(
        default=None, description="Only 1: this server generates one completion"
    )

    @model_validator(mode="after")
    def _prompt_has_text(self) -> CompletionRequest:
        if self.suffix is None and self.prompt in EMPTY_PROMPTS:
            raise ValueError("prompt: the prompt is empty")
        return self

    @model_validator(mode="after")
    def _consistent(self) -> CompletionRequest:
        if self.suffix is not None and not _is_text(self.prompt):
            raise ValueError(
                "prompt: fill-in-the-middle (suffix) needs the prompt as text, not token ids"
            )
        if self.echo and self.logprobs is not None:
            raise ValueError("echo: echo with logprobs is not supported")
        return self


def _is_text(prompt: object) -> bool:
    return isinstance(prompt, str) or (isinstance(prompt, list) and isinstance(prompt[0], str))
