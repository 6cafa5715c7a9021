"""A chat request made ready for the engine: its prompt, its constraint and its answer shape.

Runs in a worker thread (templating, tokenizing and compiling a schema take milliseconds): the
tools and history are checked and converted for the model's chat template family, the prompt is
rendered with the tools the HF way, and the constraint is chosen —

* ``response_format`` json_object / json_schema: the answer is that JSON;
* ``tool_choice`` required or a named function: the answer is a call with valid arguments;
* otherwise none, and with tools offered the model's own call syntax is parsed (``auto``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from localinfer.constraints import ConstraintSpec
from localinfer.engine import ConstraintSource
from localinfer.engine.images import PromptImage
from localinfer.engine.reasoning import ReasoningSpec
from localinfer.loading.chat_template import ChatTemplateError
from localinfer.loading.model import LoadedModel
from localinfer.server.answer_shape import (
    ForcedCallAnswer,
    PlainAnswer,
    ShapeFactory,
    ToolAnswer,
)
from localinfer.server.capability import capability_refused
from localinfer.server.errors import APIError
from localinfer.server.image_parts import prompt_images, with_images
from localinfer.server.overflow import fitted_prompt
from localinfer.server.schemas import ChatCompletionRequest
from localinfer.server.structured_output import response_format_spec
from localinfer.server.tool_schemas import choice_value, tool_dicts
from localinfer.tools import (
    detect_family,
    forced_call_spec,
    parse_tool_choice,
    parse_tools,
    prompt_inputs,
    template_messages,
)
from localinfer.tools.thinking import Thinking, thinking_prompt


class ChatSource(Protocol):
    """What planning needs from a session (localinfer.session.Session fits)."""

    def render_chat(
        self, messages: Sequence[Mapping[str, Any]], **template_vars: Any
    ) -> tuple[str, list[int]]: ...

    def compile_constraint(self, spec: ConstraintSpec) -> ConstraintSource: ...

    @property
    def model(self) -> LoadedModel: ...


@dataclass(slots=True, frozen=True)
class ChatPlan:
    prompt_ids: list[int]
    constraint: ConstraintSource | None
    shape: ShapeFactory
    reasoning: ReasoningSpec | None = None  # a thinking model's: its reasoning split off
    images: tuple[PromptImage, ...] = ()  # image_url parts (image_parts.py)
    dropped: int = 0  # messages left out under serve --context-overflow drop-oldest


def requested_thinking(body: ChatCompletionRequest) -> Thinking:
    """What the request asks of a thinking model: thinking_budget, and reasoning_effort (a
    budget, or the template's own effort where it takes one: tools/thinking.py), else the
    template's default; off by reasoning_effort "none" or enable_thinking false."""
    kwargs = body.chat_template_kwargs or {}
    off = body.reasoning_effort == "none" or kwargs.get("enable_thinking") is False
    return Thinking(
        enabled=False if off else None,
        budget=body.thinking_budget,
        effort=body.reasoning_effort,
    )


def plan_chat(source: ChatSource, body: ChatCompletionRequest) -> ChatPlan:
    """Everything the engine and the response need; 400s name the field at fault, a 404 the
    model that takes no chat turns (``capability``)."""
    tools = parse_tools(tool_dicts(body.tools))
    choice = parse_tool_choice(choice_value(body.tool_choice), tools)
    template = source.model.chat_template  # None: the session refuses chat turns (a 404)
    plain = source
    source = with_images(source, body.messages)  # the projector tokenizes a chat with images
    family = detect_family(template.source if template is not None else None)
    messages = template_messages([m.as_openai() for m in body.messages], family)
    inputs = prompt_inputs(family, messages, tools, choice)
    template_vars: dict[str, Any] = dict(body.chat_template_kwargs or {})
    if inputs.tools:
        template_vars["tools"] = inputs.tools
    try:
        # A base model, or one with no template and no turn tokens, takes no chat turns.
        with capability_refused(source.model.name, "chat"):
            thinking = requested_thinking(body)

            def render(messages: Sequence[Mapping[str, Any]]) -> Any:
                return thinking_prompt(source, messages, thinking, **template_vars)

            max_tokens = body.max_completion_tokens or body.max_tokens
            if source is plain:
                prompt, dropped = fitted_prompt(inputs.messages, render, max_tokens)
            else:  # a chat with images is left whole: its images and their markers go together
                prompt, dropped = render(inputs.messages), 0
    except ChatTemplateError as exc:
        # The model's template refused this conversation (its raise_exception): the
        # client's messages are at fault, so the error names them.
        raise APIError(400, f"messages: {exc}", code=exc.code, param="messages") from None

    spec = response_format_spec(body.response_format)
    forced = choice.mode in ("required", "function")
    if forced and spec is not None:
        raise APIError(
            400,
            f"tool_choice: {choice.mode!r} cannot be combined with a JSON response_format "
            "(the answer is a tool call)",
            code="invalid_parameter",
            param="tool_choice",
        )
    if forced:
        spec = forced_call_spec(tools, choice, body.parallel_tool_calls)
    constraint = None if spec is None else source.compile_constraint(spec)
    if forced:
        parallel = body.parallel_tool_calls
        shape: ShapeFactory = lambda: ForcedCallAnswer(family, parallel)  # noqa: E731
    elif choice.mode == "auto" and tools and spec is None:
        # With a JSON response_format the constraint makes the answer that JSON: no calls.
        shape = lambda: ToolAnswer(family, tools)  # noqa: E731
    else:
        shape = PlainAnswer
    return ChatPlan(prompt.ids, constraint, shape, prompt.reasoning, prompt_images(source), dropped)
