"""System-prompt presets: named system prompts kept in one JSON file in the user's data folder
(``data_dir()/system_prompts.json``, beside the conversations; ``LOCALINFER_DATA_DIR`` moves
both). Written as conversations are: a temporary file, flushed, then renamed over the old one,
so a crash leaves the old presets or the new ones. A file that cannot be read is reported and
never overwritten."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from localinfer.errors import LocalinferError

FILE_NAME = "system_prompts.json"
FORMAT_VERSION = 1


class PresetError(LocalinferError, code="preset_error"):
    """The presets file cannot be read (it is left as it is)."""


def default_path() -> Path:
    from localinfer.paths import data_dir

    return Path(data_dir()) / FILE_NAME


class PresetStore:
    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()

    def load(self) -> dict[str, str]:
        """The presets by name, sorted by name (none yet: empty). Raises PresetError."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise PresetError(f"{self.path}: unreadable presets ({exc})") from None
        presets = data.get("presets") if isinstance(data, dict) else None
        if not isinstance(presets, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in presets.items()
        ):
            raise PresetError(f"{self.path}: not a presets file")
        return dict(sorted(presets.items(), key=lambda kv: kv[0].lower()))

    def save(self, name: str, prompt: str) -> dict[str, str]:
        """Add (or replace) ``name``; returns the presets as saved."""
        name = " ".join(name.split())
        if not name:
            raise PresetError("a preset needs a name")
        presets = self.load()
        presets[name] = prompt
        self._write(presets)
        return self.load()

    def delete(self, name: str) -> dict[str, str]:
        presets = self.load()
        if presets.pop(name, None) is not None:
            self._write(presets)
        return presets

    def _write(self, presets: dict[str, str]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        payload = json.dumps(
            {"version": FORMAT_VERSION, "presets": presets}, ensure_ascii=False, indent=1
        )
        fd, tmp = tempfile.mkstemp(
            prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent
        )
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(payload)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
