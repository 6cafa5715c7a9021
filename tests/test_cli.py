"""`localinfer` argument parsing: options may come between positionals in every command."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from localinfer.cli import CommandParser, build_parser


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_command_parses_intermixed() -> None:
    parsers = command_parsers()
    assert {"generate", "budget", "pull", "chat", "serve"} <= set(parsers)
    assert all(isinstance(p, CommandParser) for p in parsers.values())


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "m", "--max-tokens", "40", "the prompt"],
        ["generate", "--max-tokens", "40", "m", "the prompt"],
        ["generate", "m", "the prompt", "--max-tokens", "40"],
    ],
)
def test_generate_options_anywhere(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert (args.model, args.prompt, args.max_tokens) == ("m", "the prompt", 40)


def test_one_positional_and_options_around_it() -> None:
    args = build_parser().parse_args(["budget", "--ctx", "4k", "m", "--concurrency", "2"])
    assert (args.model, args.ctx, args.concurrency) == ("m", "4k", "2")
    args = build_parser().parse_args(["generate", "--max-tokens", "3", "only a prompt"])
    assert (args.model, args.prompt) == (None, "only a prompt")
    with pytest.raises(SystemExit) as exit_info:  # still an error: a stray extra positional
        build_parser().parse_args(["budget", "m", "--ctx", "4k", "extra"])
    assert exit_info.value.code == 2


def test_generate_with_an_option_between_model_and_prompt_runs() -> None:
    # The command line from the issue, through the real CLI and the embedded model.
    done = subprocess.run(
        [sys.executable, "-m", "localinfer", "generate", "smollm2-135m", "--max-tokens", "3"]
        + ["Say hello."],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    assert "3 completion tokens" in done.stderr


def test_commands_that_run_a_model_share_its_options() -> None:
    from localinfer.backends.select import BACKENDS
    from localinfer.model_options import BACKENDS as OFFERED
    from localinfer.model_options import model_settings

    assert OFFERED == BACKENDS
    parsers = command_parsers()
    for name, argv in {
        "chat": [],
        "generate": ["prompt"],
        "serve": [],
        "bench": [],
    }.items():
        args = parsers[name].parse_args([*argv, "--backend", "torch", "--quant", "int8", "--force"])
        chosen = model_settings(args)
        assert (chosen["backend"], chosen["quant"], chosen["force"]) == ("torch", "int8", True)
        assert parsers[name].parse_args(argv).force is False
    assert parsers["chat"].parse_args([]).ctx == 2048  # the settings screen's starting point
    assert parsers["generate"].parse_args(["p"]).ctx is None  # the session's default
