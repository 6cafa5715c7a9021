# ruff: noqa: F811 - the qwen2vl fixture imported from tests.qwen2vl_model
"""A Qwen2-VL-style model (M-RoPE) through the front ends (issue #37), on the tiny random Qwen2-VL
of tests/qwen2vl_model.py with its projector beside it: ``localinfer generate --image`` and the
OpenAI server's ``image_url`` parts give llama.cpp's own greedy tokens for the image
(tests/mtmd_reference.py), the usage counts the image's tokens (15, not its 5 positions), and the
next turn of the conversation starts from the cached image."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("PIL")
openai = pytest.importorskip("openai")

from localinfer.backends.prompt_images import IMAGE_MARKER, RGBImage  # noqa: E402
from localinfer.cli import main  # noqa: E402
from localinfer.server import ServerThread, create_app  # noqa: E402
from localinfer.session import Session, open_session  # noqa: E402
from tests.image_files import data_url, png_bytes  # noqa: E402
from tests.mtmd_reference import mtmd_greedy  # noqa: E402
from tests.qwen2vl_model import qwen2vl  # noqa: E402, F401 - a fixture
from tests.vision_model import random_image  # noqa: E402

pytestmark = pytest.mark.llamacpp

PIXELS = random_image(5, (40, 24))  # 5 x 3 image tokens, 5 positions
IMAGE = RGBImage(PIXELS.shape[1], PIXELS.shape[0], PIXELS.tobytes())
CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
FAST = ["--threads", "1", "--ctx", "256", "--max-tokens", "6", "--slots", "1"]


@pytest.mark.parametrize(
    ("prompt", "content"),
    [
        ("What is in <__media__>? Say it.", "What is in <__media__>? Say it."),
        ("Describe it.", "<__media__>Describe it."),
    ],
)
def test_generate_reads_the_image_as_llama_cpp_does(
    capsys: pytest.CaptureFixture[str],
    qwen2vl: tuple[Path, Path],
    tmp_path: Path,
    prompt: str,
    content: str,
) -> None:
    picture = tmp_path / "picture.png"
    picture.write_bytes(png_bytes(PIXELS))
    rc = main(["generate", str(qwen2vl[0]), prompt, "--image", str(picture), "--json", *FAST])
    out, err = capsys.readouterr()
    assert rc == 0, err
    answer = json.loads(out)
    _, want = mtmd_greedy(qwen2vl[0], qwen2vl[1], CHAT.format(content), [IMAGE], 6)
    assert answer["token_ids"] == want and answer["backend"] == "llamacpp"


@pytest.fixture(scope="module")
def session(qwen2vl: tuple[Path, Path]) -> Iterator[Session]:
    with open_session(str(qwen2vl[0]), slots=2, ctx=256, threads=1) as s:
        yield s


@pytest.fixture(scope="module")
def url(session: Session) -> Iterator[str]:
    with ServerThread(create_app(session)) as server:
        yield server.url


def test_the_server_answers_as_llama_cpp_and_reuses_the_image(
    url: str, session: Session, qwen2vl: tuple[Path, Path]
) -> None:
    """OpenAI chat with an image_url part: llama.cpp's own tokens; the prompt's usage counts the
    image's 15 tokens; the follow-up turn reuses the cells of the image and the answer."""
    runner = session.engine.runner
    assert session.backend == "llamacpp" and runner.vision is not None and runner.vision.mrope
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    turn = [
        {"type": "text", "text": "What is in "},
        {"type": "image_url", "image_url": {"url": data_url(png_bytes(PIXELS))}},
        {"type": "text", "text": "? Say it."},
    ]
    messages: list[dict] = [{"role": "user", "content": turn}]
    done = client.chat.completions.create(
        model="tiny-qwen2vl-F32",
        messages=messages,
        max_tokens=8,
        temperature=0,
    )
    prompt = CHAT.format("What is in <__media__>? Say it.")
    _, tokens = mtmd_greedy(qwen2vl[0], qwen2vl[1], prompt, [IMAGE], 8)
    answer = done.choices[0].message.content
    ends = set(session.model.config.eos_token_ids)  # the server stops there, mtmd_greedy does not
    said = next((i for i, t in enumerate(tokens) if t in ends), len(tokens))
    assert said > 2 and answer == session.model.tokenizer.decode(tokens[:said])
    ids = runner.vision.prompt(prompt.replace("<__media__>", IMAGE_MARKER), [IMAGE], None).ids
    assert done.usage is not None and done.usage.prompt_tokens == len(ids)
    messages += [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And the colour?"},
    ]
    again = client.chat.completions.create(
        model="tiny-qwen2vl-F32",
        messages=messages,
        max_tokens=4,
        temperature=0,
    )
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens >= len(ids)
