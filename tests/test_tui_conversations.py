"""The conversation store: round trip, listing order, atomic writes, bad files."""

from __future__ import annotations

import json
import os

import pytest

from localinfer.conversations import Conversation, ConversationError, ConversationStore


def test_round_trip_keeps_everything(tmp_path):
    store = ConversationStore(tmp_path)
    conv = Conversation(system_prompt="Be brief.", model="smollm2")
    conv.add("user", "What is 2+2?\nShow your work.")
    conv.add("assistant", "```python\nprint(2 + 2)\n```\n**4** — ünïcode ✓")
    path = store.save(conv)
    assert path.parent == tmp_path and path.name == f"{conv.id}.json"
    loaded = store.load(conv.id)
    assert loaded.messages == conv.messages
    assert loaded.system_prompt == "Be brief."
    assert loaded.model == "smollm2"
    assert loaded.title == "What is 2+2? Show your work."
    assert loaded.prompt_messages()[0] == {"role": "system", "content": "Be brief."}


def test_default_root_follows_data_dir_env(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALINFER_DATA_DIR", str(tmp_path / "data"))
    store = ConversationStore()
    assert store.root == tmp_path / "data" / "conversations"
    conv = Conversation()
    conv.add("user", "hi")
    store.save(conv)
    assert (tmp_path / "data" / "conversations" / f"{conv.id}.json").is_file()


def test_list_newest_first_and_skips_bad_files(tmp_path):
    store = ConversationStore(tmp_path)
    first, second = Conversation(), Conversation()
    first.add("user", "first question")
    second.add("user", "second question")
    second.add("assistant", "answer")
    store.save(first)
    store.save(second)
    (tmp_path / "broken.json").write_text("{ not json", encoding="utf-8")
    (tmp_path / "other.json").write_text(json.dumps({"id": "x"}), encoding="utf-8")
    summaries = store.list()
    assert [s.id for s in summaries] == [second.id, first.id]
    assert summaries[0].title == "second question" and summaries[0].turns == 1
    with pytest.raises(ConversationError):
        store.load("broken")


def test_failed_write_leaves_the_old_file_intact(tmp_path, monkeypatch):
    store = ConversationStore(tmp_path)
    conv = Conversation()
    conv.add("user", "keep me")
    store.save(conv)
    before = (tmp_path / f"{conv.id}.json").read_bytes()

    def crash(src, dst):
        raise OSError("disk gone")

    conv.add("assistant", "this save fails")
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        store.save(conv)
    monkeypatch.undo()
    assert (tmp_path / f"{conv.id}.json").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [f"{conv.id}.json"]  # no temp left behind
    assert len(store.load(conv.id).messages) == 1


def test_ids_cannot_escape_the_folder(tmp_path):
    store = ConversationStore(tmp_path)
    with pytest.raises(ConversationError):
        store.load("../etc/passwd")
    with pytest.raises(ConversationError):
        store.load("missing")
