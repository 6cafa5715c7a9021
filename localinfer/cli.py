"""`localinfer` command line: one subcommand per module in localinfer/commands/.

Each command module defines ``register(subparsers) -> None``, which adds its parser and sets
``func`` (``(args) -> int``) as a default. Typed LocalinferErrors become one line on stderr and a
non-zero exit, never a traceback; a closed stdout (`| head`) ends quietly with 141.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import select
import sys

from localinfer import __version__
from localinfer.errors import LocalinferError


class CommandParser(argparse.ArgumentParser):
    """A command's parser: options may come between its positionals, as in
    `localinfer generate MODEL --max-tokens 40 "PROMPT"` (plain argparse hands "PROMPT" to no
    one once an option has split the positionals: "unrecognized arguments")."""

    _intermixing = False

    def parse_known_args(  # type: ignore[override]
        self, args: list[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        # parse_known_intermixed_args calls parse_known_args itself (Python 3.11, 3.12): the flag
        # sends those inner calls to argparse's own parsing. A parser with sub-commands or a
        # REMAINDER positional cannot be intermixed and is parsed as usual.
        nested = any(
            a.nargs in (argparse.PARSER, argparse.REMAINDER) for a in self._get_positional_actions()
        )
        if self._intermixing or nested:
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


def build_parser() -> argparse.ArgumentParser:
    import localinfer.commands as commands

    parser = argparse.ArgumentParser(
        prog="localinfer", description="Run language models on your own machine."
    )
    parser.add_argument("--version", action="version", version=f"localinfer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
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
    except BrokenPipeError as exc:
        if not _stdout_is_closed():  # a socket or a child's pipe: an error like any other
            print(f"localinfer: error: {exc}", file=sys.stderr)
            return 1
        # The reader went away (`localinfer embed ... | head`): the rest is unwanted. Point stdout
        # at /dev/null so the interpreter's final flush does not fail again, and exit as a
        # program stopped by SIGPIPE does (128 + 13).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def _stdout_is_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone: poll reports an error on its write end
    (writing nothing would not tell: Linux returns 0 for an empty write to any pipe)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no fileno (captured), or no poll (Windows)
        return False


if __name__ == "__main__":
    sys.exit(main())
