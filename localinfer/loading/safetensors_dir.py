"""A Hugging Face model directory: config.json, *.safetensors (maybe sharded), tokenizer files.

Weights keep their Hugging Face names; multimodal Gemma 3 checkpoints have their text model's
names brought to the plain ``model.*`` form and their vision tensors left out.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from localinfer.errors import ModelFileError, UnsupportedModelError
from localinfer.facts.hf_config import read_json_object
from localinfer.loading.chat_template import ChatTemplate
from localinfer.loading.hf_config import config_from_hf
from localinfer.loading.model import LoadedModel
from localinfer.loading.safetensors_file import SafetensorsFile
from localinfer.loading.tokenizer import Tokenizer

INDEX_FILE = "model.safetensors.index.json"
# Checkpoint name prefixes -> the plain causal-LM names; None drops the tensor.
_PREFIXES: tuple[tuple[str, str | None], ...] = (
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
    ("model.language_model.", "model."),
    ("vision_tower.", None),
    ("model.vision_tower.", None),
    ("multi_modal_projector.", None),
    ("model.multi_modal_projector.", None),
)


def _hf_name(name: str) -> str | None:
    for prefix, replacement in _PREFIXES:
        if name.startswith(prefix):
            return None if replacement is None else replacement + name[len(prefix) :]
    return name


class SafetensorsWeights:
    """WeightSource over the .safetensors files of one directory."""

    def __init__(self, files: list[SafetensorsFile], drop_lm_head: bool = False) -> None:
        self.files = files
        self._where: dict[str, tuple[SafetensorsFile, str]] = {}
        for f in files:
            for stored in f.tensors:
                name = _hf_name(stored)
                if name is None or (drop_lm_head and name == "lm_head.weight"):
                    continue
                if name in self._where:
                    raise ModelFileError(f.path, f"tensor '{name}' appears in two files")
                self._where[name] = (f, stored)

    def names(self) -> list[str]:
        return list(self._where)

    def get(self, name: str) -> np.ndarray:
        f, stored = self._where[name]
        return f.get(stored)

    def quant_type(self, name: str) -> str:
        f, stored = self._where[name]
        return f.tensors[stored].dtype

    def shape(self, name: str) -> tuple[int, ...]:
        f, stored = self._where[name]
        return f.tensors[stored].shape

    def nbytes(self) -> int:
        return sum(f.tensors[s].nbytes for f, s in self._where.values())

    def dominant_type(self) -> str:
        totals: dict[str, int] = {}
        for f, s in self._where.values():
            info = f.tensors[s]
            totals[info.dtype] = totals.get(info.dtype, 0) + info.nbytes
        return max(totals, key=totals.__getitem__) if totals else "F32"


def weight_files(root: Path) -> list[Path]:
    """The .safetensors files of a model directory: the shards its index names, else all."""
    index = root / INDEX_FILE
    if index.is_file():
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelFileError(index, "malformed index: no weight_map")
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not (root / n).is_file()]
        if missing:
            raise ModelFileError(root, f"missing weight shard(s): {', '.join(missing[:3])}")
        return [root / n for n in names]
    files = sorted(root.glob("*.safetensors"))
    if not files:
        found = (
            "only PyTorch .bin weights, which are not supported"
            if any(root.glob("*.bin"))
            else "no .safetensors weights"
        )
        raise ModelFileError(root, found)
    return files


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json writes special tokens as strings or AddedToken dicts."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _chat_template_source(root: Path, tok_cfg: dict[str, Any]) -> str | None:
    jinja = root / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    src = tok_cfg.get("chat_template")
    if isinstance(src, list):  # named templates: take "default"
        named = {t.get("name"): t.get("template") for t in src if isinstance(t, dict)}
        src = named.get("default") or next(iter(named.values()), None)
    if src is None:
        chat_json = read_json_object(root / "chat_template.json", required=False)
        src = chat_json.get("chat_template")
    return src if isinstance(src, str) else None


def _check_special_ids(root: Path, tokenizer: Tokenizer, vocab_size: int) -> None:
    """BOS/EOS ids index the embedding and the vocabulary: one past either is a broken
    config (an IndexError deep in a runner otherwise)."""
    limit = min(vocab_size, tokenizer.vocab_size)
    named = [("bos_token_id", tokenizer.bos_id), *(("eos_token_id", i) for i in tokenizer.eos_ids)]
    for key, token_id in named:
        if token_id is not None and not 0 <= token_id < limit:
            raise ModelFileError(
                root, f"{key} {token_id} is outside the vocabulary (0..{limit - 1})"
            )


def load_safetensors_dir(root: Path, name: str | None = None) -> LoadedModel:
    root = Path(root)
    if not root.is_dir():
        raise ModelFileError(root, "not a directory")
    cfg = read_json_object(root / "config.json")
    generation = read_json_object(root / "generation_config.json", required=False)
    files = [SafetensorsFile(p) for p in weight_files(root)]
    names = {n for f in files for n in (_hf_name(s) for s in f.tensors) if n is not None}
    config = config_from_hf(cfg, root, weight_names=names, generation=generation)
    weights = SafetensorsWeights(files, drop_lm_head=config.tied_embeddings)

    tok_cfg = read_json_object(root / "tokenizer_config.json", required=False)
    tok_json = root / "tokenizer.json"
    if not tok_json.is_file():
        hint = (
            " (only a SentencePiece tokenizer.model, which needs conversion)"
            if (root / "tokenizer.model").is_file()
            else ""
        )
        raise UnsupportedModelError(f"{root}: missing tokenizer.json{hint}")
    bos_text = _token_text(tok_cfg.get("bos_token"))
    eos_text = _token_text(tok_cfg.get("eos_token"))
    tokenizer = Tokenizer.from_json_file(
        tok_json,
        bos_token=bos_text,
        eos_tokens=[eos_text] if eos_text else [],
        eos_ids=config.eos_token_ids,
        add_bos=bool(tok_cfg["add_bos_token"]) if "add_bos_token" in tok_cfg else None,
        add_eos=bool(tok_cfg.get("add_eos_token", False)),
    )
    if tokenizer.bos_id is None and config.bos_token_id is not None:
        tokenizer.bos_id = config.bos_token_id
    if not config.eos_token_ids and tokenizer.eos_ids:
        config = dataclasses.replace(config, eos_token_ids=tokenizer.eos_ids)
    _check_special_ids(root, tokenizer, config.vocab_size)
    source = _chat_template_source(root, tok_cfg)
    template = ChatTemplate.for_model(source, tokenizer, bos_text or "", eos_text or "", root)
    return LoadedModel(
        name=name or root.name,
        path=root,
        format="safetensors",
        config=config,
        tokenizer=tokenizer,
        chat_template=template,
        weights=weights,
        file_quant=weights.dominant_type(),
    )
