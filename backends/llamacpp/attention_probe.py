"""A tiny model with a real model's attention heads, for timing llama.cpp's attention kernels
(attention_calibrate.py) without loading the real model.

Whether llama.cpp's fused (flash) attention kernel beats its plain one on a CPU depends on the
heads: the fused kernel walks the cached cells one at a time per query head, so its fixed cost
per cell weighs most where heads are many and narrow (SmolLM2: 9 heads of 64), while with few wide
heads (Gemma 3 270M: 4 heads of 256) it is as fast as the plain matrix products at every depth
(docs/measurements.md, "llama.cpp flash attention on the CPU"). Timing the real model would cost
seconds to minutes for a large one; what differs between the two settings is only attention, so
the probe keeps the heads (count, KV heads, head size) and shrinks the rest: PROBE_LAYERS
layers over a residual stream of PROBE_EMBD (the projections map it to and from the heads' full
width, as llama.cpp allows), an MLP of PROBE_FFN, a vocabulary of PROBE_VOCAB ids and no
tokenizer (llama.cpp's "none" vocabulary; the calibration feeds ids). So nearly all of a probe's
forward is attention, and a calibration takes a second or a few. Written once per head shape
into the cache.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from localinfer.facts.arch import AttentionHeads

PROBE_LAYERS = 4
PROBE_EMBD = 64
PROBE_FFN = 64
PROBE_VOCAB = 256
PROBE_CTX = 4096
WEIGHT_STD = 0.02  # small random weights: finite activations (the values do not change the work)


@dataclass(frozen=True, slots=True)
class AttentionShape:
    """The heads that decide which attention kernel is faster (module doc)."""

    n_heads: int
    n_kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        if min(self.n_heads, self.n_kv_heads, self.head_dim) < 1:
            raise ValueError(f"an attention shape needs positive sizes, got {self}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{self.n_heads} query heads do not share {self.n_kv_heads} KV heads")

    @classmethod
    def of(cls, heads: AttentionHeads) -> AttentionShape:
        """From anything that names its heads (a ModelConfig, an ArchSpec)."""
        return cls(int(heads.n_heads), int(heads.n_kv_heads), int(heads.head_dim))

    @property
    def key(self) -> str:
        return f"{self.n_heads}x{self.n_kv_heads}x{self.head_dim}"


def probe_path(folder: Path, shape: AttentionShape) -> Path:
    """The probe model of ``shape`` in ``folder``, written there first if missing (a temporary
    name renamed into place, so a reader never sees half a file)."""
    path = folder / f"attention-probe-{shape.key}.gguf"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.part")
        write_probe(tmp, shape)
        os.replace(tmp, path)
    return path


def write_probe(path: Path, shape: AttentionShape) -> None:
    """A llama-architecture GGUF with ``shape``'s heads, F16 random weights (module doc)."""
    width, embd = shape.n_heads * shape.head_dim, PROBE_EMBD
    kv_width = shape.n_kv_heads * shape.head_dim
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_name(f"attention probe {shape.key}")
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
    w.add_block_count(PROBE_LAYERS)
    w.add_context_length(PROBE_CTX)
    w.add_embedding_length(embd)
    w.add_feed_forward_length(PROBE_FFN)
    w.add_head_count(shape.n_heads)
    w.add_head_count_kv(shape.n_kv_heads)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("none")
    w.add_vocab_size(PROBE_VOCAB)
    rng = np.random.default_rng(0)

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * WEIGHT_STD).astype(np.float16)

    ones = np.ones(embd, dtype=np.float32)
    w.add_tensor("token_embd.weight", matrix(PROBE_VOCAB, embd))
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", matrix(PROBE_VOCAB, embd))
    for i in range(PROBE_LAYERS):
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        w.add_tensor(f"blk.{i}.attn_q.weight", matrix(width, embd))
        w.add_tensor(f"blk.{i}.attn_k.weight", matrix(kv_width, embd))
        w.add_tensor(f"blk.{i}.attn_v.weight", matrix(kv_width, embd))
        w.add_tensor(f"blk.{i}.attn_output.weight", matrix(embd, width))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        w.add_tensor(f"blk.{i}.ffn_gate.weight", matrix(PROBE_FFN, embd))
        w.add_tensor(f"blk.{i}.ffn_up.weight", matrix(PROBE_FFN, embd))
        w.add_tensor(f"blk.{i}.ffn_down.weight", matrix(embd, PROBE_FFN))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
