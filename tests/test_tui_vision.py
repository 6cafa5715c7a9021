# ruff: noqa: F811 - the vlm fixture imported from tests.vision_model
"""Images in the chat (issue #37), driven headless (App.run_test) on the tiny Gemma 3 whose
projector lies beside it (tests/vision_model.py): /image attaches a picture, shown above the
prompt and then as a chip on the message with its projector's token count; the answer streams;
a second question about the same picture reuses its KV; saved conversations keep a copy or a
reference, and a reference whose file is gone opens with a note; a model without a projector and
a bad file are refused with one line, and what was typed stays typed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("PIL")

from localinfer.conversations import (  # noqa: E402
    Conversation,
    ConversationStore,
    MessageImage,
)
from localinfer.session import Session, open_session  # noqa: E402
from localinfer.tui.app import ChatApp  # noqa: E402
from localinfer.tui.conversation_view import AnswerTurn, Notice, UserTurn  # noqa: E402
from localinfer.tui.host import ChatHost  # noqa: E402
from localinfer.tui.image_screen import ImagePathScreen  # noqa: E402
from localinfer.tui.prompt_input import PromptInput  # noqa: E402
from localinfer.tui.settings import ChatSettings  # noqa: E402
from tests.image_files import png_bytes, png_claiming  # noqa: E402
from tests.test_tui_app import RecordingApp, type_and_send  # noqa: E402
from tests.tui_pilot import SIZE, wait_until  # noqa: E402
from tests.vision_model import (  # noqa: E402
    IMAGE_TOKENS,
    random_image,
    vlm,  # noqa: F401 - a fixture
)

pytestmark = pytest.mark.llamacpp

CTX = 512
CHIP = f"▣ picture.png · {IMAGE_TOKENS} tokens"


@pytest.fixture(scope="module")
def session(vlm: tuple[Path, Path]) -> Iterator[Session]:
    with open_session(str(vlm[0]), ctx=CTX, slots=1, threads=1) as s:
        yield s


@pytest.fixture(scope="module")
def blind(vlm: tuple[Path, Path]) -> Iterator[Session]:
    """The same model without its projector: it reads no images."""
    with open_session(str(vlm[0]), ctx=CTX, slots=1, threads=1, mmproj="none") as s:
        yield s


@pytest.fixture
def picture(tmp_path: Path) -> Path:
    path = tmp_path / "pictures" / "picture.png"
    path.parent.mkdir()
    path.write_bytes(png_bytes(random_image(3, (30, 30))))
    return path


def make_app(session: Any, store: ConversationStore, image_store: str = "copy", **kw: Any) -> Any:
    settings = ChatSettings(ctx=CTX, slots=1, temperature=0.0, max_tokens=6)
    app = RecordingApp(ChatHost(settings, session=session), store, **kw)
    app.image_store = image_store
    return app


def notices(app: ChatApp) -> list[str]:
    """The conversation's notices, less the runner's that a loaded model opens with."""
    return [str(n.content) for n in app.query(Notice) if str(n.content) != app.host.notice()]


async def attach(pilot: Any, path: Path) -> None:
    app = pilot.app
    before = len(app.pending_images) + len(notices(app))
    await type_and_send(pilot, f"/image {path}")
    await wait_until(pilot, lambda: len(app.pending_images) + len(notices(app)) > before)
    await pilot.pause()


async def ask(pilot: Any, text: str) -> None:
    await type_and_send(pilot, text)
    await wait_until(pilot, lambda: not pilot.app.answering)
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


async def test_attach_ask_and_ask_again_about_the_same_image(session, picture, tmp_path):
    store = ConversationStore(tmp_path / "conversations")
    app = make_app(session, store)
    async with app.run_test(size=SIZE) as pilot:
        await attach(pilot, picture)
        assert [i.name for i in app.pending_images] == ["picture.png"]
        assert app.pending_images[0].tokens == IMAGE_TOKENS
        row = str(app.pending_row.content)
        assert app.pending_row.has_class("-shown") and f"1. {CHIP}" in row
        assert app.query_one(PromptInput).text == ""  # the command went, no message was sent
        await ask(pilot, "What is in the picture?")
        assert not app.pending_images and not app.pending_row.has_class("-shown")
        turn = app.query(UserTurn).first()
        assert turn.chips == (CHIP,) and "What is in the picture?" in str(turn.content)
        answer = app.query(AnswerTurn).first().source
        assert answer.strip() and app.partials and all(answer.startswith(p) for p in app.partials)
        first = app.conversation.messages[1].stats
        assert first["prompt_tokens"] > IMAGE_TOKENS  # the image's positions are in the prompt
        # The next question sends the picture again: its cells are the cache's, not prefilled.
        await ask(pilot, "And its colour?")
        second = app.conversation.messages[3].stats
        assert len(app.conversation.messages) == 4 and app.conversation.messages[3].content
        assert second["cached_tokens"] >= first["prompt_tokens"]
        assert not [n for n in app.query(Notice) if n.has_class("error")]


@pytest.mark.parametrize("mode", ["copy", "reference"])
async def test_saved_with_a_copy_or_a_reference_and_reopened(session, picture, tmp_path, mode):
    store = ConversationStore(tmp_path / "conversations")
    app = make_app(session, store, image_store=mode)
    async with app.run_test(size=SIZE) as pilot:
        await attach(pilot, picture)
        await ask(pilot, "Describe it.")
        conversation_id = app.conversation.id
    saved = json.loads(store.path_for(conversation_id).read_text())
    (image,) = saved["messages"][0]["images"]
    assert image["name"] == "picture.png" and image["tokens"] == IMAGE_TOKENS
    assert image["path"] == str(picture.resolve())
    copies = store.root / "images"
    if mode == "copy":
        assert (copies / image["copy"]).read_bytes() == picture.read_bytes()
        picture.unlink()  # the copy is what the conversation reads now
    else:
        assert "copy" not in image and not copies.exists()
    reopened = store.load(conversation_id)
    assert reopened.messages[0].images[0].key == image["key"]
    app = make_app(session, store, image_store=mode, conversation=reopened)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.query(UserTurn).first().chips == (CHIP,)
        assert not notices(app)
        await ask(pilot, "Again?")
        assert app.conversation.messages[-1].role == "assistant"
        assert app.conversation.messages[-1].stats["prompt_tokens"] > IMAGE_TOKENS


async def test_a_reference_whose_file_is_gone_opens_with_a_note(session, picture, tmp_path):
    store = ConversationStore(tmp_path / "conversations")
    app = make_app(session, store, image_store="reference")
    async with app.run_test(size=SIZE) as pilot:
        await attach(pilot, picture)
        await ask(pilot, "Describe it.")
        conversation_id = app.conversation.id
    picture.unlink()
    app = make_app(
        session, store, image_store="reference", conversation=store.load(conversation_id)
    )
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        (note,) = notices(app)
        assert f"The image picture.png is gone ({picture.resolve()})" in note
        assert "no longer sees it" in note
        assert app.query(UserTurn).first().chips == (CHIP + " · file gone",)
        await ask(pilot, "What did it show?")  # answered, the picture left out
        assert app.conversation.messages[-1].role == "assistant"


async def test_a_model_without_a_projector_refuses_and_keeps_the_message(blind, picture, tmp_path):
    store = ConversationStore(tmp_path / "conversations")
    app = make_app(blind, store)
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.query_one(PromptInput)
        prompt.load_text("What is in it?")
        await pilot.press("f6")  # the dialog: the message being typed stays in the prompt
        assert isinstance(app.screen, ImagePathScreen)
        app.screen.query_one("#image-file").value = str(picture)
        await pilot.press("enter")
        await wait_until(pilot, lambda: bool(notices(app)))
        (line,) = notices(app)
        assert line.startswith("Not attached: this model reads no images here")
        assert "--backend llamacpp" in line and "\n" not in line
        assert prompt.text == "What is in it?" and not app.pending_images
        # Typed as a command, the command comes back to be changed.
        prompt.clear()
        await attach(pilot, picture)
        assert prompt.text == f"/image {picture}" and not app.pending_images


async def test_a_conversation_with_images_on_a_model_without_a_projector(blind, picture, tmp_path):
    """A saved conversation with a picture, reopened on a model that reads none: the question
    is refused with the reason and what to do, and goes back to the prompt."""
    store = ConversationStore(tmp_path / "conversations")
    conversation = Conversation()
    key = "ab" * 32
    image = MessageImage("picture.png", key, IMAGE_TOKENS, str(picture))
    conversation.add("user", "Describe it.", images=[image])
    conversation.add("assistant", "A square.")
    app = make_app(blind, store, conversation=conversation)
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "And now?")
        (line,) = [n for n in notices(app) if n.startswith("Not answered")]
        assert "reads no images" in line and "/image clear" in line
        assert app.query_one(PromptInput).text == "And now?" and not app.pending_images
        assert len(app.conversation.messages) == 2
        # A picture attached for the question (on a model read before) waits again with it.
        app.query_one(PromptInput).clear()
        app.pending_images.append(image)
        await ask(pilot, "Look.")
        assert app.query_one(PromptInput).text == "Look." and app.pending_images == [image]
        assert len(app.conversation.messages) == 2 and not app.query(UserTurn)[2:]


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (png_bytes(random_image(4, (30, 30)))[:60], "broken or truncated"),
        (b"plain text, no picture", "not an image localinfer reads"),
        (png_claiming(50_000, 50_000), "larger than localinfer reads"),
        (None, "No such file"),
        (21 * 2**20, "at most 20 MiB"),
    ],
)
async def test_a_bad_image_file_is_one_line(session, tmp_path, content, says):
    path = tmp_path / "bad.png"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, int):
        with path.open("wb") as handle:
            handle.truncate(content)  # sparse: only its size is read
    app = make_app(session, ConversationStore(tmp_path / "conversations"))
    async with app.run_test(size=SIZE) as pilot:
        await attach(pilot, path)
        (line,) = notices(app)
        assert line.startswith(f"Not attached: /image {path}: ") and says in line
        assert not app.pending_images
        assert app.query_one(PromptInput).text == f"/image {path}"


async def test_image_clear_removes_pending_images(session, picture, tmp_path):
    app = make_app(session, ConversationStore(tmp_path / "conversations"))
    other = picture.with_name("other.png")
    other.write_bytes(png_bytes(random_image(5, (20, 20))))
    async with app.run_test(size=SIZE) as pilot:
        await attach(pilot, picture)
        await attach(pilot, Path(f'"{other}"'))  # quoted, as a terminal's drag and drop writes
        assert [i.name for i in app.pending_images] == ["picture.png", "other.png"]
        await type_and_send(pilot, "/image clear 1")
        await pilot.pause()
        assert [i.name for i in app.pending_images] == ["other.png"]
        assert "1. ▣ other.png" in str(app.pending_row.content)
        await type_and_send(pilot, "/image clear")
        await pilot.pause()
        assert not app.pending_images and not app.pending_row.has_class("-shown")


def test_saved_images_round_trip_and_bad_ones_are_refused():
    conversation = Conversation()
    image = MessageImage("a.png", "0f" * 32, 16, "/x/a.png", "0f" * 32 + ".png")
    conversation.add("user", "Hi", images=[image])
    again = Conversation.from_json(json.loads(json.dumps(conversation.to_json())))
    assert again.messages[0].images == [image]
    assert again.messages[0].as_prompt()["content"] == image.tag() + "Hi"
    for bad in ({"name": "a", "key": "zz", "path": "/a"}, {"name": "a", "key": "0f" * 32},
                {"name": "a", "key": "0f" * 32, "copy": "../../etc/passwd"}):  # fmt: skip
        data = conversation.to_json()
        data["messages"][0]["images"] = [bad]
        with pytest.raises(ValueError, match="bad image"):
            Conversation.from_json(data)


def test_a_server_chat_refuses_images_instead_of_sending_their_tags():
    from localinfer.tui.answer_source import HintedError
    from localinfer.tui.remote_host import RemoteHost

    host = RemoteHost("http://127.0.0.1:9")  # never reached: both refuse before a request
    conversation = Conversation()
    conversation.add("user", "Hi", images=[MessageImage("a.png", "0f" * 32, 16, "/x/a.png")])
    with pytest.raises(HintedError, match="no images to a server"):
        host.prepare(conversation.prompt_messages())
    with pytest.raises(HintedError, match="not over --url"):
        host.image_tokens(None)
    host.close()
