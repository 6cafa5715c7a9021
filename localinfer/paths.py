"""Where localinfer keeps its files: a cache (rebuildable: tokenizers, downloads) and data.

Both follow the platform's conventions (platformdirs) and can be moved with an environment
variable, which tests use to keep every run inside a temporary folder.
"""

from __future__ import annotations

import os
from pathlib import Path

APP_NAME = "localinfer"
CACHE_ENV = "LOCALINFER_CACHE_DIR"
DATA_ENV = "LOCALINFER_DATA_DIR"


def _platform_dir(kind: str) -> Path:
    try:
        import platformdirs
    except ImportError:  # platformdirs is a dependency; this keeps a broken env usable
        return Path.home() / f".{APP_NAME}" / kind
    if kind == "cache":
        return Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))
    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


def cache_dir() -> Path:
    """Rebuildable files (built tokenizers, downloaded models). Created on first use."""
    override = os.environ.get(CACHE_ENV)
    path = Path(override).expanduser() if override else _platform_dir("cache")
    path.mkdir(parents=True, exist_ok=True)
    return path


def data_dir() -> Path:
    """Files the user would miss (settings, history). Created on first use."""
    override = os.environ.get(DATA_ENV)
    path = Path(override).expanduser() if override else _platform_dir("data")
    path.mkdir(parents=True, exist_ok=True)
    return path
