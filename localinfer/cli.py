"""`localinfer` command line: one subcommand per module in localinfer/commands/.

Each command module defines ``register(subparsers) -> None``, which adds its parser and sets
``func`` (``(args) -> int``) as a default. Typed LocalinferErrors become one line on stderr and a
non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from localinfer import __version__
from localinfer.errors import LocalinferError


def build_parser() -> argparse.ArgumentParser:
    import localinfer.commands as commands

    parser = argparse.ArgumentParser(
        prog="localinfer", description="Run language models on your own machine."
    )
    parser.add_argument("--version", action="version", version=f"localinfer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"localinfer.commands.{info.name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except LocalinferError as exc:
        print(f"localinfer: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
