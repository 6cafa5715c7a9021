"""`localinfer rm MODEL`: delete a downloaded model from the Hugging Face cache and say how much
space that freed."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "rm",
        help="delete a downloaded model from the HF cache and free its space",
        description="Delete every cached revision of MODEL's Hugging Face repos (its GGUF repo "
        "and its original-weights repo) with huggingface_hub's cache deletion strategy, and "
        "print how much space that frees. The embedded model ships in a pip package instead.",
        epilog="exit status: 0 removed, 1 error or nothing to remove",
    )
    parser.add_argument("model", help="catalog name or HF repo id")
    parser.add_argument("--dry-run", action="store_true", help="say what would go; delete nothing")
    parser.set_defaults(func=run)


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
