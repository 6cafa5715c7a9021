"""config.json files of real public models, saved under tests/fixtures/configs."""

from __future__ import annotations

import json
from pathlib import Path

from localinfer.facts.arch import ArchSpec
from localinfer.facts.hf_config import arch_from_hf_config

CONFIGS = Path(__file__).resolve().parent / "fixtures" / "configs"


def arch_of(fixture: str) -> ArchSpec:
    """The architecture facts of the saved ``fixture`` (a file name under CONFIGS)."""
    return arch_from_hf_config(json.loads((CONFIGS / fixture).read_text()), fixture)
