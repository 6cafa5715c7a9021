"""Thinking per message in the chat: the setting (on/off, a budget) and ``/think`` or
``/no_think`` typed in the prompt, as what one request asks of the model.

Which models read the typed switches themselves (the table, by chat template):

- Qwen3's hybrid template (``enable_thinking`` and ``reasoning_content``): the model was trained
  to obey ``/think`` and ``/no_think`` in a user message (a soft switch; it writes an empty
  reasoning block), so the message keeps it as typed;
- every other thinking template (DeepSeek-R1 distills, QwQ, SmolLM3, which reads them in the
  system message only, Qwen3-2507's thinking-only one): the switch is taken out of the message
  and applied as the setting is, through the template's ``enable_thinking`` where it has one,
  else by a thinking budget of 0 (tools/thinking.py); the chat says so;
- a model that does not think: the switch is taken out and does nothing (the chat says so).

Where the model knows the switch it is applied through the template too: with thinking off in
Settings, Qwen3's template closes the block in the prompt and a typed ``/think`` could not
reopen it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localinfer.tools.thinking import Thinking
    from localinfer.tui.settings import ChatSettings

SWITCHES: dict[str, bool] = {"/think": True, "/no_think": False}


@dataclass(frozen=True, slots=True)
class ThinkingSupport:
    """What the loaded model does with thinking, read from its chat template."""

    thinks: bool | None  # None: not known here (a server's model)
    toggle: bool = False  # its template turns thinking off (enable_thinking); else a budget of 0
    soft_switch: bool = False  # it obeys /think and /no_think typed in a user message


UNKNOWN = ThinkingSupport(thinks=None)
NO_THINKING = ThinkingSupport(thinks=False)


def support_from_template(source: str | None) -> ThinkingSupport:
    """The table above, for a chat template's source (None: no template)."""
    from localinfer.tools.thinking import detect_thinking

    fmt = detect_thinking(source)
    if fmt is None or source is None:
        return NO_THINKING
    qwen3_hybrid = fmt.toggle is not None and "reasoning_content" in source
    return ThinkingSupport(True, toggle=fmt.toggle is not None, soft_switch=qwen3_hybrid)


@dataclass(frozen=True, slots=True)
class TypedSwitch:
    """A message as the model gets it, and the thinking it asked for."""

    text: str  # the message to send (the switch kept or taken out)
    enabled: bool | None = None  # None: no switch typed, the setting applies
    switch: str | None = None  # the switch as typed
    note: str | None = None  # what the chat tells the user about it
    bare: bool = False  # nothing but the switch was typed


def read_switch(text: str, support: ThinkingSupport) -> TypedSwitch:
    """``/think`` or ``/no_think`` as the first or last word of ``text`` (the last one wins);
    anywhere else it is ordinary text."""
    words = text.split()
    at = [i for i in (0, len(words) - 1) if words and words[i] in SWITCHES]
    if not at:
        return TypedSwitch(text)
    switch = words[at[-1]]
    enabled = SWITCHES[switch]
    if len(words) == len(set(at)):
        return TypedSwitch(text, enabled, switch, bare=True)
    if support.soft_switch or support.thinks is None:
        # The model (or the server's template) reads it: sent as typed, applied as well.
        return TypedSwitch(text, enabled, switch)
    kept = _without_switches(text, words, at)
    if not support.thinks:
        note = f"This model does not think: {switch} does nothing and was taken out."
        return TypedSwitch(kept, None, switch, note)
    how = "" if enabled else " (through its template)" if support.toggle else " (a budget of 0)"
    state = "on" if enabled else "off"
    note = f"This model has no {switch} of its own: thinking is {state} for this message{how}."
    return TypedSwitch(kept, enabled, switch, note)


def _without_switches(text: str, words: list[str], at: list[int]) -> str:
    """``text`` less the switches at word positions ``at`` (first, last), its own line breaks
    and spacing kept."""
    body = text.strip()
    if 0 in at:
        body = body[len(words[0]) :].lstrip()
    if len(words) - 1 in at:
        body = body[: len(body) - len(words[-1])].rstrip()
    return body


def requested_thinking(settings: ChatSettings, enabled: bool | None) -> Thinking:
    """What one message asks of a thinking model: the setting, unless a switch was typed."""
    from localinfer.tools.thinking import Thinking

    on = settings.thinking if enabled is None else enabled
    return Thinking(enabled=None if on else False, budget=settings.thinking_budget if on else None)
