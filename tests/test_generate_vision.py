# ruff: noqa: F811 - the vlm fixture imported from tests.vision_model
"""`localinfer generate --image PATH` through cli.main (issue #37): on the tiny Gemma 3 with its
projector beside it, the answer is llama.cpp's own (tests/mtmd_reference.py), the image placed
where <__media__> stands or before the prompt, as llama-mtmd-cli places it; a bad image, and an
image for a runner that reads none (torch), are one-line errors naming what to change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("PIL")

from localinfer.backends.prompt_images import RGBImage  # noqa: E402
from localinfer.cli import main  # noqa: E402
from tests.image_files import png_bytes  # noqa: E402
from tests.mtmd_reference import mtmd_greedy  # noqa: E402
from tests.vision_model import (  # noqa: E402
    random_image,
    vlm,  # noqa: F401 - a fixture
)

pytestmark = pytest.mark.llamacpp

FAST = ["--threads", "1", "--ctx", "256", "--max-tokens", "6", "--slots", "1"]
PIXELS = random_image(8, (30, 30))
CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture
def picture(tmp_path: Path) -> Path:
    path = tmp_path / "picture.png"
    path.write_bytes(png_bytes(PIXELS))
    return path


def generate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["generate", *argv, *FAST])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(
    ("prompt", "content"),
    [
        ("What is in <__media__>? Say it.", "What is in <__media__>? Say it."),
        ("Describe it.", "<__media__>Describe it."),
    ],
)
def test_generate_reads_the_image_as_llama_cpp_does(
    capsys: pytest.CaptureFixture[str],
    vlm: tuple[Path, Path],
    picture: Path,
    prompt: str,
    content: str,
) -> None:
    rc, out, err = generate(capsys, str(vlm[0]), prompt, "--image", str(picture), "--json")
    assert rc == 0, err
    answer = json.loads(out)
    image = RGBImage(PIXELS.shape[1], PIXELS.shape[0], PIXELS.tobytes())
    _, want = mtmd_greedy(vlm[0], vlm[1], CHAT.format(content), [image], 6)
    assert answer["token_ids"] == want and answer["backend"] == "llamacpp"


def test_generate_raw_with_an_image(
    capsys: pytest.CaptureFixture[str], vlm: tuple[Path, Path], picture: Path
) -> None:
    """--raw: no chat template, the image before the text; mtmd's tokens for the same text."""
    rc, out, err = generate(capsys, str(vlm[0]), "A picture of", "--image", str(picture),
                            "--raw", "--json")  # fmt: skip
    assert rc == 0, err
    image = RGBImage(PIXELS.shape[1], PIXELS.shape[0], PIXELS.tobytes())
    _, want = mtmd_greedy(vlm[0], vlm[1], "<__media__>A picture of", [image], 6)
    assert json.loads(out)["token_ids"] == want


def test_bad_images_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], vlm: tuple[Path, Path], picture: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.png"
    broken.write_bytes(png_bytes(PIXELS)[:50])
    for path, says in [(broken, "broken or truncated"), (tmp_path / "gone.png", "No such file")]:
        rc, _, err = generate(capsys, str(vlm[0]), "Hi", "--image", str(path))
        assert rc == 1 and says in err and f"--image {path}" in err
        assert len(err.strip().splitlines()) == 1
    rc, _, err = generate(capsys, str(vlm[0]), "<__media__>", "--image", str(picture),
                          "--image", str(picture))  # fmt: skip
    assert rc == 1 and "--image: 2 images, PROMPT marks 1" in err


def test_a_runner_without_images_names_the_llama_cpp_backend(
    capsys: pytest.CaptureFixture[str], vlm: tuple[Path, Path], picture: Path, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    from tests.model_files import tiny_checkpoint, write_gguf

    llama = write_gguf(tmp_path / "tiny-llama.gguf", *tiny_checkpoint("llama"))
    rc, _, err = generate(capsys, str(llama), "Hi", "--image", str(picture), "--backend", "torch")
    assert rc == 1 and "--backend llamacpp" in err and "reads no images" in err
    rc, _, err = generate(capsys, str(llama), "Hi", "--mmproj", str(vlm[1]),
                          "--backend", "torch")  # fmt: skip
    assert rc == 1 and "--mmproj: images run on the llama.cpp runner, not torch" in err
    # The model without a projector on llama.cpp: the same refusal.
    rc, _, err = generate(capsys, str(vlm[0]), "Hi", "--image", str(picture), "--mmproj", "none")
    assert rc == 1 and "--backend llamacpp" in err
