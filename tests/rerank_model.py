"""A tiny random reranker written as llama.cpp's converter writes Qwen3-Reranker: a qwen3 GGUF
with rank pooling (``qwen3.pooling_type`` = 4), a ``cls.output`` head of two rows ("yes", "no"),
``qwen3.classifier.output_labels`` and a ``tokenizer.chat_template.rerank`` template. llama.cpp
then scores a (query, document) pair as the softmax of the head over the last token's state; the
score is its first output, P("yes").

``template=False`` leaves the rerank template out: pairs are then joined with the vocabulary's
BOS/EOS tokens (llama-server's ``format_prompt_rerank``), which the file asks for here.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from tests.gguf_writer import finish_gguf
from tests.model_files import CHATML, TINY_VOCAB_SIZE, hf_to_gguf_name, tiny_vocab, to_gguf_layout
from tests.tiny import tiny_config, tiny_weights

# The template llama.cpp's convert_hf_to_gguf.py writes for Qwen3-Reranker (vendored version).
QWEN3_RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that "
    "answer the query\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
)
LABELS = ["yes", "no"]


def write_tiny_reranker(path: Path, *, template: bool = True, seed: int = 0) -> Path:
    """Write the tiny reranker (module docstring) at ``path``; returns it."""
    config = tiny_config("qwen3", vocab_size=TINY_VOCAB_SIZE, max_ctx=2048)
    source = tiny_weights(config, seed)
    rng = np.random.default_rng(seed + 1)
    # Logits of a few units apart: scores spread over (0, 1) rather than saturating at 0 or 1.
    head = rng.normal(0.0, 0.1, size=(len(LABELS), config.hidden_size)).astype(np.float32)
    w = gguf.GGUFWriter(str(path), arch="qwen3")
    w.add_name("tiny reranker")
    w.add_block_count(config.n_layers)
    w.add_context_length(config.max_ctx)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.ffn_size)
    w.add_head_count(config.n_heads)
    w.add_head_count_kv(config.n_kv_heads)
    w.add_key_length(config.head_dim)
    w.add_value_length(config.head_dim)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.rms_eps)
    w.add_pooling_type(gguf.PoolingType.RANK)
    w.add_classifier_output_labels(LABELS)
    tokens, types, merges = tiny_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(not template)
    w.add_add_eos_token(not template)
    templates = [{"name": "default", "template": CHATML}]
    if template:
        templates.append({"name": "rerank", "template": QWEN3_RERANK_TEMPLATE})
    w.add_chat_template(templates)
    for name in source.names():
        data = to_gguf_layout(name, np.asarray(source.get(name), dtype=np.float32), config)
        w.add_tensor(hf_to_gguf_name(name, config.arch), data)
    w.add_tensor("cls.output.weight", head)
    finish_gguf(w)
    return path
