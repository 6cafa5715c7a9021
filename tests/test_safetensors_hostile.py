"""Impossible Hugging Face model files are one-line ModelFileErrors: a safetensors header whose
shape product overflows int64 (or has negative dimensions), not a wrapped byte count that passes
the size check; a BOS/EOS id outside the vocabulary, not an IndexError in a runner. Pad and unk
ids, which localinfer never reads, may lie outside it (llama.cpp runs such files too)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from model_files import TINY_VOCAB_SIZE, write_hf_dir
from tiny import tiny_config, tiny_weights

from localinfer.errors import ModelFileError
from localinfer.loading.loader import load_model
from localinfer.loading.safetensors_file import SafetensorsFile


def _file(path: Path, shape: list[int], nbytes: int) -> Path:
    header = {"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, nbytes]}}
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"\0" * nbytes)
    return path


@pytest.mark.parametrize(
    "shape, nbytes",
    [
        ([2**62, 4], 0),  # 2^64 elements x 4 bytes wraps to 0 in int64
        ([16, 2**60 + 1], 64),  # 2^64 + 16 elements: wraps to 16 elements, 64 bytes
        ([-1, -4], 16),  # negative dimensions whose product looks right
    ],
)
def test_impossible_shapes_are_refused(tmp_path: Path, shape: list[int], nbytes: int) -> None:
    path = _file(tmp_path / "model.safetensors", shape, nbytes)
    with pytest.raises(ModelFileError) as info:
        SafetensorsFile(path)
    assert "'w'" in str(info.value) and "\n" not in str(info.value)


def _hf_dir(tmp_path: Path) -> Path:
    config = tiny_config("llama", vocab_size=TINY_VOCAB_SIZE)
    ws = tiny_weights(config)
    return write_hf_dir(tmp_path / "model", config, {n: ws.get(n) for n in ws.names()})


@pytest.mark.parametrize("key", ["bos_token_id", "eos_token_id"])
def test_special_id_outside_the_vocabulary_is_refused(tmp_path: Path, key: str) -> None:
    root = _hf_dir(tmp_path)
    spec = json.loads((root / "config.json").read_text())
    spec[key] = 10**6
    (root / "config.json").write_text(json.dumps(spec))
    # the tokenizer_config names no BOS token, so config.json's is the one used
    tok_cfg = json.loads((root / "tokenizer_config.json").read_text())
    tok_cfg.pop("bos_token")
    (root / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    with pytest.raises(ModelFileError, match=f"{key} 1000000 is outside the vocabulary"):
        load_model(root)


def test_pad_and_unk_ids_outside_the_vocabulary_load(tmp_path: Path) -> None:
    root = _hf_dir(tmp_path)
    spec = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(
        json.dumps({**spec, "pad_token_id": 10**6, "unk_token_id": -1})
    )
    (root / "generation_config.json").write_text(json.dumps({"pad_token_id": 10**6}))
    tok_cfg = json.loads((root / "tokenizer_config.json").read_text())
    tok_cfg.update(pad_token="<not in the vocabulary>", unk_token="<nor this>")
    (root / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    model = load_model(root)
    assert model.config.bos_token_id == 1 and model.config.eos_token_ids == (2,)
