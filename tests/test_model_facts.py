"""One reader of model facts: the budget's ArchSpec and loading's ModelConfig are built from the
same reading of a file (localinfer/facts), so they agree on every number both hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from model_files import tiny_checkpoint, write_gguf, write_hf_dir

from localinfer.budget.file_headers import read_gguf_header, read_safetensors_headers
from localinfer.facts.arch import ArchSpec
from localinfer.facts.hf_config import arch_from_hf_config, read_json_object
from localinfer.loading.embedded import embedded_model_path
from localinfer.loading.hf_config import config_from_hf
from localinfer.loading.loader import load_model
from localinfer.loading.model_config import ModelConfig
from tests.saved_configs import CONFIGS

SHARED = (
    "n_layers",
    "hidden_size",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "ffn_size",
    "vocab_size",
    "max_ctx",
    "tied_embeddings",
    "qk_norm",
    "attention_bias",
    "sliding_window",
)


def assert_agree(spec: ArchSpec, config: ModelConfig) -> None:
    for name in SHARED:
        assert getattr(spec, name) == getattr(config, name), name
    sliding = [spec.is_sliding(i) for i in range(config.n_layers)]
    assert sliding == [i in config.sliding_layers for i in range(config.n_layers)]


def test_the_embedded_gguf() -> None:
    path = embedded_model_path()
    header = read_gguf_header(path)
    assert header.arch is not None
    assert_agree(header.arch, load_model(path).config)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_tiny_gguf(tmp_path: Path, arch: str) -> None:
    config, weights = tiny_checkpoint(arch)
    path = write_gguf(tmp_path / f"{arch}.gguf", config, weights)
    header = read_gguf_header(path)
    assert header.arch is not None
    assert_agree(header.arch, load_model(path).config)


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3", "gemma3"])
def test_tiny_safetensors_folder(tmp_path: Path, arch: str) -> None:
    config, weights = tiny_checkpoint(arch)
    root = write_hf_dir(tmp_path / arch, config, weights)
    spec = arch_from_hf_config(read_json_object(root / "config.json"))
    assert_agree(spec, load_model(root).config)
    assert read_safetensors_headers(root).params == sum(w.size for w in weights.values())


@pytest.mark.parametrize(
    "fixture",
    [
        "llama-3.1-8b-instruct.json",
        "mistral-7b-instruct-v0.3.json",
        "qwen3-8b.json",
        "gemma-3-270m-it.json",
        "gemma-3-4b-it.json",  # multimodal: a five-key text_config, transformers' defaults fill it
    ],
)
def test_published_configs(fixture: str) -> None:
    config = json.loads((CONFIGS / fixture).read_text())
    assert_agree(arch_from_hf_config(config, fixture), config_from_hf(config, CONFIGS))
