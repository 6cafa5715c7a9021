"""load_model: a GGUF file or a Hugging Face directory -> LoadedModel (weights stay lazy)."""

from __future__ import annotations

from pathlib import Path

from localinfer.errors import ModelFileError, UnsupportedModelError
from localinfer.loading.chat_template import ChatTemplate
from localinfer.loading.gguf_config import config_from_gguf
from localinfer.loading.gguf_file import GGUF_MAGIC
from localinfer.loading.gguf_split import open_gguf
from localinfer.loading.gguf_weights import GGUFWeights
from localinfer.loading.model import LoadedModel
from localinfer.loading.safetensors_dir import load_safetensors_dir
from localinfer.loading.tokenizer_gguf import tokenizer_from_gguf


def load_gguf(path: Path, name: str | None = None) -> LoadedModel:
    gguf = open_gguf(path)  # a split GGUF's first part opens the whole set
    config = config_from_gguf(gguf)
    weights = GGUFWeights(gguf, config)
    tokenizer = tokenizer_from_gguf(gguf)
    bos = tokenizer.id_to_token(tokenizer.bos_id) if tokenizer.bos_id is not None else ""
    eos = tokenizer.id_to_token(tokenizer.eos_ids[0]) if tokenizer.eos_ids else ""
    source = gguf.get("tokenizer.chat_template")
    template = ChatTemplate.for_model(source, tokenizer, bos, eos, origin=path)
    return LoadedModel(
        name=name or path.stem,
        path=path,
        format="gguf",
        config=config,
        tokenizer=tokenizer,
        chat_template=template,
        weights=weights,
        file_quant=gguf.file_type(),
    )


def load_model(path: Path, name: str | None = None) -> LoadedModel:
    """Open a model for running. Raises ModelFileError (missing/malformed files) or
    UnsupportedModelError (an architecture or format localinfer cannot run)."""
    path = Path(path).expanduser()
    if path.is_dir():
        return load_safetensors_dir(path, name)
    if not path.exists():
        raise ModelFileError(path, "no such file or directory")
    if path.suffix == ".gguf":
        return load_gguf(path, name)
    with open(path, "rb") as f:
        head = f.read(4)
    if head == GGUF_MAGIC:  # a GGUF under another name
        return load_gguf(path, name)
    if path.suffix == ".safetensors":
        raise UnsupportedModelError(
            f"{path}: a lone .safetensors file; pass its directory (with config.json and "
            "tokenizer.json) instead"
        )
    raise UnsupportedModelError(f"{path}: not a GGUF file or a Hugging Face model directory")
