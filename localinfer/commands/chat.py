"""`localinfer chat [MODEL]`: the terminal chat app (Textual); heavy imports happen in run()."""

from __future__ import annotations

import argparse

from localinfer.command_help import command_parser
from localinfer.model_options import DRAFT_HELP, add_model_options


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(subparsers, "chat", run)
    parser.add_argument("model", nargs="?", default=None, help="catalog name, GGUF file or folder")
    add_model_options(parser, ctx=2048)  # as the settings screen starts
    parser.add_argument("--slots", type=int, default=1, help="concurrent sequences (default 1)")
    parser.add_argument("--draft", default=None, metavar="ngram|auto|MODEL|off", help=DRAFT_HELP)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-tokens", type=int, default=512)


def run(args: argparse.Namespace) -> int:
    from functools import partial

    from localinfer.errors import InvalidParameterError
    from localinfer.tui.host import ChatHost, open_with_settings
    from localinfer.tui.settings import ChatSettings

    if args.ctx < 64:
        raise InvalidParameterError(f"--ctx must be at least 64, got {args.ctx}")
    if args.slots < 1:
        raise InvalidParameterError(f"--slots must be at least 1, got {args.slots}")
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
    )
    # The model starts loading now, while the engine and Textual import and the window comes up;
    # the app's load worker collects it and shows progress until then.
    host = ChatHost(settings, opener=partial(open_with_settings, force=args.force))
    host.load_in_background(settings)
    try:
        settings.validated()
        from localinfer.conversations import ConversationStore
        from localinfer.tui.app import ChatApp

        app = ChatApp(host, ConversationStore())
        app.run()
    finally:
        host.close()
    # Textual prints an unhandled exception's traceback and sets return_code 1: pass that on, so
    # a crash is never a successful exit.
    return app.return_code or 0
