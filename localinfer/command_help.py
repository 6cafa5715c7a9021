"""A command's parser, with the help text from help.toml: the wording of every command's
``--help`` lives in one file, the arguments with the command that reads them."""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Callable
from functools import cache
from importlib.resources import files


@cache
def help_texts() -> dict[str, dict[str, str]]:
    """Command name -> its help, description and epilog (help.toml)."""
    return tomllib.loads(files("localinfer.commands").joinpath("help.toml").read_text())


def command_parser(
    subparsers: argparse._SubParsersAction, name: str, run: Callable[[argparse.Namespace], int]
) -> argparse.ArgumentParser:
    """Add command ``name`` with its help text; ``run(args)`` runs it and returns the exit code."""
    parser = subparsers.add_parser(name, **help_texts()[name])
    parser.set_defaults(func=run)
    return parser
