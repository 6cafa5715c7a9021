"""A LoadedModel's weights as MLX arrays: float, quantized on load, or kept as stored.

Float tensors come from the model's WeightSource (float32 numpy, Hugging Face names and layout).
Matrices MLX runs as stored (a GGUF's block types in MLX's affine groups, gguf_forms.py; MLX-format
repos: see native.py) are kept so in ``native`` mode; other modes dequantize them first.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from localinfer.backends.mlx.gguf_forms import GGUF_FORMS
from localinfer.backends.mlx.layers import Matrix, Projection
from localinfer.backends.mlx.native import dequantized, is_mlx_quantized_dir, native_matrices
from localinfer.backends.mlx.quant_affine import affine_quantize
from localinfer.backends.mlx.quant_spec import QuantSpec
from localinfer.errors import ModelFileError
from localinfer.loading.model import LoadedModel
from localinfer.loading.model_config import ModelConfig


@dataclass(slots=True)
class LayerWeights:
    input_norm: mx.array  # [hidden]
    qkv: Projection  # q [q_size], k [kv_size], v [kv_size] outputs
    q_norm: mx.array | None  # [head_dim] (qwen3)
    k_norm: mx.array | None  # [head_dim] (qwen3)
    o: Matrix  # [hidden, q_size]
    post_norm: mx.array  # [hidden]
    gate_up: Projection  # gate [ffn], up [ffn] outputs
    down: Matrix  # [hidden, ffn]
    sliding: bool  # this layer uses the sliding-window mask


@dataclass(slots=True)
class ModelWeights:
    embed: Matrix  # [vocab, hidden]
    layers: list[LayerWeights]
    norm: mx.array  # [hidden]
    lm_head: Matrix  # [vocab, hidden]; the same object as embed when tied
    quant_label: str  # what RunnerInfo.quant shows: "Q4_1", "int4-g64", "fp32", ...

    def arrays(self) -> list[mx.array]:
        out = [*self.embed.arrays(), self.norm]
        if self.lm_head is not self.embed:
            out += self.lm_head.arrays()
        for layer in self.layers:
            out += [layer.input_norm, layer.post_norm, *layer.qkv.arrays(), *layer.o.arrays()]
            out += [*layer.gate_up.arrays(), *layer.down.arrays()]
            out += [a for a in (layer.q_norm, layer.k_norm) if a is not None]
        return out

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays())


class _Builder:
    """Builds each Matrix the way the QuantSpec says (by the matrix's role: facts/quant.py);
    remembers which formats it produced."""

    def __init__(self, model: LoadedModel, spec: QuantSpec, dtype: mx.Dtype) -> None:
        self.source = model.weights
        self.spec = spec
        # The untied layout: a tied table asks for the "head" role itself.
        self.layout = spec.layout(tied=False) if spec.mode == "affine" else {}
        self.dtype = dtype
        # Quantization scales: the compute dtype when it is 16-bit; float16 beside float32
        # activations (MLX promotes), so a quantized model is as small as the budget says.
        self.scale_dtype = mx.float16 if dtype == mx.float32 else dtype
        # MLX-format repos can only be read natively (their packed uint32 has no float form).
        wants_native = spec.mode == "native" or is_mlx_quantized_dir(model)
        self.native = native_matrices(model, self.scale_dtype) if wants_native else {}
        self.formats: set[str] = set()
        self.names = set(self.source.names())

    def vector(self, name: str) -> mx.array:
        return mx.array(self.source.get(name)).astype(self.dtype)

    def maybe_vector(self, name: str) -> mx.array | None:
        return self.vector(name) if name in self.names else None

    def matrix(self, name: str, role: str, bias: str | None = None) -> Matrix:
        b = self.maybe_vector(bias) if bias else None
        stored = self.native.pop(name, None)
        if stored is not None and self.spec.mode == "native":
            m, label = stored
            m.bias = b
            self.formats.add(label)
            return m
        # Float32 first: a 16-bit compute dtype would round a file's grid before it is re-gridded.
        if stored is not None:
            w = dequantized(stored[0], mx.float32)
        else:
            w = mx.array(self.source.get(name)).astype(mx.float32)  # [out, in]
        mq = self.layout.get(role)
        if mq is not None and w.shape[-1] % mq.group == 0:
            q, scales, biases = affine_quantize(w, mq.bits, mq.group, self.scale_dtype)
            # Now, not at the end: the float source of every matrix would otherwise stay alive.
            mx.eval(q, scales, biases)
            self.formats.add(self.spec.label)
            return Matrix(q, scales, biases, b, group_size=mq.group, bits=mq.bits)
        # Too narrow for the group size (only tiny test models): stays float.
        self.formats.add("float")
        return Matrix(w.astype(self.dtype), bias=b)


def load_weights(model: LoadedModel, spec: QuantSpec, dtype: mx.Dtype) -> ModelWeights:
    """Build and evaluate every array the model runs on."""
    c: ModelConfig = model.config
    b = _Builder(model, spec, dtype)
    tied = c.tied_embeddings or "lm_head.weight" not in (b.names | set(b.native))
    try:
        # A tied table is the LM head too: it is quantized as the head is.
        embed = b.matrix("model.embed_tokens.weight", "head" if tied else "embed")
        lm_head = embed if tied else b.matrix("lm_head.weight", "head")
        layers = []
        for i in range(c.n_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            bias = c.attention_bias
            qkv = [
                b.matrix(a + f"{n}_proj.weight", "qkv", a + f"{n}_proj.bias" if bias else None)
                for n in ("q", "k", "v")
            ]
            layers.append(
                LayerWeights(
                    input_norm=b.vector(p + "input_layernorm.weight"),
                    qkv=Projection(qkv),
                    q_norm=b.vector(a + "q_norm.weight") if c.qk_norm else None,
                    k_norm=b.vector(a + "k_norm.weight") if c.qk_norm else None,
                    o=b.matrix(a + "o_proj.weight", "o"),
                    post_norm=b.vector(p + "post_attention_layernorm.weight"),
                    gate_up=Projection(
                        [
                            b.matrix(p + "mlp.gate_proj.weight", "gate_up"),
                            b.matrix(p + "mlp.up_proj.weight", "gate_up"),
                        ]
                    ),
                    down=b.matrix(p + "mlp.down_proj.weight", "down"),
                    sliding=i in c.sliding_layers and c.sliding_window is not None,
                )
            )
        norm = b.vector("model.norm.weight")
    except KeyError as exc:
        raise ModelFileError(model.path, f"missing tensor {exc.args[0]}") from None
    weights = ModelWeights(embed, layers, norm, lm_head, _label(b.formats, model, dtype))
    mx.eval(weights.arrays())
    return weights


def _label(formats: set[str], model: LoadedModel, dtype: mx.Dtype) -> str:
    float_label = {mx.float32: "fp32", mx.bfloat16: "bf16", mx.float16: "fp16"}[dtype]
    quantized = sorted(formats - {"float"})
    if not quantized:
        return float_label
    if any(q in GGUF_FORMS for q in quantized):
        return model.file_quant  # the file's own mix, as llama.cpp would name it
    return quantized[0]
