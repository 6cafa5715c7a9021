"""Model loading: GGUF files and Hugging Face directories -> LoadedModel.

Public entry points (imported lazily, so `localinfer.loading.model_config` stays light):
``load_model``, ``embedded_model_path``, ``Tokenizer``, ``ChatTemplate``, ``ChatTemplateError``,
``ChatTemplateLimitError``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "load_model": "localinfer.loading.loader",
    "embedded_model_path": "localinfer.loading.embedded",
    "Tokenizer": "localinfer.loading.tokenizer",
    "ChatTemplate": "localinfer.loading.chat_template",
    "ChatTemplateError": "localinfer.loading.chat_template",
    "ChatTemplateLimitError": "localinfer.loading.chat_template",
    "LoadedModel": "localinfer.loading.model",
    "ModelConfig": "localinfer.loading.model_config",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'localinfer.loading' has no attribute {name!r}")
