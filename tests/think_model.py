"""Tiny thinking GGUFs that llama.cpp loads, one per ``<think>`` format, each with its model's
real chat template in the metadata: Qwen3 (``qwen3``), a DeepSeek-R1 distill (``qwen2``, whose
template opens the block in the generation prompt) and SmolLM3 (``llama``). The byte-level BPE
vocabulary holds the template's special tokens (``<think>`` and ``</think>`` as user-defined
tokens, as the converter writes added tokens that are not special).

The weights are random and small, except for a planted next-token chain (tests/planted_model.py)
that makes greedy decoding after the generation prompt think, then answer: ``<think>`` (where
the template does not open it), `` one two three four five six``, ``</think>``, ``\\n\\n``,
``Hello!``, end of turn. A thinking budget cuts the count short: its forced ``</think>\\n\\n``
leads to the same answer.

SmolLM3's template turns thinking off with ``<think>\\n\\n</think>\\n``: the prompt ends in the
same newline as when it thinks, which a chain read off the last token cannot tell apart. So its
model also has a planted switch: one attention head finds ``_think`` (the end of ``/no_think``,
which its template writes in the system prompt only when thinking is off) and, where it is in
the prompt, sends that newline to the answer instead of ``<think>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from localinfer.engine.reasoning import THINK_END, THINK_START
from localinfer.loading.model import DictWeights
from localinfer.loading.model_config import ModelConfig
from tests.gguf_writer import add_model_header, finish_gguf, gguf_tensors
from tests.planted_model import PlantedChain, plant_chain, planted_vocab
from tests.tiny import tiny_config, tiny_weights

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"
STEPS = ("Ġone", "Ġtwo", "Ġthree", "Ġfour", "Ġfive", "Ġsix")  # the reasoning, token by token
THOUGHT = "one two three four five six"
ANSWER = "Hello!"
CTX = 4096  # SmolLM3's thinking prompt is ~1,200 tokens of this vocabulary
LOGIT_SCALE = 4.0
QUIET = 0.01  # the attention and MLP outputs' scale: the residual stays the planted embedding
MARKER = "_think"  # /no_think's last pre-token (qwen2's and llama3's split: " /", "no", "_think")


def reasoning_chain(opener: str, end_of_turn: str, opens: bool) -> dict[str, str]:
    """``opener`` (the prompt's last token) -> [``<think>`` when the model ``opens`` the block]
    -> the steps -> ``</think>`` -> ``\\n\\n`` -> ``Hello`` -> ``!`` -> ``end_of_turn``."""
    path = [opener, *([THINK_START] if opens else []), *STEPS, THINK_END, "ĊĊ", "Hello", "!"]
    return {**dict(zip(path, path[1:], strict=False)), "!": end_of_turn}


@dataclass(frozen=True)
class ThinkFormat:
    key: str  # the test id
    template: str  # tests/fixtures/templates/<template>.jinja
    arch: str  # the tiny model's architecture (tests/tiny.py's, written as llama.cpp's)
    pre: str  # tokenizer.ggml.pre
    specials: tuple[str, ...]  # control tokens
    bos: str
    eos: str
    opens: bool  # the model writes <think> itself (the template does not open it)
    switch: str | None = None  # a prompt token that sends the last newline to the answer

    def template_source(self) -> str:
        return (TEMPLATES / f"{self.template}.jinja").read_text()

    def chain(self) -> dict[str, str]:
        return reasoning_chain("Ċ", self.eos, self.opens)

    def vocab(self) -> tuple[list[str], list[int], list[str]]:
        words = [*STEPS, "ĊĊ", "Hello", *([self.switch] if self.switch else [])]
        return planted_vocab(self.specials, words, user_defined=(THINK_START, THINK_END))


BOS_EOS_R1 = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>")
FORMATS = (
    ThinkFormat(
        "qwen3", "Qwen-Qwen3-0.6B", "qwen3", "qwen2",
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), "<|endoftext|>", "<|im_end|>", True,
    ),
    ThinkFormat(
        "deepseek-r1", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "qwen2", "deepseek-r1-qwen",
        (*BOS_EOS_R1, "<｜User｜>", "<｜Assistant｜>"), *BOS_EOS_R1, False,
    ),
    ThinkFormat(
        "smollm3", "HuggingFaceTB-SmolLM3-3B", "llama", "llama-bpe",
        ("<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"),
        "<|begin_of_text|>", "<|im_end|>", True, switch=MARKER,
    ),
)  # fmt: skip


def _weights(fmt: ThinkFormat, config: ModelConfig, vocab: list[str], seed: int) -> DictWeights:
    """tests/tiny.py's random weights with the attention and MLP outputs made small, the chain
    planted, and the switch where the format has one."""
    random = tiny_weights(config, seed)
    tensors = {name: random.get(name) for name in random.names()}
    for name in tensors:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            tensors[name] = tensors[name] * QUIET
    extra = [fmt.switch] if fmt.switch else []
    rng = np.random.default_rng(seed)
    planted = plant_chain(rng, vocab, fmt.chain(), config.hidden_size, LOGIT_SCALE, extra)
    if fmt.switch is not None:
        _plant_switch(tensors, planted, vocab, fmt, config)
    tensors["model.embed_tokens.weight"] = planted.embd
    tensors["lm_head.weight"] = planted.head
    tensors["model.norm.weight"] = np.ones(config.hidden_size, np.float32)
    return DictWeights(tensors)


def _plant_switch(
    tensors: dict[str, np.ndarray],
    planted: PlantedChain,
    vocab: list[str],
    fmt: ThinkFormat,
    config: ModelConfig,
) -> None:
    """Layer 0's first head: every chain token queries for the switch token (in RoPE's slowest
    pair, so where it stands hardly matters), whose value writes a spare direction into the
    residual; the head reads that direction as "the newline opens the answer". No other token
    has a key or a value there (their embeddings are made orthogonal to the switch's)."""
    ids = {t: i for i, t in enumerate(vocab)}
    hidden, dim, scale = config.hidden_size, config.head_dim, np.sqrt(config.hidden_size)
    chain = sorted({ids[t] for pair in fmt.chain().items() for t in pair})
    marker = planted.embd[ids[fmt.switch]] / scale  # a unit vector
    rest = [i for i in range(len(vocab)) if i not in chain and i != ids[fmt.switch]]
    planted.embd[rest] -= np.outer(planted.embd[rest] @ marker, marker)
    query = planted.embd[chain].sum(axis=0) / scale  # 1 along each chain token's embedding
    slow = dim // 2 - 1  # Hugging Face's rotate-half order: pair (dim/2 - 1, dim - 1)
    layer = "model.layers.0."
    tensors[layer + "input_layernorm.weight"] = np.ones(hidden, np.float32)
    q, k, v, o = (tensors[f"{layer}self_attn.{p}_proj.weight"] for p in "qkvo")
    q[:dim], k[:dim], v[:dim], o[:, :dim] = 0, 0, 0, 0
    q[slow], k[slow] = 1.5 * query, 1.5 * marker  # the switch's score: 36, any other's 0
    v[0], o[:, 0] = marker, planted.spare[0]  # the residual gains 8 along the spare direction
    # With the switch, the newline's answer outscores <think>; and the chain still wins every
    # other step (the successor's logit is 4/3 of the answer's).
    answer = 0.75 * LOGIT_SCALE * planted.spare[0]
    planted.head[ids["Hello"]] += answer
    planted.head[ids[THINK_START]] -= answer


def write_think_gguf(path: Path, fmt: ThinkFormat, seed: int = 0) -> Path:
    """``fmt``'s tiny GGUF at ``path``: its template, vocabulary and planted chain."""
    tokens, types, merges = fmt.vocab()
    config = tiny_config(fmt.arch, vocab_size=len(tokens), max_ctx=CTX, tied_embeddings=False)
    w = gguf.GGUFWriter(str(path), arch=fmt.arch)
    w.add_name(f"tiny-{fmt.key}")
    add_model_header(w, config)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(fmt.pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index(fmt.bos))
    w.add_eos_token_id(tokens.index(fmt.eos))
    w.add_add_bos_token(False)  # the templates write their own
    w.add_chat_template(fmt.template_source())
    for name, tensor in gguf_tensors(config, _weights(fmt, config, tokens, seed)).items():
        w.add_tensor(name, tensor)
    finish_gguf(w)
    return path
