"""The options every command that runs a model shares (chat, generate, serve, bench) and the
session keywords they become, so the four spell and mean them the same way; and --mmproj, which
budget and pull share."""

from __future__ import annotations

import argparse
from typing import Any

from localinfer.counts import count_arg
from localinfer.threads_option import add_threads_option

Parser = argparse.ArgumentParser | argparse._ArgumentGroup

# backends.select.BACKENDS, written out: every command registers its flags at start-up, and
# importing the selection would add to every command's start (tests/test_cli.py checks they agree).
BACKENDS = ("torch", "llamacpp", "mlx")

DRAFT_HELP = (
    "speculative decoding: n-gram lookup in the prompt and output (ngram), the catalog's "
    "recommended draft model (auto), a draft model sharing the tokenizer, or off (default)"
)


def add_model_options(parser: Parser, *, ctx: int | None = None) -> None:
    """--backend, --ctx (default ``ctx``; None: 2048 or the model's trained context if less),
    --quant, --kv-dtype, --threads and --force."""
    parser.add_argument("--backend", choices=BACKENDS, help="default: the fastest installed here")
    default = f"{ctx}" if ctx is not None else "2048, or the model's trained context if less"
    parser.add_argument(
        "--ctx",
        type=count_arg,
        default=ctx,
        help=f"context tokens per slot, e.g. 4096 or 8k (default: {default})",
    )
    parser.add_argument(
        "--quant",
        help="weight quantization: int8, int4, or which of a catalog model's files "
        "(default: the file's own)",
    )
    parser.add_argument(
        "--kv-dtype",
        metavar="f16|bf16|f32|q8_0|q4_0",
        help="the KV cache's element type, llama.cpp's (default: f16; q8_0 and q4_0 take "
        "about 1/2 and 1/4 of its memory and turn flash attention on; without --backend they "
        "pick llama.cpp on a CPU); torch and MLX keep the cache in their compute dtype",
    )
    add_threads_option(parser)
    parser.add_argument(
        "--force",
        action="store_true",
        help="load the model even where the memory budget says it does not fit",
    )
    add_rpc_options(parser)


def add_rpc_options(parser: Parser) -> None:
    """--rpc and --tensor-split: a GGUF model split across machines by llama.cpp's RPC."""
    parser.add_argument(
        "--rpc",
        metavar="HOST:PORT,...",
        help="split the model's layers between this machine and these `localinfer worker`s "
        "(llama.cpp's RPC; in proportion to their free memory)",
    )
    parser.add_argument(
        "--tensor-split",
        metavar="N,N,...",
        help="with --rpc: each machine's share of the layers, this machine's first",
    )


def add_draft_options(parser: Parser) -> None:
    """--draft and --draft-backend (the draft model's backend)."""
    parser.add_argument("--draft", default="off", metavar="ngram|auto|MODEL|off", help=DRAFT_HELP)
    parser.add_argument(
        "--draft-backend",
        choices=BACKENDS,
        help="backend of the draft model (default: the target's)",
    )


CACHE_REUSE_HELP = (
    "also reuse cached chunks of at least N tokens that reappear later in a new prompt (text "
    "inserted mid-prompt, as when typing into a file for fill-in-the-middle), moving their KV "
    "instead of prefilling them. An approximation: a moved chunk's KV was computed without the "
    "new text before it. Default 0: off, only the exact shared prefix is reused"
)


def add_cache_reuse_option(parser: Parser) -> None:
    """--cache-reuse N (llama.cpp server's flag): chunk reuse beyond the shared prefix."""
    parser.add_argument("--cache-reuse", type=int, default=0, metavar="N", help=CACHE_REUSE_HELP)


def add_mmproj_option(parser: Parser, help_text: str) -> None:
    """--mmproj [FILE]: a model's vision projector (mmproj*.gguf) beside it, the F16 one when
    FILE is left out ("" then; None without the flag). ``help_text`` says what the command does
    with it."""
    parser.add_argument(
        "--mmproj", nargs="?", const="", default=None, metavar="FILE", help=help_text
    )


def model_settings(args: argparse.Namespace) -> dict[str, Any]:
    """open_session's keywords for what add_model_options parsed."""
    names = ("backend", "ctx", "quant", "kv_dtype", "threads", "force")
    settings = {name: getattr(args, name) for name in names}
    rpc = _rpc(args)
    if rpc is not None:
        settings["rpc"] = rpc
    # --mmproj where the command has it (generate, serve): the vision projector to load.
    return {**settings, "mmproj": getattr(args, "mmproj", None)}


def _rpc(args: argparse.Namespace) -> Any:
    """--rpc and --tensor-split as open_session's ``rpc`` (None without --rpc)."""
    from localinfer.rpc_nodes import rpc_options

    return rpc_options(getattr(args, "rpc", None), getattr(args, "tensor_split", None))


def draft_settings(args: argparse.Namespace) -> dict[str, Any]:
    """open_session's keywords for what add_draft_options parsed."""
    return {"draft": args.draft, "draft_backend": args.draft_backend}
