"""`localinfer budget ORG/REPO[:QUANT]` before any weight is downloaded, against the fake Hub on
127.0.0.1 (tests/hub_server.py): only a GGUF header is read (HTTP range requests), or config.json
plus the safetensors headers; the budget before `pull` equals the budget after it, byte for byte;
what was read is cached per revision and answers offline; bad input is one line."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_budget_files import qwen3_tensors
from test_resolve import write_safetensors

from localinfer.backend_budget import compute_budget
from localinfer.budget import BudgetReport, BudgetRequest
from localinfer.cli import main
from localinfer.errors import LocalinferError
from localinfer.facts.arch import count_params
from localinfer.facts.hf_config import arch_from_hf_config
from localinfer.loading.embedded import embedded_model_path
from tests.hub_server import FakeHub

GGUF_REPO = "someone/Smol-135M-GGUF"
Q4_1 = "Smol-135M-Q4_1.gguf"
PROJECTOR = "mmproj-Smol-135M-F16.gguf"
SPLIT_REPO = "someone/tiny-split-GGUF"
ST_REPO = "someone/tiny-qwen3"
# The figures `pull` leaves unchanged: what the model holds, not where it lies.
SAME = ("params", "quant", "backend", "weights_bytes", "kv_cache_bytes", "compute_bytes")
SAME += ("runtime_bytes", "total_bytes", "max_context", "max_concurrency", "arch")
TINY_QWEN3 = {
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 300,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The files the fake Hub serves, by repo/path."""
    folder = tmp_path_factory.mktemp("hub-files")
    out = {f"{GGUF_REPO}/{Q4_1}": embedded_model_path().read_bytes()}
    out[f"{GGUF_REPO}/{PROJECTOR}"] = _projector(folder / "mmproj.gguf")
    out[f"{GGUF_REPO}/README.md"] = b"# a card\n"
    for name in _split_gguf(folder / "split"):
        out[f"{SPLIT_REPO}/{name.name}"] = name.read_bytes()
    out |= _sharded_safetensors(folder / "st")
    return out


def _projector(path: Path) -> bytes:
    """A small CLIP-shaped projector GGUF (its own architecture, no LM numbers)."""
    from gguf import GGUFWriter
    from gguf_writer import finish_gguf

    writer = GGUFWriter(str(path), "clip")
    writer.add_tensor("v.patch_embd.weight", np.zeros((64, 3, 14, 14), np.float16))
    writer.add_tensor("mm.0.weight", np.zeros((64, 64), np.float32))
    finish_gguf(writer)
    return path.read_bytes()


def _split_gguf(folder: Path) -> list[Path]:
    """A llama-shaped GGUF in two parts as gguf-split writes them (gguf-py's writer splits the
    same way: the metadata in the first part only)."""
    from gguf import GGUFWriter

    folder.mkdir()
    writer = GGUFWriter(str(folder / "tiny-Q8_0.gguf"), "llama", split_max_tensors=3)
    writer.add_block_count(2)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_feed_forward_length(128)
    writer.add_context_length(1024)
    writer.add_token_list([f"t{i}" for i in range(100)])
    writer.add_tensor("token_embd.weight", np.zeros((100, 64), np.float32))
    for layer in range(2):
        writer.add_tensor(f"blk.{layer}.attn_norm.weight", np.ones(64, np.float32))
        writer.add_tensor(f"blk.{layer}.attn_q.weight", np.zeros((64, 64), np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sorted(folder.glob("*.gguf"))


def _sharded_safetensors(folder: Path) -> dict[str, bytes]:
    """A tiny tied Qwen3 in two shards and an index, storing the tied head a second time as
    Qwen3-0.6B's checkpoint does."""
    folder.mkdir()
    arch = arch_from_hf_config(TINY_QWEN3)
    tensors = qwen3_tensors(arch) | {"lm_head.weight": ("BF16", [300, 64])}
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2]}
    shards["model-00002-of-00002.safetensors"] = names[1::2]
    out = {f"{ST_REPO}/config.json": json.dumps(TINY_QWEN3).encode()}
    weight_map = {}
    for shard, held in shards.items():
        write_safetensors(folder / shard, {n: tensors[n] for n in held})
        out[f"{ST_REPO}/{shard}"] = (folder / shard).read_bytes()
        weight_map |= dict.fromkeys(held, shard)
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    out[f"{ST_REPO}/model.safetensors.index.json"] = json.dumps(index).encode()
    out[f"{ST_REPO}/tokenizer.json"] = b"{}"
    return out


@pytest.fixture
def hub(files: dict[str, bytes]) -> Iterator[FakeHub]:
    with FakeHub() as fake:
        for key, data in files.items():
            org, repo, path = key.split("/", 2)
            fake.add_file(f"{org}/{repo}", path, data)
        yield fake


def point_at(monkeypatch: pytest.MonkeyPatch, url: str, offline: bool = False) -> None:
    """huggingface_hub talks to ``url`` (it reads HF_ENDPOINT once, at import)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", url)
    template = url + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)


@pytest.fixture
def online(hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("LOCALINFER_CACHE_DIR", str(tmp_path / "li-cache"))
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    point_at(monkeypatch, hub.url)
    return hub


def budget(model: str, **options: object) -> BudgetReport:
    return compute_budget(BudgetRequest(model, device="8GiB", **options))  # type: ignore[arg-type]


def pull(*args: str) -> None:
    assert main(["pull", *args, "--quiet", "--device", "8GiB"]) == 0


def assert_same(before: BudgetReport, after: BudgetReport) -> None:
    for field in SAME:
        assert getattr(before, field) == getattr(after, field), field


# --- GGUF: the header over range requests ------------------------------------------------------


@pytest.mark.parametrize("backend", ["llamacpp", "torch"])
def test_gguf_budget_before_download_equals_the_one_after(online: FakeHub, backend: str) -> None:
    before = budget(f"{GGUF_REPO}:Q4_1", backend=backend)
    assert before.model_kind == "hub_remote" and before.model_path is None
    if backend == "llamacpp":  # torch dequantizes: params x 32 bits
        assert before.weights_source.startswith(f"GGUF header (Hub: {GGUF_REPO}@")
    assert before.download_bytes == embedded_model_path().stat().st_size
    # Only the header was read: ranged GETs of its first 2 MiB of the 94 MiB file.
    gets = online.file_gets(Q4_1)
    assert gets and all(g.range is not None for g in gets)
    assert online.bytes_sent(Q4_1) == 2 * 2**20
    assert before.mmproj_files == [PROJECTOR] and before.mmproj is None

    pull(f"{GGUF_REPO}:Q4_1")
    after = budget(f"{GGUF_REPO}:Q4_1", backend=backend)
    assert after.model_kind == "gguf" and after.model_path is not None
    assert_same(before, after)
    # The embedded model's own file, budgeted from disk: the same numbers again.
    assert_same(before, budget("smollm2-135m", backend=backend))


def test_gguf_quant_by_option_default_and_file_name(online: FakeHub) -> None:
    by_tag = budget(f"{GGUF_REPO}:q4_1")
    assert budget(GGUF_REPO, quant="Q4_1").weights_bytes == by_tag.weights_bytes
    # No quantization named: Q4_K_M if the repo has one, else its first GGUF (never mmproj).
    assert budget(GGUF_REPO).weights_bytes == by_tag.weights_bytes
    # The header is read once per revision: later budgets ask the Hub for the listing only.
    assert len(online.file_gets(Q4_1)) == 1


def test_split_gguf_parts_are_summed(online: FakeHub, files: dict[str, bytes]) -> None:
    from gguf import GGML_QUANT_SIZES, GGUFReader

    before = budget(f"{SPLIT_REPO}:Q8_0")
    expected = 0  # gguf's own reader over both parts, as an independent count
    for key, data in files.items():
        if key.startswith(SPLIT_REPO):
            path = Path(f"/tmp/{key.replace('/', '_')}")
            path.write_bytes(data)
            for tensor in GGUFReader(path).tensors:
                block, block_bytes = GGML_QUANT_SIZES[tensor.tensor_type]
                expected += int(tensor.n_elements) // block * block_bytes
            path.unlink()
    assert before.weights_bytes == expected == 100 * 64 * 4 + 2 * (64 * 4 + 64 * 64 * 2)
    assert before.arch == "llama"
    pull(f"{SPLIT_REPO}:Q8_0")  # both parts come
    after = budget(f"{SPLIT_REPO}:Q8_0")
    assert after.model_kind == "gguf" and after.model_path.endswith("-00001-of-00002.gguf")
    assert_same(before, after)


def test_vision_projector_is_listed_and_counted_on_request(online: FakeHub) -> None:
    plain = budget(f"{GGUF_REPO}:Q4_1")
    with_projector = budget(f"{GGUF_REPO}:Q4_1", mmproj="")
    projector_bytes = 64 * 3 * 14 * 14 * 2 + 64 * 64 * 4
    assert with_projector.mmproj == PROJECTOR
    assert with_projector.weights_bytes == plain.weights_bytes + projector_bytes
    assert PROJECTOR in with_projector.weights_source
    assert main(["pull", f"{GGUF_REPO}:Q4_1", "--mmproj", "--quiet", "--device", "8GiB"]) == 0
    after = budget(f"{GGUF_REPO}:Q4_1", mmproj="")
    assert after.model_kind == "gguf"
    assert_same(with_projector, after)
    with pytest.raises(LocalinferError, match="has no mmproj-other.gguf; it has mmproj-Smol"):
        budget(f"{GGUF_REPO}:Q4_1", mmproj="mmproj-other.gguf")


# --- safetensors: config.json + the shards' headers ---------------------------------------------


def test_safetensors_budget_before_download_equals_the_one_after(online: FakeHub) -> None:
    before = budget(ST_REPO, ctx=4096)
    arch = arch_from_hf_config(TINY_QWEN3)
    assert before.quant == "bf16" and before.params == count_params(arch)
    assert before.weights_bytes == 2 * count_params(arch)  # the stored tied head is not counted
    assert before.weights_source.startswith(f"safetensors headers (Hub: {ST_REPO}@")
    for shard in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        gets = online.file_gets(shard)
        assert gets and all(g.range and g.range.startswith("bytes=0-") for g in gets)
    pull(ST_REPO)
    after = budget(ST_REPO, ctx=4096)
    assert after.model_kind == "hf_dir" and after.weights_source == "safetensors headers"
    assert_same(before, after)
    # Another quantization of the same weights: params x bits, before and after alike.
    assert budget(ST_REPO, quant="int4").weights_bytes == before.params * 9 // 16


def test_a_repo_with_only_a_config(online: FakeHub) -> None:
    online.add_file("someone/bin-only", "config.json", json.dumps(TINY_QWEN3).encode())
    online.add_file("someone/bin-only", "pytorch_model.bin", b"\0" * 64)
    report = budget("someone/bin-only")
    arch = arch_from_hf_config(TINY_QWEN3)
    assert report.weights_bytes == 2 * count_params(arch)
    assert "someone/bin-only/config.json" in report.weights_source


# --- the metadata cache and offline use ---------------------------------------------------------


def test_cached_metadata_answers_offline(online: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    before = budget(f"{GGUF_REPO}:Q4_1")
    asked = len(online.requests)
    point_at(monkeypatch, online.url, offline=True)
    offline = budget(f"{GGUF_REPO}:Q4_1")
    assert len(online.requests) == asked  # not one request
    assert "cached Hub metadata" in offline.weights_source
    assert_same(before, offline)
    with pytest.raises(LocalinferError, match="metadata of someone/other not cached: "):
        budget("someone/other")
    # A Hub that does not answer: the cache answers, or the error says nothing is cached.
    point_at(monkeypatch, f"http://127.0.0.1:{_closed_port()}")
    assert budget(f"{GGUF_REPO}:Q4_1").weights_bytes == before.weights_bytes
    with pytest.raises(LocalinferError, match="cannot reach .* no metadata of someone/other"):
        budget("someone/other")


def test_a_new_revision_is_read_again(online: FakeHub) -> None:
    first = budget(f"{GGUF_REPO}:Q4_1")
    online.repos[GGUF_REPO].commit = "f" * 40
    second = budget(f"{GGUF_REPO}:Q4_1")
    assert second.weights_source.startswith(f"GGUF header (Hub: {GGUF_REPO}@ffffffffff")
    assert len(online.file_gets(Q4_1)) == 2 and second.weights_bytes == first.weights_bytes


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_pull_budgets_a_repo_outside_the_catalog_first(online: FakeHub) -> None:
    refused = main(["pull", f"{GGUF_REPO}:Q4_1", "--device", "100MiB"])
    assert refused == 3
    assert not online.file_gets("Smol-135M-Q4_1.gguf")[1:]  # the header read only, no download
    assert online.bytes_sent(Q4_1) == 2 * 2**20


# --- the same budget in pull, models, the picker and sessions ---------------------------------


def test_models_lists_hub_models_budgeted_before_without_asking_the_hub(
    online: FakeHub, capsys: pytest.CaptureFixture[str]
) -> None:
    before = budget(f"{GGUF_REPO}:Q4_1")
    budget(ST_REPO)
    asked = len(online.requests)
    assert main(["models", "--device", "8GiB", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert len(online.requests) == asked
    gguf = rows[f"{GGUF_REPO}:Q4_1"]
    assert (gguf["source"], gguf["on_disk"], gguf["fits"]) == ("hub", False, True)
    assert gguf["size_bytes"] == before.download_bytes and gguf["quant"] == "Q4_1"
    assert rows[ST_REPO]["source"] == "hub" and rows[ST_REPO]["quant"] == "bf16"

    pull(f"{GGUF_REPO}:Q4_1")
    capsys.readouterr()  # the pulled file's path
    assert main(["models", "--device", "8GiB", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert f"{GGUF_REPO}:Q4_1" not in rows  # on disk now: the cached repo's row
    assert rows[GGUF_REPO]["source"] == "hf cache" and rows[GGUF_REPO]["on_disk"]


def test_catalog_model_online_reads_the_catalogs_file(
    online: FakeHub, files: dict[str, bytes]
) -> None:
    # The catalog's smollm2-360m Q8_0 file, served with the embedded model's bytes.
    repo, name = "bartowski/SmolLM2-360M-Instruct-GGUF", "SmolLM2-360M-Instruct-Q8_0.gguf"
    online.add_file(repo, name, files[f"{GGUF_REPO}/{Q4_1}"])
    catalog = budget("smollm2-360m", quant="Q8_0")
    assert "params x 8.5 bits" in catalog.weights_source and not online.requests
    remote = budget("smollm2-360m", quant="Q8_0", online=True)
    assert remote.weights_source.startswith(f"GGUF header (Hub: {repo}@")
    assert remote.weights_bytes == budget("smollm2-135m").weights_bytes  # the file's own bytes
    pull("smollm2-360m", "--quant", "Q8_0")
    assert_same(remote, budget("smollm2-360m", quant="Q8_0"))


def test_a_hub_model_not_on_disk_says_how_to_get_it(online: FakeHub) -> None:
    from localinfer.errors import ModelFileError
    from localinfer.session import open_model

    with pytest.raises(ModelFileError, match=f"run `localinfer pull {GGUF_REPO}:Q4_1` first"):
        open_model(f"{GGUF_REPO}:Q4_1")
    assert not online.requests  # resolving never touches the network
