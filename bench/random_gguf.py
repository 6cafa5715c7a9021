"""Real-shape random GGUFs: the 8B shapes laid out directly as llama.cpp's Q4_K_M, and the small
shapes people run written as F16 and quantized to Q4_K_M by `localinfer quantize`, offline.

A decode step's speed is the bytes it reads, so a model with Llama-3.1-8B's or Qwen3-8B's shapes,
block types and vocabulary measures what the real one would, with random weights and no download
(scripts/gpu-check runs them on llama.cpp CUDA and torch CUDA). The blocks are random bytes with
small fixed scales (each block's f16 ``d``/``dmin`` set, so every weight stays within about 0.1 and
activations stay finite); the types follow llama.cpp's Q4_K_M recipe: Q4_K everywhere, Q6_K for
the LM head and for ``attn_v`` / ``ffn_down`` in the first and last eighth of the layers and every
third one between (llama_tensor_get_type's use_more_bits). The tokenizer is the tests' byte-level
BPE padded with unused tokens to the real vocabulary size.

SMALL_SHAPES (Llama-3.2-1B, Qwen3-1.7B, Gemma-3-1B, and a llama at Gemma 3 270M's size: tied
embeddings, 128k-262k vocabularies, Gemma's sliding window) go the way a real download was made:
F16 weights (normal, std 0.02) quantized by the project's own quantizer, so llama.cpp's recipe
picks every type, fallbacks for rows that are no multiple of 256 included (Gemma's 1152).
:func:`cached_q4_k_m` keeps the result in the user's cache (~1 GiB each; never in the repository).

    python -m bench.random_gguf --shape qwen3-8b --out /tmp/qwen3-8b-random-Q4_K_M.gguf
    python -m bench.random_gguf --shape gemma3-1b --f16 --out /tmp/gemma3-1b-random-F16.gguf
    python -m bench.random_gguf --shape gemma3-1b      # the cached Q4_K_M file; prints its path
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from tests.model_files import CHATML, finish_gguf, tiny_vocab

Q4_K = gguf.GGMLQuantizationType.Q4_K
Q6_K = gguf.GGMLQuantizationType.Q6_K
F16 = gguf.GGMLQuantizationType.F16
# Byte offsets of the f16 scales in each block type's 144 / 210 bytes (ggml-common.h).
F16_FIELDS = {Q4_K: (0, 2), Q6_K: (208,)}
SCALE = 1e-4  # every block's d (and dmin): weights of at most ~0.1
MOSTLY_Q4_K_M = 15  # llama_ftype
MOSTLY_F16 = 1
F16_STD = 0.02  # the usual initialisation: logits and activations stay finite in every layer


@dataclass(frozen=True, slots=True)
class Shape:
    name: str
    arch: str  # GGUF architecture: llama | qwen3 | gemma3 (its extra norms come with it)
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    ctx: int
    rope_theta: float
    qk_norm: bool = False  # qwen3's and gemma3's per-head q/k RMSNorm
    tied: bool = False  # the LM head is token_embd (no output.weight)
    sliding_window: int | None = None  # gemma3: every layer but each sixth attends this far

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
# Written as F16 and quantized by `localinfer quantize` (cached_q4_k_m). The configs of the
# published models; Llama 3.2's RoPE scaling factors are left out (the same work per token).
SMALL_SHAPES = {
    "llama3.2-1b": Shape("llama3.2-1b", "llama", 16, 2048, 8192, 32, 8, 64, 128256, 131072, 5e5,
                         tied=True),
    "qwen3-1.7b": Shape("qwen3-1.7b", "qwen3", 28, 2048, 6144, 16, 8, 128, 151936, 40960, 1e6,
                        qk_norm=True, tied=True),
    "gemma3-1b": Shape("gemma3-1b", "gemma3", 26, 1152, 6912, 4, 1, 256, 262144, 32768, 1e6,
                       qk_norm=True, tied=True, sliding_window=512),
    # Gemma 3 270M's size and 262k vocabulary as a llama, which every runner runs (torch and MLX
    # do not run gemma3): the engine's per-step cost at that vocabulary on each of them.
    "llama-262k": Shape("llama-262k", "llama", 18, 640, 2048, 10, 2, 64, 262144, 32768, 1e6,
                        tied=True),
}  # fmt: skip
ALL_SHAPES = {**SHAPES, **SMALL_SHAPES}


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
    head = Q6_K  # the LM head's type; token_embd's too when it is the head
    out: list[Entry] = [("token_embd.weight", (shape.vocab, h), head if shape.tied else Q4_K)]
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
        if shape.arch == "gemma3":  # norms after attention and after the feed-forward
            out += [(f"blk.{i}.post_attention_norm.weight", (1, h), None)]
            out += [(f"blk.{i}.post_ffw_norm.weight", (1, h), None)]
    out += [("output_norm.weight", (1, h), None)]
    if not shape.tied:
        out += [("output.weight", (shape.vocab, h), head)]
    return out


def write_random_gguf(path: Path, shape: Shape, seed: int = 0) -> Path:
    """Write ``shape`` as a random Q4_K_M GGUF at ``path`` (made in a temporary file first)."""
    rng = np.random.default_rng(seed)
    tmp = path.with_name(path.name + ".part")
    w = _header(tmp, shape, MOSTLY_Q4_K_M)
    for name, (rows, cols), qtype in tensor_types(shape):
        if qtype is None:
            w.add_tensor(name, np.ones(cols, dtype=np.float32))  # norms: the identity
        else:
            data = random_blocks(rows, cols, qtype, rng)
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
    finish_gguf(w)
    tmp.replace(path)
    return path


def write_f16_gguf(path: Path, shape: Shape, seed: int = 0) -> Path:
    """Write ``shape`` with random F16 matrices (normal, std F16_STD) and F32 norms (ones) at
    ``path``, one tensor in memory at a time (a 1B model's F16 file is 2-4 GiB)."""
    rng = np.random.default_rng(seed)
    tmp = path.with_name(path.name + ".part")
    w = _header(tmp, shape, MOSTLY_F16)
    entries = tensor_types(shape)
    for name, (rows, cols), qtype in entries:
        if qtype is None:
            w.add_tensor_info(name, (cols,), np.dtype(np.float32), cols * 4)
        else:
            w.add_tensor_info(name, (rows, cols), np.dtype(np.float16), rows * cols * 2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _, (rows, cols), qtype in entries:
        if qtype is None:
            w.write_tensor_data(np.ones(cols, dtype=np.float32))
        else:
            matrix = rng.standard_normal((rows, cols), dtype=np.float32)
            matrix *= F16_STD
            w.write_tensor_data(matrix.astype(np.float16))
            del matrix
    w.close()
    tmp.replace(path)
    return path


def _header(path: Path, shape: Shape, file_type: int) -> gguf.GGUFWriter:
    """A writer at ``path`` holding ``shape``'s metadata and tokenizer, no tensors yet."""
    w = gguf.GGUFWriter(str(path), arch=shape.arch)
    w.add_name(f"random {shape.name}")
    w.add_file_type(file_type)
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
    if shape.sliding_window is not None:
        w.add_sliding_window(shape.sliding_window)  # llama.cpp: then every sixth layer is global
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
    return w


def cached(shape: Shape, folder: Path) -> Path:
    """The random GGUF of ``shape`` in ``folder``, written once."""
    path = folder / f"{shape.name}-random-Q4_K_M.gguf"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        write_random_gguf(path, shape)
    return path


def quantize_q4_k_m(source: Path, out: Path) -> Path:
    """``localinfer quantize SOURCE --to q4_k_m -o OUT``, as a user would run it."""
    command = [sys.executable, "-m", "localinfer", "quantize", str(source), "--to", "q4_k_m",
               "-o", str(out)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not out.is_file():
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-10:])
        raise RuntimeError(f"localinfer quantize failed (exit {done.returncode}):\n{tail}")
    return out


def q4_k_m_name(shape: Shape, seed: int = 0) -> str:
    """The cached file's name: the shape's fields and the seed in its key, so a changed shape is
    written anew instead of read stale."""
    key = hashlib.sha256(f"{shape!r} {F16_STD} {seed}".encode()).hexdigest()[:8]
    return f"{shape.name}-random-{key}-Q4_K_M.gguf"


def cached_q4_k_m(shape: Shape | str, folder: Path | None = None, seed: int = 0) -> Path:
    """The Q4_K_M file of ``shape`` (a Shape or an ALL_SHAPES name): written as F16, quantized
    by `localinfer quantize`, kept in ``folder`` (default: the user's cache, random-gguf/); the
    F16 file is deleted once quantized. One writer at a time per file (a lock beside it)."""
    from bench.llamacpp_source import dev_cache, locked

    shape = ALL_SHAPES[shape] if isinstance(shape, str) else shape
    folder = folder or dev_cache() / "random-gguf"
    path = folder / q4_k_m_name(shape, seed)
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    with locked(folder / f"{path.name}.lock"):
        if not path.is_file():  # not written by the process that held the lock
            f16 = path.with_name(path.name.replace("-Q4_K_M.gguf", "-F16.gguf"))
            try:
                quantize_q4_k_m(write_f16_gguf(f16, shape, seed), path)
            finally:
                f16.unlink(missing_ok=True)
    return path


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.random_gguf", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--shape", choices=sorted(ALL_SHAPES), required=True)
    p.add_argument("--out", type=Path, help="write here (default: the cached Q4_K_M file)")
    p.add_argument("--f16", action="store_true", help="with --out: F16 weights, not Q4_K_M")
    args = p.parse_args()
    shape = ALL_SHAPES[args.shape]
    if args.out is None:
        path = cached_q4_k_m(shape)
    elif args.f16:
        path = write_f16_gguf(args.out, shape)
    else:
        path = write_random_gguf(args.out, shape)
    print(f"{path}: {path.stat().st_size / 2**30:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
