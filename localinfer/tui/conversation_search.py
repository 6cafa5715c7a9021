"""Search across saved conversations (Ctrl+F): every word of the query, in any case, somewhere in
a conversation (its title, system prompt or any message), newest conversation first, each with
the line where the words are."""

from __future__ import annotations

from dataclasses import dataclass

from localinfer.conversations import Conversation, ConversationError, ConversationStore

SNIPPET_CHARS = 90
MAX_HITS = 200


@dataclass(frozen=True, slots=True)
class SearchHit:
    id: str
    title: str
    updated: str
    snippet: str  # the text around the first place the words are


def _texts(conversation: Conversation) -> list[str]:
    # The title last: the list shows it anyway, a message's line says more.
    return [
        *(m.content for m in conversation.messages),
        conversation.system_prompt,
        conversation.title,
    ]


def snippet(text: str, word: str, width: int = SNIPPET_CHARS) -> str:
    """About ``width`` characters of ``text`` (on one line) around the first ``word``."""
    flat = " ".join(text.split())
    at = flat.lower().find(word)
    start = max(0, at - width // 3)
    piece = flat[start : start + width]
    return ("…" if start else "") + piece + ("…" if start + width < len(flat) else "")


def match(conversation: Conversation, words: list[str]) -> SearchHit | None:
    """A hit when every word is in the conversation; the snippet is from the text that holds the
    most of them (the first such)."""
    texts = [t for t in _texts(conversation) if t]
    lowered = [t.lower() for t in texts]
    if not all(any(w in t for t in lowered) for w in words):
        return None
    best = max(range(len(texts)), key=lambda i: (sum(w in lowered[i] for w in words), -i))
    word = next(w for w in words if w in lowered[best])
    title = conversation.title or "(untitled)"
    return SearchHit(conversation.id, title, conversation.updated, snippet(texts[best], word))


def search(store: ConversationStore, query: str, limit: int = MAX_HITS) -> list[SearchHit]:
    """The conversations in ``store`` holding every word of ``query``, most recent first.
    Unreadable files are skipped (the conversation list names them)."""
    words = [w.lower() for w in query.split()]
    if not words or not store.root.is_dir():
        return []
    hits = []
    for path in store.root.glob("*.json"):
        try:
            conversation = store.load(path.stem)
        except ConversationError:
            continue
        hit = match(conversation, words)
        if hit is not None:
            hits.append(hit)
    hits.sort(key=lambda h: h.updated, reverse=True)
    return hits[:limit]
