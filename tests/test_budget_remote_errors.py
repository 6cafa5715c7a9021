# ruff: noqa: F811 - pytest fixtures imported from test_budget_remote
"""Bad input to `localinfer budget ORG/REPO[:QUANT]` is one line (issue 22's list): a repo that
does not exist, a gated repo without HF_TOKEN (and how to log in), a quantization the repo does
not have (and the ones it has), an architecture the budget does not know (what is missing, or what
it counts), no network and nothing cached. Against the fake Hub of tests/test_budget_remote.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_budget_remote import (  # noqa: F401 (files, hub, online: fixtures)
    GGUF_REPO,
    TINY_QWEN3,
    _closed_port,
    budget,
    files,
    hub,
    online,
    point_at,
)

from localinfer.cli import main
from localinfer.facts.arch import count_params
from localinfer.facts.hf_config import arch_from_hf_config
from tests.hub_server import GATE_TOKEN, FakeHub


@pytest.mark.parametrize(
    ("model", "words"),
    [
        ("nobody/missing", "nobody/missing is not on the Hub"),
        (f"{GGUF_REPO}:IQ2_XS", "has no IQ2_XS GGUF; it has Q4_1"),
        ("someone/gated-model", "is gated: accept its terms at http://127.0.0.1"),
        ("someone/gated-model", "then log in with `hf auth login` or set HF_TOKEN"),
        ("someone/broken-config", "config.json lacks num_hidden_layers"),
        # Architectures the budget does not know: what is missing, or what it counts.
        ("someone/phi-config", "counts the parameters of llama, "),
        ("someone/phi-config", "not of model_type 'phi'; budget its GGUF or safetensors files"),
        ("someone/ssm-GGUF:F32", "missing metadata keys 'mamba.embedding_length', 'mamba.att"),
    ],
)
def test_bad_input_is_one_line(
    online: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str], model: str, words: str
) -> None:
    online.add_file("someone/gated-model", "config.json", json.dumps(TINY_QWEN3).encode())
    online.gate("someone/gated-model")
    broken = {k: v for k, v in TINY_QWEN3.items() if k != "num_hidden_layers"}
    online.add_file("someone/broken-config", "config.json", json.dumps(broken).encode())
    phi = json.dumps({**TINY_QWEN3, "model_type": "phi"}).encode()
    online.add_file("someone/phi-config", "config.json", phi)
    online.add_file("someone/ssm-GGUF", "ssm-F32.gguf", _state_space_gguf(tmp_path / "ssm.gguf"))
    assert main(["budget", model, "--device", "8GiB"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("localinfer: error: ") and err.count("\n") == 1, err
    assert words in err


def _state_space_gguf(path: Path) -> bytes:
    """A GGUF of an architecture without attention (mamba: ssm.* keys, no head counts)."""
    from gguf import GGUFWriter
    from gguf_writer import finish_gguf

    writer = GGUFWriter(str(path), "mamba")
    writer.add_block_count(2)
    writer.add_uint32("mamba.ssm.state_size", 16)
    writer.add_tensor("token_embd.weight", np.zeros((100, 64), np.float32))
    for layer in range(2):
        writer.add_tensor(f"blk.{layer}.ssm_in.weight", np.zeros((128, 64), np.float32))
    finish_gguf(writer)
    return path.read_bytes()


def test_no_network_and_nothing_cached_is_one_line(
    online: FakeHub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    point_at(monkeypatch, online.url, offline=True)
    assert main(["budget", f"{GGUF_REPO}:Q4_1", "--device", "8GiB"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("localinfer: error: ") and err.count("\n") == 1, err
    assert f"metadata of {GGUF_REPO} not cached" in err
    point_at(monkeypatch, f"http://127.0.0.1:{_closed_port()}")
    assert main(["budget", f"{GGUF_REPO}:Q4_1", "--device", "8GiB"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("localinfer: error: ") and err.count("\n") == 1, err
    assert "cannot reach the Hugging Face Hub at http://127.0.0.1:" in err
    assert f"no metadata of {GGUF_REPO} is cached" in err
    assert not online.requests


def test_a_gated_repo_with_a_token(online: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    online.add_file("someone/gated-model", "config.json", json.dumps(TINY_QWEN3).encode())
    online.gate("someone/gated-model")
    monkeypatch.setenv("HF_TOKEN", GATE_TOKEN)
    assert budget("someone/gated-model").params == count_params(arch_from_hf_config(TINY_QWEN3))
