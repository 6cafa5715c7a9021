"""A GGUF cut into parts as llama.cpp's gguf-split writes them (NAME-00001-of-0000N.gguf ...):
every part a GGUF of its own, the first with all the metadata, each with split.no, split.count
and split.tensors.count and the directory and data of its share of the tensors. The bytes of
metadata and tensors are copied unchanged."""

from __future__ import annotations

import struct
from pathlib import Path

GGUF_U16, GGUF_I32 = 2, 5


def _key(name: str) -> bytes:
    data = name.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def _pad(size: int, alignment: int) -> bytes:
    return b"\0" * (-size % alignment)


def write_split_gguf(src: str | Path, folder: Path, n_parts: int) -> list[Path]:
    """``src`` in ``n_parts`` parts under ``folder``, the tensors shared out in order."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    alignment = 32
    if "general.alignment" in reader.fields:
        alignment = int(reader.fields["general.alignment"].contents())
    metadata = [
        b"".join(p.tobytes() for p in field.parts)
        for name, field in reader.fields.items()
        if not name.startswith(("GGUF.", "split."))
    ]
    tensors = list(reader.tensors)
    per_part = -(-len(tensors) // n_parts)
    stem = Path(src).stem
    paths = []
    for number in range(n_parts):
        share = tensors[number * per_part : (number + 1) * per_part]
        kvs = list(metadata) if number == 0 else []
        kvs.append(_key("split.no") + struct.pack("<IH", GGUF_U16, number))
        kvs.append(_key("split.count") + struct.pack("<IH", GGUF_U16, n_parts))
        kvs.append(_key("split.tensors.count") + struct.pack("<Ii", GGUF_I32, len(tensors)))
        infos, offset = [], 0
        for tensor in share:
            dims = [int(d) for d in tensor.field.parts[3]]  # innermost first, as stored
            info = _key(tensor.name) + struct.pack("<I", len(dims))
            info += struct.pack(f"<{len(dims)}Q", *dims)
            infos.append(info + struct.pack("<IQ", int(tensor.tensor_type), offset))
            offset += int(tensor.n_bytes) + len(_pad(int(tensor.n_bytes), alignment))
        head = b"GGUF" + struct.pack("<IQQ", 3, len(share), len(kvs)) + b"".join(kvs + infos)
        path = folder / f"{stem}-{number + 1:05d}-of-{n_parts:05d}.gguf"
        with path.open("wb") as out:
            out.write(head + _pad(len(head), alignment))
            for tensor in share:
                data = reader.data[tensor.data_offset : tensor.data_offset + tensor.n_bytes]
                out.write(data.tobytes() + _pad(int(tensor.n_bytes), alignment))
        paths.append(path)
    return paths
