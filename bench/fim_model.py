"""A model with FIM tokens for the autocomplete benchmark, made from the embedded SmolLM2-135M.

SmolLM2's vocabulary has StarCoder's special tokens but not its FIM ones, so the benchmark writes
a copy of the embedded GGUF in which unused special tokens (``<jupyter_start>``, ...) are renamed
to one family's FIM markers. Weights, token ids and everything else stay as they are, so a
prompt costs what it costs the real model; the model was never trained on the markers (its
middles are no real completions), which does not change how long a prefill takes.
"""

from __future__ import annotations

import os
from pathlib import Path

import gguf

from localinfer.loading.embedded import embedded_model_path

# family (localinfer.fim) -> {SmolLM2 special token: the FIM marker it becomes}
RENAMES: dict[str, dict[str, str]] = {
    "starcoder": {  # PSM: <fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>
        "<jupyter_start>": "<fim_prefix>",
        "<jupyter_text>": "<fim_middle>",
        "<jupyter_code>": "<fim_suffix>",
        "<jupyter_output>": "<fim_pad>",
    },
    "codestral": {  # SPM: [SUFFIX]{suffix}[PREFIX]{prefix}
        "<jupyter_start>": "[PREFIX]",
        "<jupyter_text>": "[SUFFIX]",
    },
}


def write_fim_model(dest_dir: Path, family: str) -> Path:
    """The embedded model's GGUF with ``family``'s FIM markers, written under ``dest_dir``."""
    renames = RENAMES[family]
    source = embedded_model_path()
    dest = dest_dir / f"{source.stem}-fim-{family}.gguf"
    partial = dest.with_suffix(".partial")
    reader = gguf.GGUFReader(source)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(partial, arch)
    for field in reader.fields.values():
        # The writer writes the architecture and the GGUF.* header fields itself.
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        value = field.contents()
        if field.name == gguf.Keys.Tokenizer.LIST:
            missing = set(renames) - set(value)
            if missing:
                raise ValueError(f"{source.name} has no token {sorted(missing)[0]} to rename")
            value = [renames.get(token, token) for token in value]
        sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, kind, sub_type=sub_type)
    for tensor in reader.tensors:
        data = tensor.data
        writer.add_tensor_info(tensor.name, data.shape, data.dtype, data.nbytes, tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        writer.write_tensor_data(tensor.data)
    writer.close()
    os.replace(partial, dest)
    return dest
