"""The pieces behind the chat's regenerate/edit, copy, search, export and presets keys, on their
own: branching, code blocks, the front matter's YAML, search matching, the presets file."""

from __future__ import annotations

import pytest

from localinfer.conversations import Conversation, ConversationStore
from localinfer.tui.branching import branch_of
from localinfer.tui.clipboard import code_blocks, copy_choices
from localinfer.tui.conversation_search import search, snippet
from localinfer.tui.export import conversation_markdown, default_export_path, yaml_scalar
from localinfer.tui.help_screen import key_name
from localinfer.tui.presets import PresetError, PresetStore
from localinfer.tui.settings import ChatSettings


def chat(*turns: str, **fields: str) -> Conversation:
    conversation = Conversation(**fields)
    for i, text in enumerate(turns):
        conversation.add("user" if i % 2 == 0 else "assistant", text)
    return conversation


def test_branch_keeps_the_messages_before_and_marks_the_title():
    old = chat("q1", "a1", "q2", "a2", system_prompt="Be brief.", model="m")
    branch = branch_of(old, 2, "q2 edited")
    assert [m.content for m in branch.messages] == ["q1", "a1"]
    assert branch.id != old.id and branch.branched_from == old.id
    assert branch.title == "↳ q1" and branch.system_prompt == "Be brief." and branch.model == "m"
    assert len(old.messages) == 4  # the original is not touched
    assert branch_of(branch, 0, "new first").title == "↳ new first"  # one mark, not two
    assert branch_of(branch, 2, "x").title == "↳ q1"
    with pytest.raises(IndexError):
        branch_of(old, 5, "x")
    old.context_start = 2  # the model sees from q2 on
    assert branch_of(old, 4, "q3").context_start == 2
    assert branch_of(old, 1, "q1 again").context_start == 0  # cut before it: measured again


def test_code_blocks_are_the_fences_in_order():
    text = "a\n\n```python\nx = 1\n```\n\n    indented()\n\n~~~\nplain\n~~~\n"
    assert [(b.language, b.code) for b in code_blocks(text)] == [
        ("python", "x = 1\n"),
        ("", "plain\n"),
    ]


def test_copy_choices_newest_answer_first():
    conversation = chat("q1", "```sh\nls\n```", "q2", "No code here.")
    choices = copy_choices(conversation)
    assert [c.text for c in choices] == ["No code here.", "ls\n", "```sh\nls\n```"]
    assert choices[1].what == "the sh code block of answer 1 (1 line)"


@pytest.mark.parametrize(
    "value",
    ['plain', 'quote " and \\ back', "new\nline\ttab", "ünïcode ✓ 😀",
     "\x7f\x85\x9f\ufeff\u2028\u2029", "key: value # not a comment",
     "- not a list", "", "null", "true", "0.5"],
)  # fmt: skip
def test_yaml_scalar_reads_back_as_the_string(value):
    yaml = pytest.importorskip("yaml")
    assert yaml.safe_load(f"k: {yaml_scalar(value)}") == {"k": value}


def test_yaml_scalar_numbers_and_null():
    assert [yaml_scalar(v) for v in (None, True, 3, 0.25, float("nan"))] == [
        "null", "true", "3", "0.25", "null",
    ]  # fmt: skip


def test_export_markdown_parts():
    yaml = pytest.importorskip("yaml")
    conversation = chat("q", title="A: title", branched_from="abc")
    answer = conversation.add("assistant", "It is 4.", reasoning="2+2 is 4")
    answer.stats = {"ttft_s": 0.5, "decode_tok_s": 20.0, "completion_tokens": 9}
    conversation.add("system", "Summary of earlier turns.")
    conversation.add("user", "next")
    conversation.context_start = 3
    text = conversation_markdown(conversation, ChatSettings(), exported="2025-01-01T00:00:00")
    _, head, body = text.split("---\n", 2)
    meta = yaml.safe_load(head)
    assert meta["title"] == "A: title" and meta["branched_from"] == "abc"
    assert meta["exported"] == "2025-01-01T00:00:00" and meta["settings"]["model"] is None
    assert meta["timing"] == {
        "answers": 1, "completion_tokens": 9, "mean_ttft_s": 0.5, "mean_decode_tok_s": 20.0,
        "per_answer": [{"ttft_s": 0.5, "decode_tok_s": 20.0, "completion_tokens": 9}],
    }  # fmt: skip
    assert "<details><summary>Reasoning</summary>\n\n2+2 is 4\n\n</details>" in body
    assert body.index("## You") < body.index("## Assistant") < body.index("## Note")
    marker = body.index("*— 2 earlier messages are outside the model's context —*")
    assert body.index("## Note") < marker < body.rindex("## You")
    assert meta["context_start"] == 3
    assert default_export_path(conversation, folder=None).name == f"a-title-{conversation.id}.md"


def test_search_needs_every_word(tmp_path):
    store = ConversationStore(tmp_path)
    both = chat("tell me about cats", "Cats and DOGS get along.")
    one = chat("tell me about cats", "They purr.")
    for c in (both, one):
        store.save(c)
    (tmp_path / "broken.json").write_text("{")
    assert [h.id for h in search(store, "cats dogs")] == [both.id]
    assert [h.snippet for h in search(store, "dogs")] == ["Cats and DOGS get along."]
    assert {h.id for h in search(store, "CATS")} == {both.id, one.id}
    assert search(store, "   ") == [] and search(ConversationStore(tmp_path / "none"), "x") == []


def test_snippet_is_around_the_word():
    text = "word " * 40 + "needle " + "tail " * 40
    piece = snippet(text, "needle", width=30)
    assert piece.startswith("…") and piece.endswith("…") and "needle" in piece
    assert len(piece) == 32


def test_presets_file(tmp_path):
    store = PresetStore(tmp_path / "sub" / "presets.json")
    assert store.load() == {}
    store.save("  Pirate   talk ", "Arr.")
    store.save("brief", "Be brief.")
    assert store.save("brief", "Be very brief.") == {
        "brief": "Be very brief.",
        "Pirate talk": "Arr.",
    }
    assert store.delete("Pirate talk") == {"brief": "Be very brief."}
    assert [p.name for p in store.path.parent.iterdir()] == ["presets.json"]  # no temporaries
    with pytest.raises(PresetError):
        store.save("   ", "x")
    store.path.write_text('{"presets": {"a": 1}}')
    with pytest.raises(PresetError):
        store.load()


def test_key_names():
    assert [key_name(k) for k in ("ctrl+r", "f5", "escape", "question_mark")] == [
        "Ctrl+R", "F5", "Esc", "?",
    ]  # fmt: skip


def test_readme_chat_section_has_every_key():
    from pathlib import Path

    from localinfer.tui.help_screen import CHAT_KEYS

    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme.split("### The chat\n", 1)[1].split("\n### ", 1)[0]
    rows = [line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| ")]
    assert [keys for keys, _ in CHAT_KEYS] == rows[1:]  # the header row first
