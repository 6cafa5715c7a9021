"""localinfer's answer about an image against llama.cpp's own multimodal CLI (issue #37): the same
tiny Gemma 3 and projector (tests/vision_model.py), or the tiny Qwen2-VL whose image tokens are
placed by M-RoPE (tests/qwen2vl_model.py: a 40x24 image is 15 tokens over 5 positions), the same
image file and prompt, greedy: ``localinfer generate --image`` gives the tokens whose bytes
``llama-mtmd-cli`` prints.

Slow: the CLI is built once from the installed llama-cpp-python's vendored sources
(bench/llama_mtmd_cli.py; minutes on a small machine), then kept in the user's cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("PIL")

from bench.llama_mtmd_cli import ensure_built, run_greedy  # noqa: E402
from bench.llamacpp_source import BuildFailed  # noqa: E402
from localinfer.cli import main  # noqa: E402
from localinfer.loading.loader import load_model  # noqa: E402
from tests.image_files import png_bytes  # noqa: E402
from tests.qwen2vl_model import cached_qwen2vl  # noqa: E402
from tests.vision_model import cached_vlm, random_image  # noqa: E402

pytestmark = [pytest.mark.llamacpp, pytest.mark.slow]
# A model writer and the image's size: Gemma 3's projector resizes to its 32x32, Qwen2-VL's keeps
# the image's own size, here one of 5 x 3 tokens.
MODELS = {"gemma3": (cached_vlm, (30, 30)), "qwen2vl": (cached_qwen2vl, (40, 24))}


@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize("prompt", ["Describe it.", "What is in <__media__>? Say it."])
def test_generate_matches_llama_mtmd_cli(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, prompt: str, kind: str
) -> None:
    try:
        binary = ensure_built()
    except BuildFailed as exc:
        pytest.skip(f"llama-mtmd-cli could not be built here: {exc}")
    write, size = MODELS[kind]
    model, projector = write(tmp_path / kind)
    picture = tmp_path / "picture.png"
    picture.write_bytes(png_bytes(random_image(8, size)))
    want = run_greedy(binary, model, projector, [picture], prompt, 8)
    argv = ["generate", str(model), prompt, "--image", str(picture), "--max-tokens", "8",
            "--threads", "1", "--ctx", "256", "--slots", "1", "--json"]  # fmt: skip
    assert main(argv) == 0
    tokens = json.loads(capsys.readouterr().out)["token_ids"]
    assert len(tokens) == 8 and len(set(tokens)) > 2
    pieces = b"".join(load_model(model).tokenizer.token_bytes(t) for t in tokens)
    # llama-mtmd-cli prints each piece as a C string (a NUL byte prints nothing).
    assert pieces.replace(b"\0", b"").strip(b"\n") == want
