"""GGUF file names in a model repo: which files hold which quantization, the parts of a split
GGUF, vision projectors. One rule for the Hub and the local cache, so `budget ORG/REPO:Q4_K_M`
before a download reads the file the budget reads after `pull` fetched it.

The rule follows llama.cpp's `-hf` and Ollama's `REPO:QUANT`: the quantization tag ends the file
name (``Model-Q4_K_M.gguf``, ``model.q8_0.gguf``, ``Model-UD-Q4_K_XL-00001-of-00003.gguf``);
without a tag, Q4_K_M when the repo has it, else the first file. A split GGUF (llama.cpp's
gguf-split: ``NAME-00001-of-0000N.gguf``) is one model in N parts; ``mmproj*.gguf`` files are
vision projectors, never the model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from localinfer.errors import InvalidParameterError

DEFAULT_GGUF_QUANT = "Q4_K_M"  # llama.cpp's -hf and Ollama take this one when none is named
_TAG = re.compile(
    r"(?:^|[-_.])((?:UD-)?(?:I?Q\d+(?:_[A-Z0-9]+)*|[BF]F16|F16|F32|FP16|FP32|MXFP4(?:_MOE)?))$",
    re.IGNORECASE,
)
_SPLIT_SUFFIX = re.compile(r"-\d{5}-of-\d{5}$", re.IGNORECASE)
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


def is_projector(name: str) -> bool:
    return name.rsplit("/", 1)[-1].lower().startswith("mmproj") and name.endswith(".gguf")


def model_ggufs(names: Iterable[str]) -> list[str]:
    """The GGUF files that hold a model (not a vision projector), sorted."""
    return sorted(n for n in names if n.lower().endswith(".gguf") and not is_projector(n))


def projector_ggufs(names: Iterable[str]) -> list[str]:
    """The vision projectors (mmproj*.gguf), sorted."""
    return sorted(n for n in names if is_projector(n))


def split_part_names(name: str) -> list[str] | None:
    """Every part's name of a split GGUF, from any part's name (folders kept); None for a file
    that is not a part."""
    folder, _, base = name.rpartition("/")
    found = _SPLIT.match(base)
    if found is None:
        return None
    count = int(found["count"])
    prefix = f"{folder}/" if folder else ""
    return [f"{prefix}{found['stem']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def quant_tag(name: str) -> str | None:
    """The quantization a GGUF file name ends with ('Q4_K_M', 'UD-Q4_K_XL', 'BF16'), upper-case;
    None when the name carries none."""
    stem = name.rsplit("/", 1)[-1]
    stem = _SPLIT_SUFFIX.sub("", stem[: -len(".gguf")] if stem.lower().endswith(".gguf") else stem)
    found = _TAG.search(stem)
    return found.group(1).upper() if found else None


def gguf_models(names: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Model GGUFs grouped into models: first file -> all its files (split parts in order)."""
    groups: dict[str, tuple[str, ...]] = {}
    present = set(names)
    names = present
    for name in model_ggufs(names):
        parts = split_part_names(name)
        if parts is None:
            groups[name] = (name,)
        elif parts[0] not in groups and all(p in present for p in parts):
            groups[parts[0]] = tuple(parts)
    return groups


def available_quants(names: list[str]) -> list[str]:
    """The quantization tags of a repo's GGUF models, in file order, each once."""
    tags = (quant_tag(first) or first.rsplit("/", 1)[-1] for first in gguf_models(names))
    return list(dict.fromkeys(tags))


def pick_gguf(names: list[str], quant: str | None, where: str) -> tuple[str, ...]:
    """The files of the GGUF model of ``quant`` among ``names`` (see the module docstring);
    raises InvalidParameterError listing what there is."""
    groups = gguf_models(names)
    if not groups:
        raise InvalidParameterError(f"{where} has no GGUF model file")
    wanted = (quant or DEFAULT_GGUF_QUANT).strip()
    exact = [parts for first, parts in groups.items() if quant_tag(first) == wanted.upper()]
    if exact:
        return exact[0]
    if quant is None:
        return next(iter(groups.values()))
    loose = [
        parts
        for first, parts in groups.items()
        if wanted.lower() in first.rsplit("/", 1)[-1].lower()
    ]
    if loose:
        return loose[0]
    raise InvalidParameterError(
        f"{where} has no {wanted} GGUF; it has {', '.join(available_quants(names))}"
    )


def pick_projector(names: Iterable[str], asked: str, where: str) -> str:
    """The vision projector ``asked`` names among ``names`` ("": the F16 one, else the first);
    raises InvalidParameterError listing the projectors there are."""
    found = projector_ggufs(names)
    if not found:
        raise InvalidParameterError(f"--mmproj: {where} has no mmproj*.gguf file")
    if not asked:
        return next((n for n in found if quant_tag(n) == "F16"), found[0])
    chosen = [n for n in found if asked in (n, n.rsplit("/", 1)[-1])]
    if not chosen:
        raise InvalidParameterError(f"--mmproj: {where} has no {asked}; it has {', '.join(found)}")
    return chosen[0]


def find_projector(model: Path, asked: str | None) -> Path | None:
    """The vision projector to load with the GGUF at ``model``: ``asked`` None, the one beside
    it if there is one (the F16 one first); "" the one beside it, which must exist; "none" no
    projector; otherwise a file's path, or the name of one beside the model."""
    if asked is not None and asked.lower() == "none":
        return None
    if asked:
        path = Path(asked).expanduser()
        if not path.is_file() and (model.parent / asked).is_file():
            path = model.parent / asked
        if not path.is_file():
            raise InvalidParameterError(f"--mmproj: {asked} is not a file")
        return path
    names = [p.name for p in model.parent.glob("*.gguf") if p != model]
    if asked is None and not projector_ggufs(names):
        return None
    return model.parent / pick_projector(names, "", str(model.parent))
