"""What people expect of a chat, beside asking: regenerate (F5), edit and resend (F2), copy an
answer or a code block (F3), search (Ctrl+F), export (F8), system-prompt presets (F4) and the
help (F1). Regenerating and editing branch the conversation (branching.py): the one the chat
leaves stays saved as it was."""

from __future__ import annotations

from pathlib import Path

from textual import work

from localinfer.conversations import Conversation
from localinfer.tui.answering import AnswerActions
from localinfer.tui.branching import branch_of
from localinfer.tui.clipboard import CopyChoice, CopyScreen, copy_choices
from localinfer.tui.edit_screen import Edit, EditScreen
from localinfer.tui.export import conversation_markdown, default_export_path, write_export
from localinfer.tui.export_screen import ExportScreen
from localinfer.tui.help_screen import HelpScreen
from localinfer.tui.presets import PresetStore
from localinfer.tui.presets_screen import PresetsScreen
from localinfer.tui.search_screen import SearchScreen


class ChatFeatures(AnswerActions):
    preset_store: PresetStore | None = None  # None: the user's (made on first use)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    # -- regenerate and edit: both branch ------------------------------------------------------

    def _cannot_send(self) -> str | None:
        if self.answering:
            return "an answer is still streaming (Esc stops it)"
        if self.loading or not self.host.loaded:
            return "the model is still loading"
        return None

    def _questions(self) -> list[tuple[int, str]]:
        return [
            (i, m.content) for i, m in enumerate(self.conversation.messages) if m.role == "user"
        ]

    def action_regenerate(self) -> None:
        questions = self._questions()
        why = self._cannot_send() or (None if questions else "there is no answer yet")
        if why:
            self.notify(f"Not regenerated: {why}.", severity="warning")
            return
        index, text = questions[-1]
        self.resend_from(index, text, "Regenerating")

    def action_edit_message(self) -> None:
        questions = self._questions()
        if not questions:
            self.notify("No message to edit yet.", severity="warning")
            return
        self.push_screen(EditScreen(questions), self._resend_edit)

    def _resend_edit(self, edit: Edit | None) -> None:
        if edit is None:
            return
        why = self._cannot_send()
        if why:
            self.prompt.load_text(edit.text)  # the edit is not lost
            self.notify(f"Not sent: {why}.", severity="warning")
            return
        self.resend_from(edit.index, edit.text, "Resending the edited message")

    def resend_from(self, index: int, text: str, doing: str) -> None:
        """Send ``text`` in place of message ``index`` in a branch of the conversation."""
        old = self.conversation
        self.keep_conversation_kv()  # the old branch may be reopened; its KV is kept as on leave
        images = list(old.messages[index].images)  # resent with the message
        branch = branch_of(old, index, text)
        self.conversation = branch
        self.show_saved(branch, notes=False)
        self.refresh_thinking_key()
        answers = [m.content for m in branch.messages if m.role == "assistant"]
        self._last_answer_text = answers[-1] if answers else ""
        self.notify(f"{doing} in a new branch; the conversation as it was stays saved (Ctrl+O).")
        self.send(text, images)

    # -- copy ----------------------------------------------------------------------------------

    def action_copy_choice(self) -> None:
        choices = copy_choices(self.conversation)
        if not choices:
            self.notify("Nothing to copy yet.", severity="warning")
        elif len(choices) == 1:
            self.copy_choice(choices[0])
        else:
            self.push_screen(CopyScreen(choices), self.copy_choice)

    def copy_choice(self, choice: CopyChoice | None) -> None:
        if choice is not None:
            self.copy_to_clipboard(choice.text)  # OSC 52: the terminal's clipboard
            self.notify(f"Copied {choice.what} to the clipboard.")

    # -- search, export, presets ---------------------------------------------------------------

    def action_search(self) -> None:
        if self.answering:
            self.notify("Stop the answer first (Esc).", severity="warning")
            return
        self.push_screen(SearchScreen(self.store), self.open_conversation)

    def action_export(self) -> None:
        if not self.conversation.messages:
            self.notify("Nothing to export yet.", severity="warning")
            return
        self.push_screen(ExportScreen(default_export_path(self.conversation)), self._export_to)

    def _export_to(self, path: Path | None) -> None:
        if path is not None:
            # A copy: the next answer may change the conversation while the worker writes.
            self.export_conversation(Conversation.from_json(self.conversation.to_json()), path)

    @work(thread=True, group="export")
    def export_conversation(self, conversation: Conversation, path: Path) -> None:
        try:
            written = write_export(path, conversation_markdown(conversation, self.host.settings))
        except OSError as exc:
            self.call_from_thread(self.notify, f"Not exported: {exc}", severity="error")
            return
        self.call_from_thread(self.notify, f"Exported to {written}")

    def action_presets(self) -> None:
        if self.preset_store is None:
            self.preset_store = PresetStore()
        screen = PresetsScreen(self.preset_store, self.conversation.system_prompt)
        self.push_screen(screen, self._set_system)
