"""The chat's thinking keys: Ctrl+G shows every reasoning block in the view or folds them all,
and ``/think`` or ``/no_think`` typed with a message sets thinking for that message
(think_switch.py says which models read them themselves)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from localinfer.tui.app_base import ChatAppBase
from localinfer.tui.think_switch import UNKNOWN, TypedSwitch, read_switch, requested_thinking

if TYPE_CHECKING:
    from localinfer.tools.thinking import Thinking


class ThinkingActions(ChatAppBase):
    def action_toggle_thinking(self) -> None:
        self.reasoning_shown = not self.reasoning_shown
        for block in self.view.thinking_blocks():
            block.set_expanded(self.reasoning_shown)

    def read_thinking(self, text: str) -> TypedSwitch:
        """``text`` as it goes to the model, with the thinking a typed switch asks for."""
        support = self.host.thinking_support() if self.host.loaded else UNKNOWN
        return read_switch(text, support)

    def message_thinking(self, typed: TypedSwitch) -> Thinking:
        """What this message asks of a thinking model: Settings, or the switch typed."""
        return requested_thinking(self.host.settings, typed.enabled)
