"""The chat's conversation keys: new (Ctrl+N), open (Ctrl+O), system prompt (Ctrl+T), copy
the last answer (Ctrl+R), and saving each answered turn in a worker.

A conversation the chat leaves (a new one, another opened, the chat quit) has its KV kept in
the session's KV tiers (the disk tier beside the conversations by default), so opening it again
later, in this process or the next, restores its prompt instead of computing it again. Keeping
runs in a worker: the engine thread does it between steps.
"""

from __future__ import annotations

import logging

from textual import on, work
from textual.worker import Worker

from localinfer.conversations import Conversation, ConversationError
from localinfer.errors import LocalinferError
from localinfer.tui.conversations_screen import ConversationsScreen
from localinfer.tui.image_actions import ImageActions
from localinfer.tui.live_stats import StatsSnapshot
from localinfer.tui.messages import ConversationsListed
from localinfer.tui.system_prompt_screen import SystemPromptScreen

log = logging.getLogger(__name__)


class ConversationActions(ImageActions):
    @work(thread=True, exclusive=True, group="save")
    def save_conversation(self, conversation: Conversation) -> None:
        try:
            self.host.images.write_copies(conversation, self.store)  # chat --image-store copy
            self.store.save(conversation)
        except (OSError, LocalinferError) as exc:
            self.call_from_thread(
                self.notify, f"Could not save the conversation: {exc}", severity="error"
            )

    def keep_conversation_kv(self) -> Worker[int] | None:
        """Keep the current conversation's KV in the session's tiers (None: nothing to keep)."""
        if not self.host.loaded or not any(
            m.role == "assistant" for m in self.conversation.messages
        ):
            return None
        return self.persist_kv(self.conversation.prompt_messages())

    @work(thread=True, group="persist-kv")  # not exclusive: two closed conversations keep both
    def persist_kv(self, messages: list[dict[str, str]]) -> int:
        try:
            return self.host.persist_kv(messages)
        except Exception:  # noqa: BLE001 - only a later prefill is lost; the text is saved
            log.exception("keeping the conversation's KV failed")
            return 0

    def action_new_conversation(self) -> None:
        if self.answering:
            self.notify("Stop the answer first (Esc).", severity="warning")
            return
        self.keep_conversation_kv()
        self.conversation = Conversation(system_prompt=self.conversation.system_prompt)
        self.view.clear()
        self.refresh_thinking_key()
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
        self.post_message(ConversationsListed(self.store.scan()))

    @on(ConversationsListed)
    def on_conversations_listed(self, message: ConversationsListed) -> None:
        listing = message.listing
        screen = ConversationsScreen(listing.summaries, listing.unreadable, self.store.root)
        self.push_screen(screen, self.open_conversation)

    def open_conversation(self, conversation_id: str | None) -> None:
        if conversation_id is None:
            return
        try:
            conversation = self.store.load(conversation_id)
        except ConversationError as exc:
            self.view.add_notice(str(exc), error=True)
            return
        if conversation.id != self.conversation.id:
            self.keep_conversation_kv()
        self.conversation = conversation
        self.show_saved(conversation)
        self.refresh_thinking_key()
        self.stats.show_answer(StatsSnapshot())  # the figures were the left conversation's
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
