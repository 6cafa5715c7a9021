"""A tiny random vision-language model made offline: a Gemma 3 text model (tests/model_files.py's
tiny Gemma 3, with an LM head of its own) and its vision projector, a ``clip`` GGUF of projector
type ``gemma3`` as llama.cpp's multimodal library (tools/mtmd/clip.cpp) loads it.

The LM head is untied, and the weights drawn from seed 1: with the tiny checkpoint's tied
embeddings (scaled up 8 times) the model echoes its last input token whatever came before, so a
greedy answer would be one token repeated, and the same for every image; here the answer's
tokens vary and the image changes them.

The projector is a one-layer SigLIP encoder over a 32x32 image in 4x4 patches (an 8x8 grid),
average-pooled 2x2 (``clip.vision.projector.scale_factor``, which clip.cpp reads for its own tiny
test model) into 16 image tokens, RMS-normed and projected to the text model's width. Gemma 3's
projector is the one whose image tokens attend to each other both ways (mtmd decodes them with
causal attention off), so the runner's non-causal path is what the tests run.

:func:`cached_vlm` writes both files once into a folder keyed by what they hold, beside the
benchmarks' random models (bench/random_gguf.py's cache), so test runs share them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.random_mmproj import written_once
from tests.cached_pair import sources_key
from tests.model_files import TINY_VOCAB_SIZE, gemma3_extra_norms, write_gguf
from tests.tiny import tiny_config, tiny_weights

IMAGE_SIZE = 32
PATCH = 4
MERGE = 2
VISION_WIDTH = 32
VISION_FFN = 48
VISION_HEADS = 2
IMAGE_TOKENS = (IMAGE_SIZE // PATCH // MERGE) ** 2  # 16
# SigLIP's normalisation (Gemma 3's preprocessor config).
MODEL_NAME = "tiny-gemma3-vision-F32.gguf"
PROJECTOR_NAME = "mmproj-tiny-gemma3-F32.gguf"


def write_projector(path: Path, text_width: int, seed: int = 7) -> Path:
    """The vision projector of a Gemma 3 model ``text_width`` wide, at ``path`` (all F32)."""
    from bench.random_mmproj import EncoderShape, projector_tensors, write_gemma3_projector

    shape = EncoderShape(image=IMAGE_SIZE, patch=PATCH, hidden=VISION_WIDTH, ffn=VISION_FFN,
                         heads=VISION_HEADS, layers=1, text_width=text_width)  # fmt: skip
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int) -> np.ndarray:
        return rng.normal(0.0, 1.0 / np.sqrt(cols), size=(rows, cols)).astype(np.float32)

    def vec(n: int, around: float = 0.0) -> np.ndarray:
        return (around + 0.1 * rng.normal(size=n)).astype(np.float32)

    def dense(size: tuple[int, ...], scale: float) -> np.ndarray:
        return (scale * rng.normal(size=size)).astype(np.float32)

    # An image token about as large as a text token's embedding: the projection 8x.
    tensors = projector_tensors(shape, mat, vec, dense, projection_gain=8.0)
    return write_gemma3_projector(path, shape, tensors, name="tiny gemma3 vision projector",
                                  file_type=0, scale_factor=MERGE)  # fmt: skip


def write_vlm(folder: Path) -> tuple[Path, Path]:
    """The text model and its projector side by side in ``folder`` (the projector found beside
    the model by its ``mmproj`` name): (model, projector)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = tiny_config(
        "gemma3", vocab_size=TINY_VOCAB_SIZE, qk_norm=True, tied_embeddings=False, n_layers=6,
        sliding_window=16, sliding_layers=(0, 1, 2, 3, 4), rope_local_theta=10000.0,
        query_pre_attn_scalar=16.0,
    )  # fmt: skip
    source = tiny_weights(config, seed=1)
    weights = {name: source.get(name) for name in source.names()}
    gemma3_extra_norms(config, weights, seed=2)
    model = write_gguf(folder / MODEL_NAME, config, weights)
    return model, write_projector(folder / PROJECTOR_NAME, config.hidden_size)


def _key() -> str:
    """What the files hold: this module's and the text model writer's source."""
    import bench.random_mmproj
    import tests.model_files
    import tests.tiny

    return sources_key(
        __file__, bench.random_mmproj.__file__, tests.model_files.__file__, tests.tiny.__file__
    )


def cached_vlm(folder: Path | None = None) -> tuple[Path, Path]:
    """The tiny model and projector, written once (bench/random_mmproj.written_once)."""
    return written_once(f"tiny-vlm-{_key()}", (MODEL_NAME, PROJECTOR_NAME), write_vlm, folder)


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny model and its projector (import it into a test module as a fixture)."""
    return cached_vlm(tmp_path_factory.mktemp("vlm"))


def random_image(seed: int = 0, size: tuple[int, int] = (40, 24)) -> np.ndarray:
    """A random RGB image, ``[height, width, 3]`` uint8 (not the projector's size: resized)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
