"""`localinfer rm MODEL`: delete a downloaded model from the Hugging Face cache and say how much
space that freed."""

from __future__ import annotations

import argparse

from localinfer.command_help import command_parser


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(subparsers, "rm", run)
    parser.add_argument("model", help="catalog name or HF repo id")
    parser.add_argument("--dry-run", action="store_true", help="say what would go; delete nothing")


def run(args: argparse.Namespace) -> int:
    from localinfer.budget.memory import human_bytes
    from localinfer.hub import remove_cached
    from localinfer.resolve import hf_cache_dir

    removal = remove_cached(args.model, dry_run=args.dry_run)
    if not removal.repos:
        from localinfer.errors import ModelFileError

        raise ModelFileError(args.model, f"not in the Hugging Face cache ({hf_cache_dir()})")
    verb = "would free" if args.dry_run else "freed"
    print(
        f"{', '.join(removal.repos)}: {removal.revisions} revision(s), "
        f"{verb} {human_bytes(removal.freed_bytes)} ({removal.freed_bytes} bytes)"
    )
    return 0
