"""`localinfer chat [MODEL]`: the terminal chat app (Textual); heavy imports happen in run().

With ``--url`` the chat loads nothing and attaches to a running `localinfer serve` instead
(localinfer/tui/remote_host.py), so the chat and an editor share one loaded model.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from localinfer.command_help import command_parser
from localinfer.commands.serve import API_KEY_ENV  # as `localinfer serve` reads it
from localinfer.kv_options import add_kv_options
from localinfer.model_options import DRAFT_HELP, add_model_options

if TYPE_CHECKING:
    from localinfer.kv_options import KVTierOptions

CHAT_KV_DISK_HELP = (
    "directory where each conversation's KV cache is kept when the chat leaves it, so reopening "
    "it (Ctrl+O) restores its prompt instead of computing it again (default: kv/ in the "
    "conversations folder; off: none)"
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(subparsers, "chat", run)
    parser.add_argument(
        "model",
        nargs="?",
        default=None,
        help="catalog name, GGUF file or folder; with --url, a model the server serves",
    )
    add_model_options(parser, ctx=2048)  # as the settings screen starts
    parser.add_argument("--slots", type=int, default=1, help="concurrent sequences (default 1)")
    parser.add_argument("--draft", default=None, metavar="ngram|auto|MODEL|off", help=DRAFT_HELP)
    parser.add_argument("--temperature", type=float, default=0.7, help="default: 0.7")
    parser.add_argument(
        "--max-tokens", type=int, default=512, help="tokens per answer (default: 512)"
    )
    parser.add_argument(
        "--context-overflow",
        choices=("drop-oldest", "summarize", "stop"),
        default="drop-oldest",
        help="a conversation past the context: leave out the oldest whole turns (a line marks "
        "where the model's context begins), also have the model summarize them, or refuse the "
        "question (default: drop-oldest)",
    )
    parser.add_argument(
        "--cut-kv",
        choices=("shift", "prefill"),
        default="shift",
        help="after a cut, move the kept turns' KV into place (fast; an approximation: it was "
        "computed with the left-out turns before it) or compute it again (exact) (default: shift)",
    )
    parser.add_argument(
        "--image-store",
        choices=("copy", "reference"),
        default="copy",
        help="how a saved conversation keeps the images attached with /image: a copy of each "
        "file in the conversations folder, or only its path (a file moved or deleted later is "
        "left out, with a note) (default: copy)",
    )
    # The chat's disk tier is on by default (beside the conversations): see kv_tiers().
    add_kv_options(parser, disk_help=CHAT_KV_DISK_HELP, disk_metavar="DIR|off")
    parser.add_argument(
        "--url",
        default=None,
        metavar="URL",
        help="attach to a running `localinfer serve` (like http://127.0.0.1:8000) instead of "
        "loading a model here: the chat and other clients share its model",
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help=f"the server's key for --url (or set ${API_KEY_ENV})",
    )


def _remote_url(url: str) -> str:
    from urllib.parse import urlsplit

    from localinfer.errors import InvalidParameterError

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidParameterError(
            f"--url must be an http(s) address like http://127.0.0.1:8000, got '{url}'"
        )
    # The server's routes are /v1/...: an address given with /v1 (as OpenAI clients take it)
    # means the same server.
    return url.rstrip("/").removesuffix("/v1")


def _api_key(args: argparse.Namespace) -> str | None:
    from localinfer.errors import InvalidParameterError

    if args.url is None:  # a local chat: $LOCALINFER_API_KEY (exported for serve) is not for it
        if args.api_key is not None:
            raise InvalidParameterError("--api-key is for a server: give its address with --url")
        return None
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV)
    if key is not None and not key.strip():
        raise InvalidParameterError("--api-key is empty: give the server's key, or leave it out")
    return key


def kv_tiers(args: argparse.Namespace, conversations: Path) -> KVTierOptions:
    """The chat's KV tiers: what --kv-ram/--kv-disk/--kv-disk-cap say, the disk tier in
    ``conversations``/kv unless --kv-disk names another folder or ``off``. A conversation left
    is kept there, so reopening it restores its prompt instead of computing it again."""
    from dataclasses import replace

    from localinfer.kv_options import kv_settings

    options: KVTierOptions = kv_settings(args)["kv"]
    disk = options.disk
    if disk is None:
        disk = conversations / "kv"
    elif str(disk) == "off":
        disk = None
    return replace(options, disk=disk)


def _no_kv_flags_with_url(args: argparse.Namespace) -> None:
    from localinfer.errors import InvalidParameterError

    kv_flags = ("kv_ram", "kv_disk", "kv_disk_cap", "kv_dtype")
    given = [f for f in kv_flags if getattr(args, f, None) is not None]
    if given and args.url is not None:
        flag = "--" + given[0].replace("_", "-")
        serve_flag = "--kv-dtype TYPE" if flag == "--kv-dtype" else "--kv-disk DIR"
        raise InvalidParameterError(
            f"{flag} is for a model loaded here; with --url the server keeps its own KV "
            f"(`localinfer serve {serve_flag}`)"
        )


def check_flags_before_loading(args: argparse.Namespace) -> None:
    """What can be refused from the flags alone, refused before the window opens: a bad value
    surfaced only inside the chat as "could not load a model" (with advice about other models)
    and the command still exited 0. --quant is left to the model's resolution: a repo's file
    tag ('UD-Q4_K_XL') is a valid --quant no list of quantizations knows."""
    from localinfer.budget.kv_tier import parse_disk_cap, parse_kv_ram
    from localinfer.errors import InvalidParameterError
    from localinfer.facts.kv_dtype import kv_dtype

    parse_kv_ram(getattr(args, "kv_ram", None))
    if getattr(args, "kv_dtype", None) is not None:
        kv_dtype(args.kv_dtype)
        if getattr(args, "backend", None):  # a backend that holds no such cache: say so now
            from localinfer.backend_budget import kv_dtype_refusal

            refusal = kv_dtype_refusal(args.backend, args.kv_dtype)
            if refusal is not None:
                raise InvalidParameterError(refusal)
    if getattr(args, "kv_disk_cap", None) is not None:
        parse_disk_cap(args.kv_disk_cap)


def run(args: argparse.Namespace) -> int:
    from functools import partial

    from localinfer.errors import InvalidParameterError
    from localinfer.rpc_nodes import rpc_options
    from localinfer.tui.answer_source import ChatBackend
    from localinfer.tui.host import ChatHost, open_with_settings
    from localinfer.tui.settings import ChatSettings

    if args.ctx < 64:
        raise InvalidParameterError(f"--ctx must be at least 64, got {args.ctx}")
    if args.slots < 1:
        raise InvalidParameterError(f"--slots must be at least 1, got {args.slots}")
    api_key = _api_key(args)
    if args.url is not None and args.rpc:
        raise InvalidParameterError("--rpc splits a model loaded here; --url uses the server's")
    _no_kv_flags_with_url(args)
    check_flags_before_loading(args)
    settings = ChatSettings(
        model=args.model,
        backend=args.backend,
        quant=args.quant,
        ctx=args.ctx,
        slots=args.slots,
        threads=args.threads,
        speculative={None: "off", "off": "off", "ngram": "ngram"}.get(args.draft, "draft"),
        draft=args.draft,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        context_overflow=args.context_overflow,
        cut_kv=args.cut_kv,
    )
    settings.validated()
    host: ChatBackend
    if args.url is not None:
        from localinfer.tui.remote_host import RemoteHost

        host = RemoteHost(_remote_url(args.url), settings, api_key=api_key)
    else:
        # The model starts loading now, while the engine and Textual import and the window comes
        # up; the app's load worker collects it and shows progress until then.
        from localinfer.conversations import default_root

        kv = kv_tiers(args, default_root())
        rpc = rpc_options(args.rpc, args.tensor_split)  # refused now, not in the window
        opener = partial(open_with_settings, force=args.force, kv=kv, kv_dtype=args.kv_dtype,
                         rpc=rpc)  # fmt: skip
        local = ChatHost(settings, opener=opener)
        local.load_in_background(settings)
        host = local
    try:
        from localinfer.conversations import ConversationStore
        from localinfer.tui.app import ChatApp

        app = ChatApp(host, ConversationStore())
        app.image_store = args.image_store
        app.run()
    finally:
        host.close()
    # Textual prints an unhandled exception's traceback and sets return_code 1: pass that on, so
    # a crash is never a successful exit.
    return app.return_code or 0
