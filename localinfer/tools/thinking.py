"""Thinking formats: whether a model reasons before it answers, read from its chat template, and
the engine's ReasoningSpec for one rendered prompt.

The table (beside the tool-call families, family.py):

- ``</think>`` and ``enable_thinking`` in the template (Qwen3, SmolLM3): the output is
  ``<think>...</think>`` then the answer; ``enable_thinking=False`` makes the template close the
  block in the prompt itself;
- ``</think>`` with a generation prompt that ends in ``<think>`` (DeepSeek-R1 distills, QwQ):
  the prompt opened the block, so the output starts inside it;
- neither: the model does not think; its output is untouched (no split, no budget).

gpt-oss's harmony channels are not in the table: no runner here loads gpt-oss yet.

Whether the block is open, closed or not begun is read off the prompt the template rendered,
not guessed per family: a prompt ending in the opening tag starts inside it, one ending in the
closing tag turned thinking off. Thinking turned off where the template has no switch is a
budget of 0: the closing tag is forced first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localinfer.engine.reasoning import THINK_END, THINK_START, ReasoningSpec

if TYPE_CHECKING:
    from localinfer.session import Session

TOGGLE = "enable_thinking"  # the template variable Qwen3 and SmolLM3 read


@dataclass(frozen=True, slots=True)
class ThinkingFormat:
    """How a model's output holds its reasoning."""

    start: str = THINK_START
    end: str = THINK_END
    toggle: str | None = TOGGLE  # the template variable that turns thinking off; None: none


@dataclass(frozen=True, slots=True)
class Thinking:
    """What a request asks of a thinking model: on or off (None: the template's default), and
    at most ``budget`` reasoning tokens (None: no limit)."""

    enabled: bool | None = None
    budget: int | None = None


def detect_thinking(template_source: str | None) -> ThinkingFormat | None:
    """The thinking format a chat template writes; None for a model that does not think."""
    if not template_source or THINK_END not in template_source:
        return None
    return ThinkingFormat(toggle=TOGGLE if TOGGLE in template_source else None)


def template_switch(fmt: ThinkingFormat | None, thinking: Thinking) -> dict[str, bool]:
    """The template variable that turns thinking on or off, where the template reads one. It is
    always given: some templates (llama.cpp's adaptations of R1's and QwQ's) close the block
    unless ``enable_thinking`` is true."""
    if fmt is None or fmt.toggle is None:
        return {}
    return {fmt.toggle: thinking.enabled is not False}


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
    if tail.endswith(fmt.end):
        return None  # thinking turned off by the template: the block is already closed
    budget = 0 if thinking.enabled is False else thinking.budget
    end_ids = tuple(encode(fmt.end + "\n\n")) if budget is not None else ()
    return ReasoningSpec(fmt.start, fmt.end, tail.endswith(fmt.start), budget, end_ids)


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
