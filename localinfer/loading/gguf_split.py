"""A split GGUF opened as one file: llama.cpp's gguf-split writes NAME-00001-of-0000N.gguf ...
NAME-0000N-of-0000N.gguf; the first part holds the metadata, every part its own tensor directory
and data. llama.cpp loads the set from the first part's path and finds the others by that name,
so localinfer does the same: ``open_gguf(first part)`` gives a GGUFFile whose tensor directory
holds every part's tensors and whose ``raw``/``dequantize`` read each tensor from its own part,
so every runner (llama.cpp by the path, torch and MLX through GGUFWeights) runs the set.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from localinfer.errors import ModelFileError
from localinfer.facts.gguf_names import split_part_names
from localinfer.loading.gguf_file import GGUFFile


def open_gguf(path: str | Path) -> GGUFFile:
    """A GGUF file, or the whole of a split GGUF from its first part's path. Raises
    ModelFileError naming the first part for a later part, a missing part for an incomplete set,
    and the naming rule for a part whose name does not say which it is."""
    path = Path(path)
    names = split_part_names(path.name)
    if names is None:
        gguf = GGUFFile(path)
        count = gguf.metadata.get("split.count", 1)
        if isinstance(count, int) and count > 1:
            gguf.close()
            raise ModelFileError(
                path,
                f"is the first of {count} parts of a split GGUF but not named as one; rename "
                f"the parts NAME-00001-of-{count:05d}.gguf ... (as gguf-split writes them)",
            )
        return gguf
    if names[0] != path.name:
        number = names.index(path.name) + 1
        raise ModelFileError(
            path, f"is part {number} of a split GGUF; open its first part, {names[0]}"
        )
    return SplitGGUFFile(path)


def gguf_part_paths(path: str | Path) -> list[Path]:
    """Every file of the GGUF model at ``path``: a split GGUF's parts in order (from any part's
    name), else the file itself. For readers of their own (MLX's mx.load) that take one file."""
    path = Path(path)
    names = split_part_names(path.name)
    return [path.parent / name for name in names] if names else [path]


class GGUFPart(GGUFFile):
    """A later part of a split GGUF: its split.* keys and tensor directory; the architecture
    and the header checks belong to the first part."""

    def _open(self) -> None:
        self._open_later_part()


class SplitGGUFFile(GGUFFile):
    """The first part of a split GGUF with every later part's tensors in its directory."""

    def _open(self) -> None:
        self.parts: list[GGUFFile] = []
        self._owner: dict[str, GGUFFile] = {}
        super()._open()  # the first part: metadata, its tensors, the header checks
        names = split_part_names(self.path.name)
        assert names is not None  # open_gguf chose this class by the name
        count = self.metadata.get("split.count", 1)
        if count != len(names):
            reason = f"'split.count' is {count} but the file name says {len(names)} parts"
            raise ModelFileError(self.path, f"malformed split GGUF: {reason}")
        for name in names[1:]:
            later = self.path.parent / name
            if not later.is_file():
                raise ModelFileError(later, "missing part of a split GGUF")
            self.parts.append(GGUFPart(later))
        check_split_parts(self, self.parts)
        for part in self.parts:
            for tensor, info in part.tensors.items():
                self.tensors[tensor] = info
                self._owner[tensor] = part
        self._check_header()  # again: token_embd may be in a later part

    def raw(self, name: str) -> np.ndarray:
        owner = self._owner.get(name)
        return owner.raw(name) if owner is not None else super().raw(name)

    def release_pages(self) -> None:
        super().release_pages()
        for part in self.parts:
            part.release_pages()

    def close(self) -> None:
        super().close()
        for part in getattr(self, "parts", ()):
            part.close()


def check_split_parts(first: GGUFFile, later: list[GGUFFile]) -> None:
    """The parts of one split GGUF, in order: split.count parts, each numbered by split.no, no
    tensor in two of them (ModelFileError naming the part that is wrong)."""
    count = first.metadata.get("split.count", 1)
    if count != len(later) + 1:
        reason = f"'split.count' is {count} but {len(later) + 1} part(s) were found"
        raise ModelFileError(first.path, f"malformed split GGUF: {reason}")
    seen = set(first.tensors)
    for number, part in enumerate(later, start=1):
        no = part.metadata.get("split.no")
        if no != number:
            raise ModelFileError(
                part.path, f"malformed split GGUF: 'split.no' is {no}, not {number}"
            )
        for tensor in part.tensors:
            if tensor in seen:
                raise ModelFileError(part.path, f"tensor '{tensor}' appears in two split parts")
            seen.add(tensor)
