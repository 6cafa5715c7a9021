"""Hugging Face directories: config.json -> ModelConfig, safetensors weights (bf16, shards),
tokenizer + chat template, and clear errors for what is missing or broken."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from model_files import (
    TINY_VOCAB_SIZE,
    bf16_round,
    hf_config_dict,
    tiny_checkpoint,
    write_hf_dir,
    write_safetensors,
)
from tiny import tiny_config

from localinfer.errors import ModelFileError, UnsupportedModelError
from localinfer.loading.hf_config import config_from_hf
from localinfer.loading.loader import load_model
from localinfer.loading.model_config import RopeScaling
from localinfer.loading.safetensors_file import SafetensorsFile

pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3", "gemma3"])
def test_tiny_directory_round_trip(tmp_path, arch):
    config, weights = tiny_checkpoint(arch)
    model = load_model(write_hf_dir(tmp_path / arch, config, weights))
    assert model.format == "safetensors" and model.name == arch
    assert model.config == config
    assert sorted(model.weights.names()) == sorted(weights)
    for name, w in weights.items():
        np.testing.assert_array_equal(model.weights.get(name), w)
    assert model.file_quant == "F32"
    assert model.weights.nbytes() == sum(w.nbytes for w in weights.values())


def test_bf16_weights_widen_exactly(tmp_path):
    config, weights = tiny_checkpoint("qwen2")
    model = load_model(write_hf_dir(tmp_path / "m", config, weights, dtype="BF16"))
    assert model.file_quant == "BF16"
    name = "model.layers.1.self_attn.q_proj.bias"
    assert model.weights.quant_type(name) == "BF16"
    got = model.weights.get(name)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, bf16_round(weights[name]))
    np.testing.assert_allclose(got, weights[name], rtol=1e-2)


def test_sharded_directory(tmp_path):
    config, weights = tiny_checkpoint("llama")
    root = write_hf_dir(tmp_path / "m", config, weights, shards=3)
    assert len(list(root.glob("*.safetensors"))) == 3
    model = load_model(root)
    assert sorted(model.weights.names()) == sorted(weights)
    np.testing.assert_array_equal(
        model.weights.get("model.norm.weight"), weights["model.norm.weight"]
    )


def test_tokenizer_and_template_from_directory(tmp_path):
    config, weights = tiny_checkpoint("llama")
    model = load_model(write_hf_dir(tmp_path / "m", config, weights))
    tok = model.tokenizer
    assert tok.vocab_size == TINY_VOCAB_SIZE
    assert tok.bos_id == 1 and 2 in tok.eos_ids
    prompt = model.chat_template.render([{"role": "user", "content": "hi"}])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(prompt)
    assert ids.count(1) == 2 and ids.count(2) == 1
    assert model.chat_template.eos_token == "<|im_end|>"


def test_chat_template_jinja_file_wins(tmp_path):
    config, weights = tiny_checkpoint("llama")
    root = write_hf_dir(tmp_path / "m", config, weights)
    (root / "chat_template.jinja").write_text("{{ messages[0].content }}!")
    assert load_model(root).chat_template.render([{"role": "user", "content": "x"}]) == "x!"


def test_missing_template_falls_back_to_chatml(tmp_path):
    config, weights = tiny_checkpoint("llama")
    root = write_hf_dir(tmp_path / "m", config, weights, chat_template=None)
    out = load_model(root).chat_template.render([{"role": "user", "content": "x"}])
    assert out == "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"


def test_config_details():
    path = Path("config.json")
    base = hf_config_dict(tiny_config("llama"))
    scaled = config_from_hf(
        {
            **base,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 32.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        },
        path,
    )
    assert scaled.rope_scaling == RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)
    qwen = config_from_hf(
        {
            **hf_config_dict(tiny_config("qwen2")),
            "sliding_window": 4096,
            "use_sliding_window": False,
        },
        path,
    )
    assert qwen.sliding_window is None and qwen.attention_bias
    yarn = config_from_hf(
        {
            **base,
            "max_position_embeddings": 131072,
            "rope_scaling": {"type": "yarn", "original_max_position_embeddings": 32768},
        },
        path,
    )
    assert yarn.max_ctx == 32768 and yarn.rope_scaling is None
    gemma = config_from_hf({**base, "model_type": "gemma3_text", "sliding_window": 512}, path)
    n = gemma.n_layers
    assert gemma.sliding_layers == tuple(i for i in range(n) if (i + 1) % 6)
    # transformers' defaults when config.json is silent: Gemma ties, Llama does not.
    silent = {k: v for k, v in base.items() if k != "tie_word_embeddings"}
    assert config_from_hf({**silent, "model_type": "gemma3_text"}, path).tied_embeddings
    assert not config_from_hf(silent, path).tied_embeddings
    generation = {"eos_token_id": [7, 2]}
    assert config_from_hf(base, path, generation=generation).eos_token_ids == (7, 2)


def test_weights_without_lm_head_mean_tied(tmp_path):
    config, weights = tiny_checkpoint("qwen2")
    assert not config.tied_embeddings
    weights.pop("lm_head.weight")
    model = load_model(write_hf_dir(tmp_path / "m", config, weights))
    assert model.config.tied_embeddings
    assert "lm_head.weight" not in model.weights.names()


# -- errors ----------------------------------------------------------------------------------


@pytest.fixture
def tiny_dir(tmp_path) -> Path:
    config, weights = tiny_checkpoint("llama")
    return write_hf_dir(tmp_path / "m", config, weights)


def _file_error(path: Path, *words: str) -> ModelFileError:
    with pytest.raises(ModelFileError) as info:
        load_model(path)
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    assert "\n" not in str(info.value)
    return info.value


def test_missing_config(tiny_dir):
    (tiny_dir / "config.json").unlink()
    _file_error(tiny_dir, "config.json")


def test_malformed_config(tiny_dir):
    (tiny_dir / "config.json").write_text("{ nope")
    _file_error(tiny_dir, "config.json", "malformed JSON")


def test_config_missing_a_number(tiny_dir):
    cfg = json.loads((tiny_dir / "config.json").read_text())
    del cfg["hidden_size"]
    (tiny_dir / "config.json").write_text(json.dumps(cfg))
    _file_error(tiny_dir, "hidden_size")


def test_unsupported_model_type(tiny_dir):
    cfg = json.loads((tiny_dir / "config.json").read_text())
    (tiny_dir / "config.json").write_text(json.dumps({**cfg, "model_type": "mamba"}))
    with pytest.raises(UnsupportedModelError) as info:
        load_model(tiny_dir)
    assert "mamba" in str(info.value) and "qwen2" in str(info.value)


def test_missing_weights(tiny_dir):
    (tiny_dir / "model.safetensors").unlink()
    _file_error(tiny_dir, "no .safetensors")


def test_truncated_safetensors(tiny_dir):
    path = tiny_dir / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    _file_error(tiny_dir, "model.safetensors", "truncated")
    path.write_bytes(data[:5])
    _file_error(tiny_dir, "truncated")


def test_garbage_safetensors(tiny_dir):
    (tiny_dir / "model.safetensors").write_bytes(
        b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!"
    )
    _file_error(tiny_dir, "malformed safetensors header")


def test_missing_shard(tmp_path):
    config, weights = tiny_checkpoint("llama")
    root = write_hf_dir(tmp_path / "m", config, weights, shards=2)
    next(root.glob("model-00002-*.safetensors")).unlink()
    _file_error(root, "missing weight shard")


def test_missing_tokenizer(tiny_dir):
    (tiny_dir / "tokenizer.json").unlink()
    with pytest.raises(UnsupportedModelError, match="tokenizer.json"):
        load_model(tiny_dir)


def test_unreadable_dtype_is_reported_on_use(tmp_path):
    path = write_safetensors(tmp_path / "x.safetensors", {"a": np.zeros(4, np.float32)})
    raw = bytearray(path.read_bytes())
    start = raw.index(b'"F32"')
    raw[start : start + 5] = b'"F8X"'
    path.write_bytes(bytes(raw))
    f = SafetensorsFile(path)
    with pytest.raises(ModelFileError, match="F8X"):
        f.get("a")


def test_loader_rejects_other_files(tmp_path):
    p = tmp_path / "weights.bin"
    p.write_bytes(b"\0" * 64)
    with pytest.raises(UnsupportedModelError, match="not a GGUF"):
        load_model(p)
    with pytest.raises(ModelFileError, match="no such"):
        load_model(tmp_path / "absent")
