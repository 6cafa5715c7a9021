"""Turn a WeightSource (Hugging Face names, float32 numpy) into the tensors the model runs on.

One walk over a Llama-family checkpoint's names and shapes, fusing q|k|v and gate|up; each matrix
is held as the chosen weight form holds it (weight_forms.py). Norm weights stay float32 whatever
the compute dtype: RMSNorm runs in float32.
"""

from __future__ import annotations

import numpy as np
import torch

from localinfer.backends.torch.profile import TORCH_ARCHS
from localinfer.backends.torch.weight_forms import StoredMatrix, WeightForm
from localinfer.backends.torch.weights import LayerWeights, ModelWeights
from localinfer.errors import ModelFileError, UnsupportedModelError
from localinfer.loading.model import WeightSource
from localinfer.loading.model_config import ModelConfig

EMBED = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"


def load_weights(config: ModelConfig, source: WeightSource, form: WeightForm) -> ModelWeights:
    """Every tensor of ``source`` copied out, the matrices (the embedding table included) as
    ``form`` holds them."""
    if config.arch not in TORCH_ARCHS:
        raise UnsupportedModelError(
            f"the torch backend runs {', '.join(TORCH_ARCHS)}; this model is {config.arch!r}"
        )
    reader = _Reader(source, form)
    layers = [reader.layer(config, i) for i in range(config.n_layers)]
    shape = (config.vocab_size, config.hidden_size)
    embed = form.table(reader.stored("model.embed_tokens", shape, EMBED))
    if config.tied_embeddings:
        lm_head = form.tied_head(embed)
    else:
        lm_head = form.matrix(reader.stored("lm_head", shape, LM_HEAD))
    form.finish()
    return ModelWeights(
        embed=embed,
        layers=layers,
        norm=reader.norm("model.norm.weight", config.hidden_size),
        lm_head=lm_head,
        packed=form.packed,
        quantized=form.quantized,
        onednn_dense=form.onednn_dense,
    )


class _Reader:
    def __init__(self, source: WeightSource, form: WeightForm) -> None:
        self.source = source
        self.form = form

    def get(self, name: str) -> np.ndarray:
        try:
            return self.source.get(name)
        except KeyError:
            raise ModelFileError(name, "tensor missing from the model file") from None

    def stored(self, name: str, shape: tuple[int, int], *parts: str) -> StoredMatrix:
        if len(parts) == 1:
            return StoredMatrix(name, shape, parts, lambda: self.get(parts[0]))
        return StoredMatrix(
            name, shape, parts, lambda: np.concatenate([self.get(p) for p in parts])
        )

    def norm(self, name: str, size: int) -> torch.Tensor:
        return self.form.tensors.put(self.get(name), (size,), name, torch.float32)

    def layer(self, config: ModelConfig, i: int) -> LayerWeights:
        h, q, kv, f = config.hidden_size, config.q_size, config.kv_size, config.ffn_size
        p = f"model.layers.{i}."
        a = p + "self_attn."
        form, norm, stored = self.form, self.norm, self.stored
        qkv = [a + f"{n}_proj.weight" for n in "qkv"]
        gate_up = [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]
        bias = None
        if config.attention_bias:
            parts = [self.get(a + f"{n}_proj.bias") for n in "qkv"]
            bias = form.tensors.put(np.concatenate(parts), (q + 2 * kv,), a + "qkv bias")
        qk_norm = config.qk_norm
        return LayerWeights(
            input_norm=norm(p + "input_layernorm.weight", h),
            qkv=form.matrix(stored(a + "qkv", (q + 2 * kv, h), *qkv)),
            qkv_bias=bias,
            q_norm=norm(a + "q_norm.weight", config.head_dim) if qk_norm else None,
            k_norm=norm(a + "k_norm.weight", config.head_dim) if qk_norm else None,
            o=form.matrix(stored(a + "o_proj", (h, q), a + "o_proj.weight")),
            post_norm=norm(p + "post_attention_layernorm.weight", h),
            gate_up=form.matrix(stored(p + "mlp.gate_up", (2 * f, h), *gate_up)),
            down=form.matrix(stored(p + "mlp.down_proj", (h, f), p + "mlp.down_proj.weight")),
            sliding=bool(config.sliding_window) and i in config.sliding_layers,
        )
