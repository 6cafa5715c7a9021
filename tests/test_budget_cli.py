"""`localinfer budget` and `localinfer models` on the command line: JSON and table output, the
exit code when a model does not fit, one-line errors, and the listing of cached and catalog
models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_resolve import tiny_hf_repo

from localinfer.cli import main
from localinfer.loading.embedded import embedded_model_path
from tests.saved_configs import CONFIGS

# --- the command line -----------------------------------------------------------------------------


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "budget",
            "smollm2-135m",
            "--ctx",
            "4k",
            "--concurrency",
            "2",
            "--device",
            "8GiB",
            "--json",
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert rc == 0
    for key in (
        "weights_bytes",
        "kv_cache_bytes",
        "overhead_bytes",
        "total_bytes",
        "available_bytes",
        "fits",
        "max_context",
        "max_concurrency",
        "ctx",
        "concurrency",
        "quant",
        "kv_dtype",
        "device",
        "backend",
    ):
        assert key in data
    assert data["ctx"] == 4096 and data["concurrency"] == 2
    assert data["kv_cache_bytes"] == 30 * 2 * 3 * 64 * 2 * 4096 * 2
    assert (
        data["total_bytes"]
        == data["weights_bytes"] + data["kv_cache_bytes"] + data["overhead_bytes"]
    )


def test_cli_table_and_not_fitting_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["budget", "llama3.1-8b", "--device", "24GiB"]) == 0
    out = capsys.readouterr().out
    assert "weights" in out and "KV cache" in out and "fits" in out
    assert (
        main(["budget", "llama3.1-8b", "--ctx", "128k", "--concurrency", "8", "--device", "24GiB"])
        == 3
    )
    assert "does not fit" in capsys.readouterr().out


def test_a_thinking_models_budget_says_its_reasoning_needs_context(
    capsys: pytest.CaptureFixture[str],
) -> None:
    main(["budget", "qwen3-8b", "--ctx", "8k", "--device", "24GiB"])
    out = " ".join(capsys.readouterr().out.split())
    assert "qwen3-8b thinks before it answers" in out and "8,192-token context" in out
    main(["budget", "llama3.1-8b", "--device", "24GiB"])  # a model that does not think
    assert "thinks" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["budget", "lama-3.1-8b"], "unknown model"),
        (["budget", "qwen3-8b", "--ctx", "100000"], "maximum context of 40960"),
        (["budget", "qwen3-8b", "--ctx", "0"], "--ctx"),
        (["budget", "qwen3-8b", "--ctx", "-5"], "--ctx"),
        (["budget", "qwen3-8b", "--concurrency", "0"], "--concurrency"),
        (["budget", "qwen3-8b", "--concurrency", "two"], "--concurrency"),
        (["budget", "qwen3-8b", "--device", "24"], "memory size"),
        (["budget", "qwen3-8b", "--device", "12XB"], "memory size"),
        (["budget", "qwen3-8b", "--device", "tpu"], "unknown device"),
        (["budget", "qwen3-8b", "--quant", "Q9"], "unknown quantization"),
        (["budget", "qwen3-8b", "--kv-dtype", "int3"], "KV cache dtype"),
        (["budget", "qwen3-8b", "--backend", "onnx"], "unknown backend"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_1(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("localinfer: error: ") and err.count("\n") == 1
    assert needle in err


def test_cli_config_json_missing_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from test_resolve import write_safetensors

    config = json.loads((CONFIGS / "llama-3.1-8b-instruct.json").read_text())
    del config["num_hidden_layers"], config["max_position_embeddings"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    write_safetensors(tmp_path / "model.safetensors", {"w": ("BF16", [8, 8])})
    assert main(["budget", str(tmp_path), "--device", "8GiB"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "lacks num_hidden_layers, max_position_embeddings" in err


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def test_models_command_lists_cached_repos(
    hf_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = tiny_hf_repo(hf_cache, "someone/tiny-llama")
    assert main(["models", "--device", "8GiB", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    tiny = rows["someone/tiny-llama"]
    assert tiny["source"] == "hf cache" and tiny["on_disk"] and tiny["fits"]
    assert tiny["quant"] == "bf16"
    assert tiny["size_bytes"] == sum(
        p.stat().st_size for p in (hf_cache / "models--someone--tiny-llama" / "blobs").iterdir()
    )
    assert snapshot.is_dir()


def test_models_command_lists_catalog_and_cache(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "--device", "1GiB", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["smollm2-135m"]["on_disk"] and rows["smollm2-135m"]["fits"]
    assert rows["smollm2-135m"]["size_bytes"] == embedded_model_path().stat().st_size
    assert not rows["qwen3-30b-a3b"]["on_disk"] and rows["qwen3-30b-a3b"]["fits"] is False
    assert main(["models", "--device", "8GiB"]) == 0
    assert "smollm2-135m" in capsys.readouterr().out
