"""A tiny gpt-oss GGUF that llama.cpp loads: the ``gpt-oss`` architecture as llama.cpp's converter
writes it (attention with biases and sinks, every other layer sliding, a router with biases and
the experts' gate/up/down in MXFP4), a byte-level BPE vocabulary with o200k_harmony's special
tokens, and gpt-oss's real chat template (tests/fixtures/templates/openai-gpt-oss-120b.jinja).

The weights are random and small, except for a planted next-token table (``chain``,
tests/planted_model.py): the embeddings of the chain's tokens are orthonormal and the LM head
maps each to its successor, so a greedy decode follows the chain from the prompt's last token
(``assistant``) whatever came before. That is what makes a random model write harmony's
channels: ``HARMONY_THINKER`` opens the analysis channel and reasons (`` the the ...``) until a
budget closes it; ``HARMONY_CALLER`` calls ``lookup`` on the commentary channel.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from tests.gguf_writer import finish_gguf
from tests.planted_model import plant_chain, planted_vocab

TEMPLATE = Path(__file__).parent / "fixtures" / "templates" / "openai-gpt-oss-120b.jinja"
SPECIALS = [
    "<|startoftext|>",
    "<|endoftext|>",
    "<|return|>",
    "<|constrain|>",
    "<|channel|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|call|>",
]
# Whole tokens for the words the chains write and the template's role names (each built by
# merges, left to right; "Ġ" is a space in byte-level BPE).
WORDS = [
    "assistant", "analysis", "final", "commentary", "Ġthe", "Ġto", "=functions", ".lookup",
    "json", "{}", "user", "system", "developer",
]  # fmt: skip
HARMONY_THINKER = {
    "assistant": "<|channel|>",
    "<|channel|>": "analysis",
    "analysis": "<|message|>",
    "<|message|>": "Ġthe",
    "Ġthe": "Ġthe",
}
HARMONY_CALLER = {
    "assistant": "<|channel|>",
    "<|channel|>": "commentary",
    "commentary": "Ġto",
    "Ġto": "=functions",
    "=functions": ".lookup",
    ".lookup": "Ġ",
    "Ġ": "<|constrain|>",
    "<|constrain|>": "json",
    "json": "<|message|>",
    "<|message|>": "{}",
    "{}": "<|call|>",
}
HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 64, 4, 2, 16
LAYERS, EXPERTS, EXPERTS_USED, EXPERT_FFN = 2, 4, 2, 64
WINDOW, CTX = 128, 4096
# The chain's logit is about 8 x this above every other: 32, so a draw at temperature 1 (the
# Anthropic API's default) leaves the chain with odds of about e^-32 a token; at 16 one such
# test lost its thinking block once in a fresh-clone run.
LOGIT_SCALE = 4.0


def harmony_vocab() -> tuple[list[str], list[int], list[str]]:
    """Tokens (the specials, 256 byte-level characters, the words and their prefixes), GGUF
    token types (3: control) and merges."""
    return planted_vocab(SPECIALS, WORDS)


def _weights(vocab: list[str], chain: dict[str, str], seed: int) -> dict[str, np.ndarray]:
    """Every tensor but the experts, float32 in numpy order ([out, in])."""
    rng = np.random.default_rng(seed)
    planted = plant_chain(rng, vocab, chain, HIDDEN, LOGIT_SCALE)
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM

    def small(*shape: int, std: float = 0.02) -> np.ndarray:
        return (std * rng.normal(size=shape)).astype(np.float32)

    out = {"token_embd.weight": planted.embd, "output_norm.weight": np.ones(HIDDEN, np.float32)}
    out["output.weight"] = planted.head
    for i in range(LAYERS):
        layer = {
            "attn_norm.weight": np.ones(HIDDEN, np.float32),
            "post_attention_norm.weight": np.ones(HIDDEN, np.float32),
            "attn_q.weight": small(q, HIDDEN), "attn_q.bias": small(q),
            "attn_k.weight": small(kv, HIDDEN), "attn_k.bias": small(kv),
            "attn_v.weight": small(kv, HIDDEN), "attn_v.bias": small(kv),
            "attn_output.weight": small(HIDDEN, q, std=0.001), "attn_output.bias": small(HIDDEN),
            "attn_sinks.weight": small(HEADS, std=1.0),
            "ffn_gate_inp.weight": small(EXPERTS, HIDDEN), "ffn_gate_inp.bias": small(EXPERTS),
            "ffn_gate_exps.bias": small(EXPERTS, EXPERT_FFN),
            "ffn_up_exps.bias": small(EXPERTS, EXPERT_FFN),
            "ffn_down_exps.bias": small(EXPERTS, HIDDEN, std=0.001),
        }  # fmt: skip
        out.update({f"blk.{i}.{name}": w for name, w in layer.items()})
    return out


def _experts(seed: int) -> dict[str, np.ndarray]:
    """The experts' matrices [expert, out, in], float32, to be stored as MXFP4."""
    rng = np.random.default_rng(seed + 1)
    out = {}
    for i in range(LAYERS):
        for name, shape in (
            ("ffn_gate_exps", (EXPERTS, EXPERT_FFN, HIDDEN)),
            ("ffn_up_exps", (EXPERTS, EXPERT_FFN, HIDDEN)),
            ("ffn_down_exps", (EXPERTS, HIDDEN, EXPERT_FFN)),
        ):
            out[f"blk.{i}.{name}.weight"] = (0.02 * rng.normal(size=shape)).astype(np.float32)
    return out


def _header(w: gguf.GGUFWriter, template: str) -> None:
    a = "gpt-oss"
    w.add_block_count(LAYERS)
    w.add_context_length(CTX)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(EXPERT_FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(150000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(EXPERTS_USED)
    w.add_expert_feed_forward_length(EXPERT_FFN)
    w.add_sliding_window(WINDOW)
    w.add_uint32(f"{a}.rope.dimension_count", HEAD_DIM)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)  # as the real ones: YaRN past 1/4 of it
    w.add_rope_scaling_factor(4.0)
    w.add_rope_scaling_orig_ctx_len(CTX // 4)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    tokens, types, merges = harmony_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|startoftext|>"))
    w.add_eos_token_id(tokens.index("<|return|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(template)


def write_harmony_gguf(
    path: Path, chain: dict[str, str] = HARMONY_THINKER, seed: int = 0, drop: str | None = None
) -> Path:
    """The tiny gpt-oss GGUF at ``path``, its greedy decode following ``chain`` (``drop``: a
    tensor left out, for a malformed file)."""
    vocab = harmony_vocab()[0]
    w = gguf.GGUFWriter(str(path), arch="gpt-oss")
    _header(w, TEMPLATE.read_text())
    for name, t in _weights(vocab, chain, seed).items():
        if name != drop:
            w.add_tensor(name, t)
    mxfp4 = gguf.GGMLQuantizationType.MXFP4
    for name, t in _experts(seed).items():
        q = gguf.quants.quantize(t, mxfp4)
        if name != drop:
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=mxfp4)
    finish_gguf(w)
    return path
