"""Saved conversations keep each answer's figures and the conversation a branch came from."""

from __future__ import annotations

import json

from localinfer.conversations import Conversation, ConversationStore


def test_figures_and_branch_origin_round_trip(tmp_path):
    store = ConversationStore(tmp_path)
    conv = Conversation(branched_from="abc123")
    conv.add("user", "hi")
    answer = conv.add("assistant", "hello")
    answer.stats = {"ttft_s": 0.25, "completion_tokens": 7}
    store.save(conv)
    loaded = store.load(conv.id)
    assert loaded.branched_from == "abc123"
    assert loaded.messages[1].stats == {"ttft_s": 0.25, "completion_tokens": 7}
    # The figures are the chat's, never the model's: the prompt leaves them out.
    assert loaded.prompt_messages()[1] == {"role": "assistant", "content": "hello"}


def test_bad_figures_are_dropped_not_fatal(tmp_path):
    data = {
        "id": "x",
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "stats": {"ttft_s": "slow", "ok": 1.5}},
            {"role": "assistant", "content": "b", "stats": [1, 2]},
        ],
    }
    (tmp_path / "x.json").write_text(json.dumps(data), encoding="utf-8")
    loaded = ConversationStore(tmp_path).load("x")
    assert loaded.messages[1].stats == {"ok": 1.5}
    assert loaded.messages[2].stats == {}
    assert loaded.branched_from == ""
    # A conversation that is no branch saves no branched_from field.
    assert "branched_from" not in loaded.to_json()
