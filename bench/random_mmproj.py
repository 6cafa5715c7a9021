"""A real-shape random vision projector beside a text model of its width, offline: Gemma 3's
SigLIP encoder (896x896 images in 14-pixel patches, 27 layers 1,152 wide, an MLP of 4,304, 16
heads, pooled 4x4 into 256 image tokens) as llama.cpp's converter writes it (matrices F16, the
patch and position embeddings and every vector F32; clip.cpp's tensor names), with random
weights, and a tiny Gemma 3 text model as wide as Gemma 3 4B (2,560), so mtmd loads the pair.

The budget's vision arithmetic (localinfer/budget/vision.py) is checked against it: what the
process grows by while llama.cpp's multimodal library loads the projector and encodes one image.
An encoder's buffers do not grow with its depth, so ``layers`` may be cut to check them faster.

    python -m bench.random_mmproj --layers 27      # the cached pair; prints their paths
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import gguf
import numpy as np

STD = 0.02  # small random weights: the encoder's activations stay finite through 27 layers
MODEL_NAME = "gemma3-text-random-F32.gguf"


@dataclass(frozen=True, slots=True)
class EncoderShape:
    image: int = 896
    patch: int = 14
    hidden: int = 1152
    ffn: int = 4304
    heads: int = 16
    layers: int = 27
    text_width: int = 2560  # Gemma 3 4B's hidden size: each image token's embedding

    @property
    def name(self) -> str:
        key = hashlib.sha256(repr(self).encode()).hexdigest()[:8]
        return f"siglip-gemma3-{self.layers}l-{key}"


GEMMA3_SIGLIP = EncoderShape()


Matrix = Callable[[int, int], np.ndarray]  # (rows, cols) -> a random matrix
Vector = Callable[..., np.ndarray]  # (n, around=0.0) -> a random vector around ``around``
Dense = Callable[[tuple[int, ...], float], np.ndarray]  # (shape, scale) -> random values


def projector_tensors(
    shape: EncoderShape, mat: Matrix, vec: Vector, dense: Dense, projection_gain: float = 1.0
) -> dict[str, np.ndarray]:
    """A Gemma 3 projector's tensors under clip.cpp's names, numpy shapes (ggml's dims reversed),
    drawn in one fixed order by the given makers (the tests' tiny projector uses this too)."""
    w, f, patches = shape.hidden, shape.ffn, (shape.image // shape.patch) ** 2
    t = {
        "v.patch_embd.weight": dense((w, 3, shape.patch, shape.patch), 0.2),
        "v.patch_embd.bias": vec(w),
        "v.position_embd.weight": dense((patches, w), 0.1),
    }
    for i in range(shape.layers):
        p = f"v.blk.{i}."
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            t[p + part + ".weight"], t[p + part + ".bias"] = mat(w, w), vec(w)
        t[p + "ln1.weight"], t[p + "ln1.bias"] = vec(w, 1.0), vec(w)
        t[p + "ln2.weight"], t[p + "ln2.bias"] = vec(w, 1.0), vec(w)
        t[p + "ffn_up.weight"], t[p + "ffn_up.bias"] = mat(f, w), vec(f)
        t[p + "ffn_down.weight"], t[p + "ffn_down.bias"] = mat(w, f), vec(w)
    t["v.post_ln.weight"], t["v.post_ln.bias"] = vec(w, 1.0), vec(w)
    t["mm.soft_emb_norm.weight"] = vec(w, 1.0)
    # ggml's [text, vision]: clip.cpp multiplies by its transpose (vision -> text width).
    projection = mat(w, shape.text_width)
    t["mm.input_projection.weight"] = (
        projection if projection_gain == 1.0 else (projection_gain * projection).astype(np.float32)
    )
    return t


def _tensors(shape: EncoderShape, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Every value at STD (a small scale keeps the activations finite through 27 layers);
    matrices as F16 arrays."""

    def mat(rows: int, cols: int) -> np.ndarray:
        return (STD * rng.standard_normal((rows, cols), dtype=np.float32)).astype(np.float16)

    def vec(n: int, around: float = 0.0) -> np.ndarray:
        return (around + STD * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    def dense(size: tuple[int, ...], _scale: float) -> np.ndarray:
        return STD * rng.standard_normal(size, dtype=np.float32)

    return projector_tensors(shape, mat, vec, dense)


def write_gemma3_projector(
    path: Path,
    shape: EncoderShape,
    tensors: dict[str, np.ndarray],
    *,
    name: str,
    file_type: int,
    scale_factor: int | None = None,
) -> Path:
    """A projector GGUF of projector type gemma3 at ``path`` (each tensor stored as its array's
    dtype; ``file_type``: 0 all F32, 1 mostly F16)."""
    w = gguf.GGUFWriter(str(path), arch="clip")
    w.add_string("general.name", name)
    w.add_uint32("general.file_type", file_type)
    w.add_string("clip.projector_type", "gemma3")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.image_size", shape.image)
    w.add_uint32("clip.vision.patch_size", shape.patch)
    w.add_uint32("clip.vision.embedding_length", shape.hidden)
    w.add_uint32("clip.vision.feed_forward_length", shape.ffn)
    w.add_uint32("clip.vision.block_count", shape.layers)
    w.add_uint32("clip.vision.projection_dim", shape.text_width)
    w.add_uint32("clip.vision.attention.head_count", shape.heads)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    if scale_factor is not None:
        w.add_uint32("clip.vision.projector.scale_factor", scale_factor)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    for tensor_name, tensor in tensors.items():
        w.add_tensor(tensor_name, tensor)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_projector(path: Path, shape: EncoderShape, seed: int = 0) -> Path:
    """The projector GGUF (mostly F16, projector type gemma3) at ``path``."""
    tensors = _tensors(shape, np.random.default_rng(seed))
    return write_gemma3_projector(
        path, shape, tensors, name="random gemma3 siglip projector", file_type=1
    )


def write_text_model(path: Path, width: int) -> Path:
    """A two-layer random Gemma 3 text model ``width`` wide (the tests' tiny one, widened)."""
    from tests.model_files import TINY_VOCAB_SIZE, gemma3_extra_norms, write_gguf
    from tests.tiny import tiny_config, tiny_weights

    config = tiny_config(
        "gemma3", vocab_size=TINY_VOCAB_SIZE, qk_norm=True, tied_embeddings=False,
        hidden_size=width, sliding_window=16, sliding_layers=(0,), rope_local_theta=10000.0,
        query_pre_attn_scalar=16.0,
    )  # fmt: skip
    source = tiny_weights(config, seed=1)
    weights = {name: source.get(name) for name in source.names()}
    gemma3_extra_norms(config, weights, seed=2)
    return write_gguf(path, config, weights)


def cached_pair(
    shape: EncoderShape = GEMMA3_SIGLIP, folder: Path | None = None
) -> tuple[Path, Path]:
    """(text model, projector) of ``shape``, written once into a folder named by the shape
    (default: the user's cache, random-gguf/)."""
    names = (MODEL_NAME, f"mmproj-{shape.name}-F16.gguf")

    def write(part: Path) -> None:
        write_text_model(part / names[0], shape.text_width)
        write_projector(part / names[1], shape)

    return written_once(shape.name, names, write, folder)


def written_once(
    name: str, names: tuple[str, str], write: Callable[[Path], object], folder: Path | None = None
) -> tuple[Path, Path]:
    """The two files ``names`` that ``write(part)`` makes in a staged folder, renamed to
    ``folder / name`` once whole (default folder: the user's cache, random-gguf/); one writer at
    a time (a lock beside it), so parallel test workers and bench runs share one copy."""
    from bench.llamacpp_source import dev_cache, locked

    root = folder or dev_cache() / "random-gguf"
    target = root / name
    first, second = target / names[0], target / names[1]
    if first.is_file() and second.is_file():
        return first, second
    root.mkdir(parents=True, exist_ok=True)
    with locked(root / f"{name}.lock"):
        if not (first.is_file() and second.is_file()):
            part = root / f"{name}.part"
            part.mkdir(exist_ok=True)
            write(part)
            part.rename(target)
    return first, second


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.random_mmproj", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--layers", type=int, default=GEMMA3_SIGLIP.layers)
    p.add_argument("--text-width", type=int, default=GEMMA3_SIGLIP.text_width)
    args = p.parse_args()
    shape = replace(GEMMA3_SIGLIP, layers=args.layers, text_width=args.text_width)
    for path in cached_pair(shape):
        print(f"{path}: {path.stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
