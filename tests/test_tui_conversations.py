"""The conversation store: round trip, listing order, atomic writes, bad files, copies of files,
the temporaries of killed writers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

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


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_a_copied_file_is_its_own_conversation(tmp_path):
    store = ConversationStore(tmp_path)
    conv = Conversation()
    conv.add("user", "original")
    store.save(conv)
    # A backup and a sync tool's conflict copy: same content, same id inside.
    shutil.copy2(tmp_path / f"{conv.id}.json", tmp_path / f"{conv.id} (1).json")
    shutil.copy2(tmp_path / f"{conv.id}.json", tmp_path / f"{conv.id}.sync-conflict-1.json")
    ids = [s.id for s in store.list()]
    assert sorted(ids) == sorted([conv.id, f"{conv.id} (1)", f"{conv.id}.sync-conflict-1"])
    copy = store.load(f"{conv.id} (1)")
    assert copy.id == f"{conv.id} (1)" and copy.messages == conv.messages
    copy.add("assistant", "answered in the copy")
    store.save(copy)  # goes back to the copy's file, the original is untouched
    assert len(store.load(conv.id).messages) == 1
    assert len(store.load(f"{conv.id} (1)").messages) == 2


BAD_FILES = {
    "list.json": "[]",
    "null.json": "null",
    "messages-null.json": '{"messages": null}',
    "message-not-object.json": '{"messages": [1, "two"]}',
    "bad-role.json": '{"messages": [{"role": "wizard", "content": "x"}]}',
    "deep.json": "[" * 100_000 + "]" * 100_000,
    "binary.json": "\udcff",
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_malformed_files_are_skipped_and_reported(tmp_path, name):
    store = ConversationStore(tmp_path)
    good = Conversation()
    good.add("user", "still listed")
    store.save(good)
    path = tmp_path / name
    if name == "binary.json":
        path.write_bytes(b"\xff\xfe\x00garbage")
    else:
        _write(path, BAD_FILES[name])
    assert [s.id for s in store.list()] == [good.id]
    assert store.scan().unreadable == [name]  # named, so the chat can say why it is missing
    with pytest.raises(ConversationError):
        store.load(path.stem)


def test_wrong_typed_fields_read_as_empty(tmp_path):
    store = ConversationStore(tmp_path)
    _write(
        tmp_path / "odd.json",
        json.dumps(
            {
                "id": ["not", "a", "string"],
                "title": {"x": 1},
                "model": 7,
                "updated": None,
                "messages": [{"role": "user", "content": "hello"}],
            }
        ),
    )
    (tmp_path / "folder.json").mkdir()  # a folder with a conversation's name
    [summary] = store.list()
    # The wrong-typed title reads as empty; the list then names it by its first question.
    assert (summary.id, summary.title, summary.model, summary.updated) == ("odd", "hello", "", "")
    assert store.load("odd").title == ""
    assert store.load("odd").messages[0].content == "hello"
    with pytest.raises(ConversationError):
        store.load("folder")


_HANGING_WRITER = """
import os, sys, time
from pathlib import Path
from localinfer.conversations import Conversation, ConversationStore

def hang(src, dst):  # the temporary is written; the process dies before publishing it
    print("written", flush=True)
    time.sleep(600)

os.replace = hang
conv = Conversation()
conv.add("user", "never published")
ConversationStore(Path(sys.argv[1])).save(conv)
"""


def _start_hanging_writer(root):
    proc = subprocess.Popen(
        [sys.executable, "-c", _HANGING_WRITER, str(root)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "written"
    return proc


def test_a_killed_writers_temp_is_swept_and_a_live_ones_kept(tmp_path):
    live = _start_hanging_writer(tmp_path)
    try:
        # The second writer sweeps on its first save too, and must leave the live one's temp.
        dead = _start_hanging_writer(tmp_path)
        dead.kill()
        dead.wait()
        temps = {p.name for p in tmp_path.glob(".*.tmp")}
        assert len(temps) == 2
        dead_temp = next(n for n in temps if f".{dead.pid}." in n)
        live_temp = next(n for n in temps if f".{live.pid}." in n)
        old_legacy = _write(tmp_path / ".0123456789ab.k3j4h5x9.tmp", "{}")  # no pid, from before
        os.utime(old_legacy, (time.time() - 3600, time.time() - 3600))
        young_legacy = _write(tmp_path / ".ba9876543210.abcd1234.tmp", "{}")
        assert ConversationStore(tmp_path).list() == []
        left = {p.name for p in tmp_path.glob(".*.tmp")}
        assert dead_temp not in left and old_legacy.name not in left
        assert live_temp in left and young_legacy.name in left
    finally:
        live.kill()
        live.wait()


def test_a_file_without_a_title_is_listed_by_its_first_question(tmp_path):
    from localinfer.tui.conversations_screen import summary_label

    _write(
        tmp_path / "hand.json", json.dumps({"messages": [{"role": "user", "content": "hi\nthere"}]})
    )
    (summary,) = ConversationStore(tmp_path).list()
    assert summary.title == "hi there" and summary.turns == 1
    assert "hi there  · 1 turn · " in summary_label(summary)
