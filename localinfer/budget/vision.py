"""The vision encoder's memory beside its weights, as llama.cpp's multimodal library (mtmd's clip)
holds it, from the projector GGUF's header alone.

When mtmd loads a projector it reads the tensors in (the weights row counts them), builds the
encoder's graph for one image of its warmup size (the projector's ``image_size``: Gemma 3's
896x896) and reserves the compute buffer that graph needs. An image is encoded in that buffer;
the CPU converts each matrix product's input to the weights' type in a work buffer of its own,
outside the graph's; mtmd keeps the image's embeddings and the runner a copy of them; and a
prompt's image holds its preprocessed pixels (three float planes) until the request ends.

The graph's buffer, measured against mtmd's own figure for random SigLIP encoders (224 to 896
pixels, patch 7 to 16, 256 to 1,152 wide, MLP 2 to 6 times that, 1 to 3 layers, projections to
64 to 5,376): with two layers or more it is exactly 4 bytes x patches x (MLP + 3 x hidden) or,
for a narrow MLP, the attention's 5 x hidden (residual, Q, K, V and K/V cast to f16), whatever
the number of layers. The MLP's stage holds its up projection, the residual and the normed input,
and one hidden row more that the allocator leaves between layers; the copy of the transposed
projection matrix Gemma 3's graph makes fits in that hole, else comes on top. A one-layer
encoder has no such hole: up to one hidden row less (the budget counts it anyway).

Only fixed-size encoders are modelled from their graph (:data:`MODELLED`: Gemma 3's, SigLIP
and CLIP ViTs); another projector type is costed by the same ViT arithmetic at its image size and
said to be an estimate. Dynamic-resolution encoders (Pixtral, Qwen2-VL) reserve for a small
warmup image and grow with larger ones.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

FLOAT = 4  # the encoder's activations are float32
# mtmd's own host memory per projector beyond its weights (the graph's metadata for clip's 8,192
# nodes, the scheduler's tables, and the nodes a layer adds): the process's growth while a
# projector loads, less its weights, with glibc's free heap handed back before and after: 3.45,
# 3.47 and 4.17 MiB for random Gemma 3 projectors of 1, 2 and 27 layers.
CONTEXT_BYTES = round(3.45 * 2**20)
CONTEXT_LAYER_BYTES = 28 * 2**10
# What the first image's prompt and encode hold beyond its pixels, the graph's buffer and its
# embeddings (mtmd's tokenizer state, the encoder's threads): 0.4 MiB for the tiny and the
# Gemma 3 shaped projector alike.
FIRST_IMAGE_BYTES = round(0.4 * 2**20)
# Projector types whose graph the arithmetic follows (clip.cpp's build_vit and their output
# stage); image tokens per image (or per tile): patches / merge^2, or patches as they are.
MERGED = ("gemma3", "idefics3", "internvl", "llama4")
WHOLE = ("mlp", "mlp_norm")
MODELLED = MERGED + WHOLE
TILED = ("idefics3", "internvl")  # a large image is cut into tiles of image_size, each encoded
DEFAULT_MERGE = {"gemma3": 4, "internvl": 2, "llama4": 2}  # clip.cpp's when the header says none
ON_DEVICE = ("cuda", "metal")  # there only the graph's buffer is the device's; the rest is host


@dataclass(frozen=True, slots=True)
class VisionShape:
    """What a projector's header says about its encoder's memory."""

    projector_type: str
    image_size: int
    patch_size: int
    hidden: int
    ffn: int
    layers: int
    projection_dim: int  # the text model's width: each image token's embedding
    merge: int  # patches merged into one token along each side (1: none)
    class_token: bool  # a learned class position before the patches (CLIP)
    work_bytes: float  # bytes per element the CPU converts a matrix product's input to
    projection_copy: int  # bytes of the transposed projection matrix the graph copies (Gemma 3)

    @property
    def patches(self) -> int:
        """Positions the encoder attends over for one image of its size."""
        side = self.image_size // self.patch_size
        return side * side + (1 if self.class_token else 0)

    @property
    def image_tokens(self) -> int | None:
        """Tokens of the text model's context one image (a tile, where TILED) becomes; None
        for a projector type whose count is not modelled."""
        side = self.image_size // self.patch_size
        if self.projector_type in MERGED:
            return (side // self.merge) ** 2
        if self.projector_type in WHOLE:
            return side * side
        return None

    @property
    def modelled(self) -> bool:
        return self.projector_type in MODELLED

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class VisionCost:
    """Bytes the encoder holds beside its weights, part by part."""

    graph: int  # the compute buffer mtmd reserves for an image of the warmup size
    work: int  # the CPU's converted matrix inputs (0 on a GPU)
    context: int  # mtmd's graph metadata and scheduler (host)
    image: int  # one prompt image's preprocessed pixels and its embeddings, twice (host)

    @property
    def total(self) -> int:
        return self.graph + self.work + self.context + self.image


def graph_bytes(shape: VisionShape) -> int:
    """The compute buffer of one image's graph: the larger of the MLP's and the attention's
    stage (see the module's docstring)."""
    n, d = shape.patches, shape.hidden
    hole = FLOAT * n * d
    mlp = FLOAT * n * (shape.ffn + 2 * d) + max(hole, shape.projection_copy)
    attention = FLOAT * n * 5 * d
    return max(mlp, attention)


def vision_cost(shape: VisionShape, device_kind: str) -> VisionCost:
    """The encoder's memory on ``device_kind`` (cpu | cuda | metal | planned)."""
    graph = graph_bytes(shape)
    if device_kind in ON_DEVICE:
        return VisionCost(graph, 0, 0, 0)
    # The widest product's input converted: the MLP's down projection reads patches x ffn.
    work = math.ceil(shape.patches * shape.ffn * shape.work_bytes)
    pixels = 3 * shape.image_size**2 * FLOAT
    embeddings = 2 * (shape.image_tokens or 0) * shape.projection_dim * FLOAT
    context = CONTEXT_BYTES + CONTEXT_LAYER_BYTES * shape.layers
    return VisionCost(graph, work, context, pixels + embeddings + FIRST_IMAGE_BYTES)


def work_bytes(type_name: str) -> float:
    """Bytes per element of ggml's CPU conversion of a product's float32 input for weights of
    ``type_name``: none for float32, f16 for 16-bit weights, 8-bit blocks for quantized ones
    (Q8_0's 34 bytes per 32, Q8_K's 292 per 256 for K-quants)."""
    name = type_name.upper()
    if name == "F32":
        return 0.0
    if name in ("F16", "BF16"):
        return 2.0
    return 292 / 256 if name.endswith("_K") or "_K_" in name else 34 / 32


TensorTypes = Mapping[str, tuple[str, int]]  # name -> (type name, bytes)


def vision_shape(metadata: Mapping[str, Any], tensors: TensorTypes) -> VisionShape | None:
    """The encoder's shape from a projector GGUF's metadata and tensor directory; None for a
    projector without a vision encoder (audio only) or without the numbers to cost it."""
    if metadata.get("clip.has_vision_encoder") is False:
        return None
    kind = str(metadata.get("clip.vision.projector_type") or metadata.get("clip.projector_type"))
    numbers = [
        metadata.get(f"clip.vision.{key}")
        for key in ("image_size", "patch_size", "embedding_length", "feed_forward_length")
    ]
    if not all(isinstance(n, int) and n > 0 for n in numbers):
        return None
    image, patch, hidden, ffn = (int(n) for n in numbers)  # type: ignore[arg-type]
    down = tensors.get("v.blk.0.ffn_down.weight") or tensors.get("v.blk.0.ffn_up.weight")
    projection = tensors.get("mm.input_projection.weight")
    merge = metadata.get("clip.vision.projector.scale_factor") or DEFAULT_MERGE.get(kind, 1)
    return VisionShape(
        projector_type=kind,
        image_size=image,
        patch_size=patch,
        hidden=hidden,
        ffn=ffn,
        layers=int(metadata.get("clip.vision.block_count") or 0),
        projection_dim=int(metadata.get("clip.vision.projection_dim") or 0),
        merge=int(merge),
        class_token="v.class_embd" in tensors,
        work_bytes=work_bytes(down[0]) if down else 2.0,
        projection_copy=projection[1] if projection and kind == "gemma3" else 0,
    )


def shape_from_dict(data: Mapping[str, Any] | None) -> VisionShape | None:
    """A shape kept in the Hub metadata cache (VisionShape.as_dict); None when absent or from
    an older cache that kept other fields."""
    if not data:
        return None
    try:
        return VisionShape(**data)
    except TypeError:
        return None


def tokens_text(shape: VisionShape) -> str:
    """How much of the context an image takes, in words."""
    tokens = shape.image_tokens
    if tokens is None:
        return f"image tokens of a {shape.projector_type} projector are not modelled"
    if shape.projector_type in TILED:
        size = shape.image_size
        return f"a {size}x{size} tile is {tokens:,} tokens of the context (a large image: more)"
    return f"an image is {tokens:,} tokens of the context"
