"""GGUF's Q/K permutation: llama.cpp's converter reorders Q and K rows for its interleaved
RoPE; un-permuted and rotated by halves they give the same attention, down to llama.cpp's own
logits on the embedded model."""

from __future__ import annotations

import numpy as np
import pytest
from llama_reference import reference_llama

from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.gguf_weights import permute_qk, unpermute_qk
from localinfer.loading.loader import load_model

pytestmark = pytest.mark.usefixtures("session_cache")


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
