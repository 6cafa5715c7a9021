# ruff: noqa: F811 - the vlm fixture imported from tests.vision_model
"""OpenAI chat with images through a real server (issue #37), on the tiny Gemma 3 whose projector
lies beside it (found there, not asked for): the answer is llama.cpp's own for the same image and
prompt (tests/mtmd_reference.py); bad images are 400s naming the part and leave the server
serving; a model without a projector answers 404 naming --backend llamacpp."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("PIL")
openai = pytest.importorskip("openai")

from localinfer.backends.prompt_images import RGBImage  # noqa: E402
from localinfer.server import ServerThread, create_app  # noqa: E402
from localinfer.session import Session, open_session  # noqa: E402
from tests.image_files import data_url, png_bytes, png_claiming  # noqa: E402
from tests.mtmd_reference import mtmd_greedy  # noqa: E402
from tests.vision_model import (  # noqa: E402
    random_image,
    vlm,  # noqa: F401 - a fixture
)

pytestmark = pytest.mark.llamacpp

PIXELS = random_image(5, (40, 24))
PNG = png_bytes(PIXELS)
PART = "messages[0].content[1].image_url.url"


@pytest.fixture(scope="module")
def session(vlm: tuple[Path, Path]) -> Iterator[Session]:
    with open_session(str(vlm[0]), slots=2, ctx=256, threads=1) as s:
        yield s


@pytest.fixture(scope="module")
def url(session: Session) -> Iterator[str]:
    with ServerThread(create_app(session)) as server:
        yield server.url


def question(image_url: str, *more: str) -> list[dict]:
    content = [
        {"type": "text", "text": "What is in "},
        {"type": "image_url", "image_url": {"url": image_url}},
        *({"type": "image_url", "image_url": {"url": u}} for u in more),
        {"type": "text", "text": "? Say it."},
    ]
    return [{"role": "user", "content": content}]


def ask(url: str, messages: list[dict], max_tokens: int = 8) -> httpx.Response:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=120)


def test_the_answer_is_llama_cpps_own(url: str, session: Session, vlm: tuple[Path, Path]) -> None:
    """The same tokens as llama.cpp's multimodal library gives for the image, and the first
    token's runner-up log-probabilities as its logits give them; another image moves them."""
    assert session.backend == "llamacpp" and session.engine.runner.vision is not None
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")

    def answer(image_url: str) -> tuple[str, list[float], int]:
        done = client.chat.completions.create(
            model="tiny-gemma3-vision-F32", messages=question(image_url), max_tokens=8,
            temperature=0, logprobs=True, top_logprobs=3,
        )  # fmt: skip
        choice = done.choices[0]
        top = [t.logprob for t in choice.logprobs.content[0].top_logprobs]
        return choice.message.content, top, done.usage.prompt_tokens

    content, top, prompt_tokens = answer(data_url(PNG))
    prompt = "<|im_start|>user\nWhat is in <__media__>? Say it.<|im_end|>\n<|im_start|>assistant\n"
    image = RGBImage(PIXELS.shape[1], PIXELS.shape[0], PIXELS.tobytes())
    rows, tokens = mtmd_greedy(vlm[0], vlm[1], prompt, [image], 8)
    assert content == session.model.tokenizer.decode(tokens)
    first = rows[0].astype(np.float64)
    logprobs = first - first.max() - np.log(np.exp(first - first.max()).sum())
    np.testing.assert_allclose(top, np.sort(logprobs)[::-1][:3], atol=1e-2)
    other = answer(data_url(png_bytes(random_image(6, (40, 24)))))[1]
    assert abs(other[1] - top[1]) > 0.05
    assert prompt_tokens > 16 + 20  # the image's 16 tokens count in the prompt


@pytest.mark.parametrize(
    ("image_url", "says"),
    [
        (data_url(b"hello, not an image"), "not an image localinfer reads"),
        (data_url(PNG[:70]), "broken or truncated"),
        (data_url(png_claiming(0, 0)), "not an image"),
        (data_url(png_claiming(50_000, 50_000)), "larger than localinfer reads"),
        ("https://example.com/cat.png", "remote image URLs are not fetched"),
        ("data:image/png;base64,%%%", "not valid base64"),
    ],
)
def test_bad_images_are_400s_naming_the_part(url: str, image_url: str, says: str) -> None:
    refused = ask(url, question(image_url))
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert says in error["message"] and error["param"] == PART


def test_too_many_images_and_the_server_goes_on(url: str) -> None:
    refused = ask(url, question(data_url(PNG), *[data_url(PNG)] * 16))
    assert refused.status_code == 400
    assert "17 images in one request; at most 16" in refused.json()["error"]["message"]
    assert ask(url, question(data_url(PNG)), max_tokens=2).status_code == 200


def test_a_model_without_a_projector_answers_404(vlm: tuple[Path, Path]) -> None:
    with open_session(str(vlm[0]), slots=1, ctx=256, threads=1, mmproj="none") as plain:
        assert plain.engine.runner.vision is None
        with ServerThread(create_app(plain)) as server:
            refused = ask(server.url, question(data_url(PNG)))
            text = ask(server.url, [{"role": "user", "content": "Hi"}], max_tokens=2)
    assert refused.status_code == 404
    error = refused.json()["error"]
    assert "cannot read images" in error["message"] and "--backend llamacpp" in error["message"]
    assert error["param"] == "messages"
    assert text.status_code == 200
