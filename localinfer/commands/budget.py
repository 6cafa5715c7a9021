"""`localinfer budget MODEL`: will it fit, and what fits if not."""

from __future__ import annotations

import argparse
import json

from localinfer.command_help import command_parser
from localinfer.counts import parse_count, positive_int_arg
from localinfer.model_options import add_mmproj_option
from localinfer.threads_option import THREADS_HELP


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(subparsers, "budget", run)
    parser.add_argument(
        "model",
        help="catalog name, GGUF file, model folder, config.json, or a Hugging Face repo "
        "ORG/REPO[:QUANT] (read from the Hub's metadata when not on disk: no weights downloaded)",
    )
    parser.add_argument(
        "--ctx",
        default=None,
        help="tokens per sequence, e.g. 4096 or 8k "
        "(default: 2048, what chat and serve allocate, or the model's maximum if smaller)",
    )
    parser.add_argument("--concurrency", default="1", help="sequences at once (default: 1)")
    parser.add_argument(
        "--quant",
        default=None,
        help="none (16-bit), int8, int4, a GGUF type (Q4_K_M, Q8_0, ...), mlx-4bit; for a repo "
        "of GGUF files, the file of that quantization (as ORG/REPO:QUANT); "
        "default: the file's own or the catalog's default",
    )
    parser.add_argument(
        "--kv-dtype",
        default=None,
        help="f16 | bf16 | f32 | q8_0 | q4_0 (default: the backend's own: llama.cpp f16, torch "
        "and MLX their compute dtype, the only one they hold); as chat/generate/serve --kv-dtype",
    )
    parser.add_argument(
        "--device",
        default="auto",
        help="auto (default) | cpu | cuda | cuda:N | metal | a size like 24GiB",
    )
    parser.add_argument("--backend", default=None, help="torch | llamacpp | mlx (default: auto)")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        help="torch's compute dtype (default: float32 on CPU, bfloat16 on CUDA); a K-quant "
        "GGUF, or a Q8_0/Q4_0/Q4_1 one its CPU kernels do not keep, stays int4/int8 unless "
        "--quant names a float type",
    )
    parser.add_argument(
        "--online",
        action="store_true",
        help="catalog models not on disk: read the Hub's metadata (exact weights) instead of the "
        "catalog's numbers (other Hub repos always are; HF_HUB_OFFLINE=1 uses what was cached)",
    )
    add_mmproj_option(
        parser, "count the vision projector (mmproj*.gguf) beside the model: the F16 one, or FILE"
    )
    _add_measuring_options(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    _add_split_options(parser)


def _add_measuring_options(parser: argparse.ArgumentParser) -> None:
    """--verify and its threads; --kv-ram."""
    parser.add_argument(
        "--verify",
        action="store_true",
        help="load the model with the real runner, run one prefill chunk, and compare its "
        "measured memory with the prediction",
    )
    # The runner's threads for --verify (the prediction does not depend on them): a machine
    # shared with other busy programs, as a parallel test suite is, measures with fewer.
    parser.add_argument(
        "--threads",
        type=positive_int_arg,
        default=None,
        metavar="N",
        help=f"with --verify: {THREADS_HELP}",
    )
    parser.add_argument(
        "--kv-ram",
        default=None,
        metavar="SIZE",
        help="count a KV RAM tier (what chat and serve keep reused slots' KV in) of SIZE, like "
        "512MiB, or 'auto' for the share they take by default; its own row (default: not counted)",
    )


def _add_split_options(parser: argparse.ArgumentParser) -> None:
    split = parser.add_argument_group("split across machines (llama.cpp RPC: `localinfer worker`)")
    split.add_argument(
        "--rpc", metavar="HOST:PORT,...", help="plan over this machine and these running workers "
        "(each asked its free memory)",
    )  # fmt: skip
    split.add_argument(
        "--nodes", metavar="SIZE,SIZE,...", help="plan offline over machines of these sizes, "
        "this machine's first (like 16GiB,24GiB)",
    )  # fmt: skip
    split.add_argument(
        "--tensor-split", metavar="N,N,...", help="each machine's share of the layers, this "
        "machine's first (default: in proportion to free memory, as llama.cpp splits)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from localinfer.backend_budget import compute_budget
    from localinfer.budget import BudgetRequest

    request = BudgetRequest(
        model=args.model,
        ctx=parse_count(args.ctx, "--ctx") if args.ctx is not None else None,
        concurrency=parse_count(args.concurrency, "--concurrency"),
        quant=args.quant,
        kv_dtype=args.kv_dtype,
        device=args.device,
        backend=args.backend,
        online=args.online,
        dtype=args.dtype,
        mmproj=args.mmproj,
        kv_ram=args.kv_ram,
    )
    if args.rpc or args.nodes:
        return _split(args, request)
    report = compute_budget(request)
    check = None
    if args.verify:
        from localinfer.budget_verify import verify_budget

        check = verify_budget(report, args.dtype, threads=args.threads)
    if args.json:
        data = report.model_dump()
        if check is not None:
            data["verify"] = check.model_dump()
        print(json.dumps(data))
    else:
        from rich.console import Console

        from localinfer.budget.render import check_table, print_report

        console = Console()
        print_report(report, console)
        note = thinking_note(args.model, report.ctx)
        if note is not None:
            console.print("  " + note, highlight=False, markup=False)
        if check is not None:
            console.print(check_table(check))
    return 0 if report.fits else 3


def thinking_note(model: str, ctx: int) -> str | None:
    """For a model the catalog knows thinks: its reasoning is ordinary tokens in the KV cache
    (the figures above hold), but it comes before the answer, so the context must hold both."""
    from localinfer.catalog import catalog_entry_for

    entry = catalog_entry_for(model)
    if entry is None or not entry.thinks:
        return None
    return (
        f"{model} thinks before it answers: its reasoning takes the same KV cache as the answer, "
        f"often thousands of tokens, so leave room for it in the {ctx:,}-token context "
        "(or cap it: --thinking-budget, reasoning_effort, thinking.budget_tokens)"
    )


def _split(args: argparse.Namespace, request: object) -> int:
    """`budget --rpc` / `--nodes`: the node plan (budget/nodes.py)."""
    from localinfer.budget.memory import parse_size
    from localinfer.errors import InvalidParameterError
    from localinfer.rpc_nodes import node_budget, parse_shares, parse_workers

    if args.verify:
        raise InvalidParameterError("--verify measures one machine; drop --rpc/--nodes")
    workers = parse_workers(args.rpc) if args.rpc else ()
    sizes = [parse_size(part) for part in args.nodes.split(",")] if args.nodes else None
    plan = node_budget(request, workers, sizes, parse_shares(args.tensor_split))  # type: ignore[arg-type]
    if args.json:
        print(json.dumps(plan.model_dump()))
    else:
        from rich.console import Console

        from localinfer.budget.nodes_render import print_node_plan

        print_node_plan(plan, Console())
    return 0 if plan.fits else 3
