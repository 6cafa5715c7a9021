"""Branching a conversation (an edited message resent, an answer regenerated): the conversation
as it was stays saved, untouched, and reachable from the list (Ctrl+O) and search (Ctrl+F); the
branch is a new conversation holding the messages before the one resent, marked in its title
and pointing back with ``branched_from``. Where the model's context began (``context_start``)
carries over when the branch keeps it; a branch cut before it starts at 0 and the overflow policy
measures it again on the next message."""

from __future__ import annotations

from localinfer.conversations import Conversation

BRANCH_MARK = "↳ "


def branch_title(conversation: Conversation, index: int, question: str) -> str:
    """The original title marked as a branch; a branch of the first message is named after the
    new one (its title came from the message being replaced)."""
    if index > 0 and conversation.title:
        title = conversation.title
    else:
        probe = Conversation()
        probe.add("user", question)
        title = probe.title
    return title if title.startswith(BRANCH_MARK) else BRANCH_MARK + title


def branch_of(conversation: Conversation, index: int, question: str) -> Conversation:
    """A new conversation (new id, new dates) holding ``conversation``'s messages before
    ``index``, whose next message is ``question``; every other field (system prompt, model,
    what the chat keeps beside the turns) carries over."""
    if not 0 <= index <= len(conversation.messages):
        raise IndexError(f"no message {index} to branch at")
    data = conversation.to_json()
    data["messages"] = data["messages"][:index]
    fresh = Conversation()
    branch = Conversation.from_json(data, fresh.id)
    branch.created = branch.updated = fresh.created
    branch.title = branch_title(conversation, index, question)
    branch.branched_from = conversation.id
    return branch
