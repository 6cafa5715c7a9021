"""Real-shape random GGUFs laid out as llama.cpp's Q4_K_M, written offline in seconds.

A decode step's speed is the bytes it reads, so a model with Llama-3.1-8B's or Qwen3-8B's shapes,
block types and vocabulary measures what the real one would, with random weights and no download
(scripts/gpu-check runs them on llama.cpp CUDA and torch CUDA). The blocks are random bytes with
small fixed scales (each block's f16 ``d``/``dmin`` set, so every weight stays within about 0.1 and
activations stay finite); the types follow llama.cpp's Q4_K_M recipe: Q4_K everywhere, Q6_K for
the LM head and for ``attn_v`` / ``ffn_down`` in the first and last eighth of the layers and every
third one between (llama_tensor_get_type's use_more_bits). The tokenizer is the tests' byte-level
BPE padded with unused tokens to the real vocabulary size.

    python -m bench.random_gguf --shape qwen3-8b --out /tmp/qwen3-8b-random-Q4_K_M.gguf
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from tests.model_files import CHATML, finish_gguf, tiny_vocab

Q4_K = gguf.GGMLQuantizationType.Q4_K
Q6_K = gguf.GGMLQuantizationType.Q6_K
# Byte offsets of the f16 scales in each block type's 144 / 210 bytes (ggml-common.h).
F16_FIELDS = {Q4_K: (0, 2), Q6_K: (208,)}
SCALE = 1e-4  # every block's d (and dmin): weights of at most ~0.1
MOSTLY_Q4_K_M = 15  # llama_ftype


@dataclass(frozen=True, slots=True)
class Shape:
    name: str
    arch: str  # GGUF architecture: llama | qwen3
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    ctx: int
    rope_theta: float
    qk_norm: bool = False  # qwen3's per-head q/k RMSNorm

    def scaled(self, layers: int, hidden: int, ffn: int, vocab: int) -> Shape:
        """A small model of the same kind (tests): head_dim and heads shrink with hidden."""
        heads = max(hidden // 64, 1)
        kv_heads = max(heads * self.kv_heads // self.heads, 1)
        return dataclasses.replace(
            self, name=f"{self.name}-scaled", layers=layers, hidden=hidden, ffn=ffn,
            heads=heads, kv_heads=kv_heads, head_dim=64, vocab=vocab, ctx=4096,
        )  # fmt: skip


SHAPES = {
    "llama3.1-8b": Shape("llama3.1-8b", "llama", 32, 4096, 14336, 32, 8, 128, 128256, 131072, 5e5),
    "qwen3-8b": Shape("qwen3-8b", "qwen3", 36, 4096, 12288, 32, 8, 128, 151936, 40960, 1e6, True),
}


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's use_more_bits: Q6_K for attn_v / ffn_down in these layers of a Q4_K_M."""
    eighth = layers // 8
    return layer < eighth or layer >= 7 * layers // 8 or (layer - eighth) % 3 == 2


def random_blocks(rows: int, cols: int, qtype: gguf.GGMLQuantizationType, rng) -> np.ndarray:
    """``rows`` x ``cols`` weights as random blocks of ``qtype`` with small fixed scales."""
    weights, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (rows, cols // weights, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(SCALE).tobytes(), dtype=np.uint8)
    for offset in F16_FIELDS[qtype]:
        blocks[:, :, offset : offset + 2] = scale
    return blocks.reshape(rows, -1)


Entry = tuple[str, tuple[int, int], gguf.GGMLQuantizationType | None]


def tensor_types(shape: Shape) -> list[Entry]:
    """(name, (rows, row length), block type or None for a float32 vector) in llama.cpp's order."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    out: list[Entry] = [("token_embd.weight", (shape.vocab, h), Q4_K)]
    for i in range(shape.layers):
        wide = Q6_K if more_bits(i, shape.layers) else Q4_K
        out += [
            (f"blk.{i}.attn_norm.weight", (1, h), None),
            (f"blk.{i}.attn_q.weight", (q, h), Q4_K),
            (f"blk.{i}.attn_k.weight", (kv, h), Q4_K),
            (f"blk.{i}.attn_v.weight", (kv, h), wide),
            (f"blk.{i}.attn_output.weight", (h, q), Q4_K),
            (f"blk.{i}.ffn_norm.weight", (1, h), None),
            (f"blk.{i}.ffn_gate.weight", (shape.ffn, h), Q4_K),
            (f"blk.{i}.ffn_up.weight", (shape.ffn, h), Q4_K),
            (f"blk.{i}.ffn_down.weight", (h, shape.ffn), wide),
        ]
        if shape.qk_norm:
            out += [(f"blk.{i}.attn_q_norm.weight", (1, shape.head_dim), None)]
            out += [(f"blk.{i}.attn_k_norm.weight", (1, shape.head_dim), None)]
    out += [("output_norm.weight", (1, h), None), ("output.weight", (shape.vocab, h), Q6_K)]
    return out


def write_random_gguf(path: Path, shape: Shape, seed: int = 0) -> Path:
    """Write ``shape`` as a random Q4_K_M GGUF at ``path`` (made in a temporary file first)."""
    rng = np.random.default_rng(seed)
    tmp = path.with_name(path.name + ".part")
    w = gguf.GGUFWriter(str(tmp), arch=shape.arch)
    w.add_name(f"random {shape.name}")
    w.add_file_type(MOSTLY_Q4_K_M)
    w.add_block_count(shape.layers)
    w.add_context_length(shape.ctx)
    w.add_embedding_length(shape.hidden)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(1e-6)
    tokens, types, merges = tiny_vocab()
    pad = shape.vocab - len(tokens)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens + [f"<unused_{i}>" for i in range(pad)])
    w.add_token_types(types + [4] * pad)  # user-defined: never made by merges
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    for name, (rows, cols), qtype in tensor_types(shape):
        if qtype is None:
            w.add_tensor(name, np.ones(cols, dtype=np.float32))  # norms: the identity
        else:
            data = random_blocks(rows, cols, qtype, rng)
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
    finish_gguf(w)
    tmp.replace(path)
    return path


def cached(shape: Shape, folder: Path) -> Path:
    """The random GGUF of ``shape`` in ``folder``, written once."""
    path = folder / f"{shape.name}-random-Q4_K_M.gguf"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        write_random_gguf(path, shape)
    return path


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.random_gguf", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--shape", choices=sorted(SHAPES), required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    path = write_random_gguf(args.out, SHAPES[args.shape])
    print(f"{path}: {path.stat().st_size / 2**30:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
