"""The chat's conversation keys: new (Ctrl+N), open (Ctrl+O), system prompt (Ctrl+T), copy
the last answer (Ctrl+R), and saving each answered turn in a worker."""

from __future__ import annotations

from textual import on, work

from localinfer.conversations import Conversation, ConversationError
from localinfer.errors import LocalinferError
from localinfer.tui.app_base import ChatAppBase
from localinfer.tui.conversations_screen import ConversationsScreen
from localinfer.tui.live_stats import StatsSnapshot
from localinfer.tui.messages import ConversationsListed
from localinfer.tui.system_prompt_screen import SystemPromptScreen


class ConversationActions(ChatAppBase):
    @work(thread=True, exclusive=True, group="save")
    def save_conversation(self, conversation: Conversation) -> None:
        try:
            self.store.save(conversation)
        except (OSError, LocalinferError) as exc:
            self.call_from_thread(
                self.notify, f"Could not save the conversation: {exc}", severity="error"
            )

    def action_new_conversation(self) -> None:
        if self.answering:
            self.notify("Stop the answer first (Esc).", severity="warning")
            return
        self.conversation = Conversation(system_prompt=self.conversation.system_prompt)
        self.view.clear()
        self.stats.show_answer(StatsSnapshot())
        self._last_answer_text = ""
        self.notify("New conversation.")

    def action_open_conversation(self) -> None:
        if self.answering:
            self.notify("Stop the answer first (Esc).", severity="warning")
            return
        self.list_conversations()

    @work(thread=True, exclusive=True, group="list")
    def list_conversations(self) -> None:
        self.post_message(ConversationsListed(self.store.list()))

    @on(ConversationsListed)
    def on_conversations_listed(self, message: ConversationsListed) -> None:
        self.push_screen(ConversationsScreen(message.summaries), self.open_conversation)

    def open_conversation(self, conversation_id: str | None) -> None:
        if conversation_id is None:
            return
        try:
            conversation = self.store.load(conversation_id)
        except ConversationError as exc:
            self.view.add_notice(str(exc), error=True)
            return
        self.conversation = conversation
        self.view.show_conversation(conversation)
        answers = [m.content for m in conversation.messages if m.role == "assistant"]
        self._last_answer_text = answers[-1] if answers else ""

    def action_copy_answer(self) -> None:
        if not self._last_answer_text:
            self.notify("No answer to copy yet.", severity="warning")
            return
        self.copy_to_clipboard(self._last_answer_text)
        self.notify("Copied the last answer.")

    def action_system_prompt(self) -> None:
        self.push_screen(SystemPromptScreen(self.conversation.system_prompt), self._set_system)

    def _set_system(self, text: str | None) -> None:
        if text is None:
            return
        self.conversation.system_prompt = text
        self.notify("System prompt set: it applies from the next message.")
