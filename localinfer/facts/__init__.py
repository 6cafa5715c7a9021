"""Model facts: what a model's files say about it, read once for loading, the catalog and the
budget.

- ``arch``: ``ArchSpec``, a decoder's shape in Hugging Face terms, and its exact parameter count.
- ``quant``: the weight quantizations by name and their bits per weight.
- ``hf_config``: a Hugging Face config.json read into ArchSpec's fields.
- ``gguf_header``: a GGUF header's metadata read into ArchSpec's fields.
- ``kv_dtype``: the KV cache's element types and their bytes per row.
- ``pooling``: the ways an embedding pools a sequence's hidden states.

Loading builds its ``ModelConfig`` and the budget its ``ArchSpec`` from the same fields, so the two
never disagree on what a file holds. Nothing here imports loading, the catalog, resolve or the
budget: they all stand on it.
"""
