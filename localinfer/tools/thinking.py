"""Thinking formats: whether a model reasons before it answers, read from its chat template, and
the engine's ReasoningSpec for one rendered prompt.

The table (beside the tool-call families, family.py):

- ``</think>`` and ``enable_thinking`` in the template (Qwen3, SmolLM3): the output is
  ``<think>...</think>`` then the answer; ``enable_thinking=False`` makes the template close the
  block in the prompt itself;
- ``</think>`` with a generation prompt that ends in ``<think>`` (DeepSeek-R1 distills, QwQ):
  the prompt opened the block, so the output starts inside it;
- harmony's channels (gpt-oss): ``<|channel|>analysis<|message|>...<|end|>`` is the reasoning,
  ``<|start|>assistant<|channel|>final<|message|>...`` the answer; the headers between are
  neither. The template takes ``reasoning_effort`` (low, medium, high) and has no switch: a
  request's effort goes to the template instead of capping the tokens, and thinking turned off
  is a budget of 0. A budget forces the end of the analysis and the final channel's header;
  tool calls (the commentary channel) are read by the HARMONY tool family;
- none of these: the model does not think; its output is untouched (no split, no budget).

Whether the block is open, closed or not begun is read off the prompt the template rendered,
not guessed per family: a prompt ending in the opening tag starts inside it, one ending in the
closing tag turned thinking off. Thinking turned off where the template has no switch is a
budget of 0: the closing tag is forced first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from localinfer.engine.reasoning import THINK_END, THINK_START, ReasoningSpec

if TYPE_CHECKING:
    from localinfer.session import Session

TOGGLE = "enable_thinking"  # the template variable Qwen3 and SmolLM3 read
EFFORT = "reasoning_effort"  # the template variable gpt-oss reads (low, medium, high)

# A request's reasoning effort -> a budget of reasoning tokens (None: no limit), where the
# template takes no effort of its own; "none" turns thinking off.
EFFORT_BUDGETS: dict[str, int | None] = {
    "minimal": 256,
    "low": 1024,
    "medium": 4096,
    "high": None,
    "xhigh": None,
    "max": None,
}
# ... and the level a template that takes one gets (gpt-oss knows low, medium and high).
TEMPLATE_EFFORTS = {
    "none": "low",
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}


@dataclass(frozen=True, slots=True)
class ThinkingFormat:
    """How a model's output holds its reasoning."""

    start: str = THINK_START
    end: str = THINK_END
    toggle: str | None = TOGGLE  # the template variable that turns thinking off; None: none
    close: str = THINK_END + "\n\n"  # forced at the budget: the end and what opens the answer
    headers: tuple[str, ...] = ()  # texts that open the answer (neither reasoning nor answer)
    header_end: str = ""  # where such a header ends ("": it is exactly one of ``headers``)
    reopen: str = ""  # text after the end that opens more reasoning
    header: str = ""  # forced when the reasoning ends and a constraint waits for the answer
    effort: str | None = None  # the template variable that takes a reasoning effort


_MESSAGE = "<|message|>"
_FINAL = "<|channel|>final"  # then <|message|>, or ` <|constrain|>json<|message|>`
_TURN = "<|start|>assistant"
HARMONY = ThinkingFormat(
    start="<|channel|>analysis" + _MESSAGE,
    end="<|end|>",
    toggle=None,
    close="<|end|>" + _TURN + _FINAL + _MESSAGE,
    headers=(_TURN + _FINAL, _FINAL),
    header_end=_MESSAGE,
    reopen=_TURN + "<|channel|>analysis" + _MESSAGE,
    header=_TURN + _FINAL + _MESSAGE,
    effort=EFFORT,
)


@dataclass(frozen=True, slots=True)
class Thinking:
    """What a request asks of a thinking model: on or off (None: the template's default), at
    most ``budget`` reasoning tokens (None: no limit), and a reasoning ``effort`` (OpenAI's
    names; None: the template's default), which sets a budget where the template takes none."""

    enabled: bool | None = None
    budget: int | None = None
    effort: str | None = None


def detect_thinking(template_source: str | None) -> ThinkingFormat | None:
    """The thinking format a chat template writes; None for a model that does not think."""
    if not template_source:
        return None
    if HARMONY.start in template_source and _FINAL + _MESSAGE in template_source:
        return HARMONY if EFFORT in template_source else replace(HARMONY, effort=None)
    if THINK_END not in template_source:
        return None
    return ThinkingFormat(toggle=TOGGLE if TOGGLE in template_source else None)


def template_switch(fmt: ThinkingFormat | None, thinking: Thinking) -> dict[str, Any]:
    """The template variables that turn thinking on or off and set its effort, where the
    template reads them. The switch is always given: some templates (llama.cpp's adaptations
    of R1's and QwQ's) close the block unless ``enable_thinking`` is true."""
    if fmt is None:
        return {}
    variables: dict[str, Any] = {}
    if fmt.toggle is not None:
        variables[fmt.toggle] = thinking.enabled is not False
    if fmt.effort is not None and thinking.effort in TEMPLATE_EFFORTS:
        variables[fmt.effort] = TEMPLATE_EFFORTS[thinking.effort]
    return variables


def thinking_budget(fmt: ThinkingFormat, thinking: Thinking) -> int | None:
    """The reasoning tokens allowed: 0 when thinking is off, else the budget asked, else the
    effort's budget where the template takes no effort itself (None: no limit)."""
    if thinking.enabled is False:
        return 0
    if thinking.budget is not None or fmt.effort is not None or thinking.effort is None:
        return thinking.budget
    return EFFORT_BUDGETS.get(thinking.effort)


def reasoning_spec(
    fmt: ThinkingFormat | None,
    prompt_text: str,
    thinking: Thinking,
    encode: Callable[[str], list[int]],
) -> ReasoningSpec | None:
    """The engine's split for a prompt ``prompt_text`` the template rendered; None when the
    output holds no reasoning (no format, or the template closed the block in the prompt).
    ``encode`` gives the closing tag's token ids, forced at the budget."""
    if fmt is None:
        return None
    tail = prompt_text.rstrip()
    if not fmt.headers and tail.endswith(fmt.end):
        return None  # thinking turned off by the template: the block is already closed
    budget = thinking_budget(fmt, thinking)
    return ReasoningSpec(
        fmt.start,
        fmt.end,
        starts_inside=tail.endswith(fmt.start),
        budget=budget,
        end_ids=tuple(encode(fmt.close)) if budget is not None else (),
        headers=fmt.headers,
        header_end=fmt.header_end,
        reopen=fmt.reopen,
        header_ids=tuple(encode(fmt.header)) if fmt.header else (),
    )


@dataclass(frozen=True, slots=True)
class ThinkingPrompt:
    """A chat prompt's token ids and how its answer holds reasoning (None: all answer)."""

    ids: list[int]
    reasoning: ReasoningSpec | None


def thinking_prompt(
    session: Session,
    messages: Sequence[Mapping[str, Any]],
    thinking: Thinking | None = None,
    **template_vars: Any,
) -> ThinkingPrompt:
    """``messages`` rendered for ``session``'s model with thinking as asked, and the split the
    engine applies to its answer."""
    thinking = thinking or Thinking()
    template = session.model.chat_template
    fmt = detect_thinking(template.source if template is not None else None)
    variables = {**template_switch(fmt, thinking), **template_vars}
    text, ids = session.render_chat(messages, **variables)
    encode = session.model.tokenizer.encode
    spec = reasoning_spec(fmt, text, thinking, lambda s: encode(s, add_special_tokens=False))
    return ThinkingPrompt(ids, spec)
