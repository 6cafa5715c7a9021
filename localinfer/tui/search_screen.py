"""The search dialog (Ctrl+F): type words, the saved conversations holding all of them are
listed as you type (searched in a worker), Enter opens the highlighted one."""

from __future__ import annotations

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

from localinfer.conversations import ConversationStore
from localinfer.tui.conversation_search import SearchHit, search


def hit_label(hit: SearchHit) -> str:
    when = hit.updated[:16].replace("T", " ")
    return f"{when}  {hit.title}\n    {hit.snippet}"


class SearchScreen(ModalScreen[str | None]):
    """Returns the id of the conversation to open, or None."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        Binding("down", "to_results", "Results", show=False),
    ]

    def __init__(self, store: ConversationStore) -> None:
        super().__init__()
        self.store = store
        self.hits: list[SearchHit] = []
        self.searches = 0  # searches finished (tests wait on it)

    def compose(self) -> ComposeResult:
        with Vertical(id="search", classes="dialog"):
            yield Label("Search saved conversations", classes="dialog-title")
            yield Input(placeholder="words to find (all of them, any case)", id="search-query")
            yield Label("", id="search-count", classes="dialog-help", markup=False)
            yield OptionList(id="search-results", markup=False)
            yield Label("Enter: open · ↓: to the results · Esc: cancel", classes="dialog-help")

    @on(Input.Changed, "#search-query")
    def on_query_changed(self, event: Input.Changed) -> None:
        self.run_search(event.value)

    @work(thread=True, exclusive=True, group="search")
    def run_search(self, query: str) -> None:
        hits = search(self.store, query)
        self.app.call_from_thread(self._show, query, hits)

    def _show(self, query: str, hits: list[SearchHit]) -> None:
        if query != self.query_one("#search-query", Input).value:
            return  # a later keystroke's search is on its way
        self.hits = hits
        results = self.query_one("#search-results", OptionList)
        results.clear_options()
        results.add_options([Option(hit_label(h)) for h in hits])
        if hits:
            results.highlighted = 0
        count = f"{len(hits)} conversation{'s' if len(hits) != 1 else ''}" if query.strip() else ""
        self.query_one("#search-count", Label).update(count)
        self.searches += 1

    @on(Input.Submitted, "#search-query")
    def on_query_submitted(self) -> None:
        results = self.query_one("#search-results", OptionList)
        if self.hits:
            self.dismiss(self.hits[results.highlighted or 0].id)

    @on(OptionList.OptionSelected, "#search-results")
    def on_result_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.hits[event.option_index].id)

    def action_to_results(self) -> None:
        if self.hits:
            self.query_one("#search-results", OptionList).focus()

    def action_cancel(self) -> None:
        self.dismiss(None)
