"""A tiny random Qwen2-VL made offline: a text model of llama.cpp's ``qwen2vl`` architecture (a
Qwen2 whose RoPE takes four positions a token in ``rope.dimension_sections``: M-RoPE) and its
vision projector, a ``clip`` GGUF of projector type ``qwen2vl_merger`` as llama.cpp's multimodal
library (tools/mtmd/clip.cpp) loads it.

The projector is a one-layer ViT over 4x4-pixel patches (two patch embeddings, the second for a
video's next frame, no bias: clip.cpp's Qwen2-VL graph adds both), whose attention turns by M-RoPE
over the patch rows and columns, then a merger: 2x2 neighbouring patches concatenated and
projected by a two-layer MLP (``mm.0``, ``mm.2``) to the text model's width. Images keep their own
size (rounded to 8 pixels, at least 8 image tokens), so a 40x24 image is 5x3 = 15 tokens that take
max(5, 3) = 5 positions of the text model: the text after it goes on 10 positions earlier than its
token count, which is what the M-RoPE bookkeeping under test is about.

The LM head is untied and the weights drawn from seed 1, as tests/vision_model.py's tiny Gemma 3,
so the greedy answer varies and the image changes it. :func:`cached_qwen2vl` writes both files
once into a folder keyed by what they hold (bench/random_gguf.py's cache).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from bench.random_mmproj import written_once
from tests.cached_pair import sources_key
from tests.model_files import TINY_VOCAB_SIZE, write_gguf
from tests.tiny import tiny_config, tiny_weights

PATCH = 4
MERGE = 2
VISION_WIDTH = 32
VISION_FFN = 48
VISION_HEADS = 2  # 16-wide heads: clip.cpp's M-RoPE splits a head in four sections of 4
IMAGE_SIZE = 32  # the header's image size (the image itself keeps its own)
# The text model's heads are 16 wide: its rotary half (8) in sections t, h, w, (unused)
ROPE_SECTIONS = (2, 3, 3, 0)
MODEL_NAME = "tiny-qwen2vl-F32.gguf"
PROJECTOR_NAME = "mmproj-tiny-qwen2vl-F32.gguf"


def projector_tensors(text_width: int, seed: int = 7) -> dict[str, np.ndarray]:
    """The projector's tensors under clip.cpp's names (numpy shapes: ggml's dims reversed)."""
    rng = np.random.default_rng(seed)
    w, f = VISION_WIDTH, VISION_FFN

    def mat(rows: int, cols: int, gain: float = 1.0) -> np.ndarray:
        return rng.normal(0.0, gain / np.sqrt(cols), size=(rows, cols)).astype(np.float32)

    def vec(n: int, around: float = 0.0) -> np.ndarray:
        return (around + 0.1 * rng.normal(size=n)).astype(np.float32)

    patch = (w, 3, PATCH, PATCH)
    t = {
        "v.patch_embd.weight": (0.2 * rng.normal(size=patch)).astype(np.float32),
        "v.patch_embd.weight.1": (0.2 * rng.normal(size=patch)).astype(np.float32),
    }
    p = "v.blk.0."
    for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
        t[p + part + ".weight"], t[p + part + ".bias"] = mat(w, w), vec(w)
    t[p + "ln1.weight"], t[p + "ln1.bias"] = vec(w, 1.0), vec(w)
    t[p + "ln2.weight"], t[p + "ln2.bias"] = vec(w, 1.0), vec(w)
    # ffn_down [vision, ffn]: clip.cpp swaps up and down only when down's input is the width.
    t[p + "ffn_up.weight"], t[p + "ffn_up.bias"] = mat(f, w), vec(f)
    t[p + "ffn_down.weight"], t[p + "ffn_down.bias"] = mat(w, f), vec(w)
    t["v.post_ln.weight"], t["v.post_ln.bias"] = vec(w, 1.0), vec(w)  # the merger's ln_q
    merged = MERGE * MERGE * w
    t["mm.0.weight"], t["mm.0.bias"] = mat(merged, merged), vec(merged)
    # An image token about as large as a text token's embedding (tiny_weights scales those 8x).
    t["mm.2.weight"], t["mm.2.bias"] = mat(text_width, merged, gain=8.0), vec(text_width)
    return t


def write_projector(path: Path, text_width: int, seed: int = 7) -> Path:
    """The Qwen2-VL projector of a text model ``text_width`` wide, at ``path`` (all F32)."""
    w = gguf.GGUFWriter(str(path), arch="clip")
    w.add_string("general.name", "tiny qwen2vl vision projector")
    w.add_uint32("general.file_type", 0)
    w.add_string("clip.projector_type", "qwen2vl_merger")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.image_size", IMAGE_SIZE)
    w.add_uint32("clip.vision.patch_size", PATCH)
    w.add_uint32("clip.vision.embedding_length", VISION_WIDTH)
    w.add_uint32("clip.vision.feed_forward_length", VISION_FFN)
    w.add_uint32("clip.vision.block_count", 1)
    w.add_uint32("clip.vision.projection_dim", text_width)
    w.add_uint32("clip.vision.attention.head_count", VISION_HEADS)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_uint32("clip.vision.spatial_merge_size", MERGE)
    # Qwen2-VL's preprocessor config (CLIP's normalisation).
    w.add_array("clip.vision.image_mean", [0.48145466, 0.4578275, 0.40821073])
    w.add_array("clip.vision.image_std", [0.26862954, 0.26130258, 0.27577711])
    for name, tensor in projector_tensors(text_width, seed).items():
        w.add_tensor(name, tensor)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_qwen2vl(folder: Path) -> tuple[Path, Path]:
    """The text model and its projector side by side in ``folder``: (model, projector)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = tiny_config(
        "qwen2vl", vocab_size=TINY_VOCAB_SIZE, attention_bias=True, tied_embeddings=False,
        n_layers=4,
    )  # fmt: skip
    source = tiny_weights(config, seed=1)
    weights = {name: source.get(name) for name in source.names()}
    extra = {"qwen2vl.rope.dimension_sections": list(ROPE_SECTIONS)}
    model = write_gguf(folder / MODEL_NAME, config, weights, extra=extra)
    return model, write_projector(folder / PROJECTOR_NAME, config.hidden_size)


def _key() -> str:
    """What the files hold: this module's and the text model writer's source."""
    import tests.model_files
    import tests.tiny

    return sources_key(__file__, tests.model_files.__file__, tests.tiny.__file__)


def cached_qwen2vl(folder: Path | None = None) -> tuple[Path, Path]:
    """The tiny model and projector, written once (bench/random_mmproj.written_once)."""
    return written_once(
        f"tiny-qwen2vl-{_key()}", (MODEL_NAME, PROJECTOR_NAME), write_qwen2vl, folder
    )


@pytest.fixture(scope="module")
def qwen2vl(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny Qwen2-VL and its projector (import it into a test module as a fixture)."""
    return cached_qwen2vl(tmp_path_factory.mktemp("qwen2vl"))
