"""Bad input on the command line (found by exploratory QA): each is one line on stderr and a
non-zero exit, never a traceback, and nothing is loaded that the budget says will not fit."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from localinfer.cli import main
from localinfer.loading.embedded import embedded_model_path


def test_budget_verify_refuses_what_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    # 100,000 sequences of the embedded model need terabytes: --verify used to build that runner
    # anyway (a 157 GB allocation, a torch traceback; or the OOM killer on a machine that
    # overcommits).
    rc = main(
        ["budget", "smollm2-135m", "--verify", "--concurrency", "100000", "--backend", "torch"]
    )
    err = capsys.readouterr().err
    assert rc == 1
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "--verify" in err and "does not fit" in err


def test_refusal_hints_use_the_flags_of_the_commands_that_load() -> None:
    # ensure_fits speaks for chat, generate, serve and bench: their flag is --slots (the hints
    # used to be budget's flags); --kv-dtype they have (llama.cpp's cache type).
    from localinfer.backend_budget import compute_budget
    from localinfer.budget import BudgetRequest, ensure_fits
    from localinfer.errors import OutOfMemoryBudgetError

    request = BudgetRequest(
        "smollm2-135m", ctx=8192, concurrency=200, device="24GiB", backend="llamacpp"
    )
    report = compute_budget(request)
    assert any("--kv-dtype" in s.change for s in report.suggestions)  # budget's own hints
    with pytest.raises(OutOfMemoryBudgetError) as refused:
        ensure_fits(report)
    message = str(refused.value)
    assert "--slots " in message and "--ctx " in message
    assert "--concurrency" not in message and "--kv-dtype q8_0" in message


def test_generate_refusal_names_slots(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["generate", "--slots", "100000", "--backend", "torch", "hi"])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    assert "try --slots " in err and "--concurrency" not in err


def test_generate_takes_a_negative_seed_as_the_server_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # numpy's generators refuse negative seeds: --seed -1 was a ValueError traceback. The server
    # maps any int64 seed to seed % 2**64; the command line now does the same.
    # One thread: llama.cpp's spinning threads only wait on each other on a busy shared machine.
    argv = ["generate", "--temperature", "0.9", "--max-tokens", "4", "--json", "Say hi"]
    argv += ["--threads", "1"]
    rc = main([*argv, "--seed", "-1"])
    out, err = capsys.readouterr()
    assert rc == 0 and "Traceback" not in err
    assert main([*argv, "--seed", str(2**64 - 1)]) == 0
    again = capsys.readouterr().out
    assert json.loads(out)["token_ids"] == json.loads(again)["token_ids"]


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--window", "0"], "--window"),  # was range()'s ValueError traceback
        (["--window", "-3"], "--window"),  # was a table of nan, exit 0
        (["--window", "1"], "--window"),  # a window of one token scores nothing
        (["--speed-steps", "-1"], "--speed-steps"),  # was negative tok/s, exit 0
    ],
)
def test_quality_bad_numbers_are_one_line(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["quality", "--tokens", "20", "--quant", "int8", *argv])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    assert err.startswith(f"localinfer: error: {flag} ") and len(err.strip().splitlines()) == 1


def test_generate_dash_reads_the_prompt_from_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `cat notes.txt | localinfer generate -` used to send the one-character prompt "-".
    argv = ["generate", "--raw", "--max-tokens", "1", "--json", "--threads", "1"]
    text = "The capital of France is\nParis, and"
    assert main([*argv, text]) == 0
    direct = json.loads(capsys.readouterr().out)["usage"]["prompt_tokens"]
    monkeypatch.setattr("sys.stdin", io.StringIO(text + "\n"))
    assert main([*argv, "-"]) == 0
    assert json.loads(capsys.readouterr().out)["usage"]["prompt_tokens"] == direct
    monkeypatch.setattr("sys.stdin", io.StringIO("  \n"))
    assert main([*argv, "-"]) == 1
    assert "stdin" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--slots", "0"], "--slots"),  # ran the whole default benchmark with the default slots
        (["--slots", "-2"], "--slots"),
        (["--warmup", "-1"], "--warmup"),  # silently taken as 0
    ],
)
def test_bench_bad_numbers_are_one_line(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["bench", "--requests", "1", "--concurrency", "1", "--max-tokens", "1", *argv])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    assert err.startswith(f"localinfer: error: {flag} ") and len(err.strip().splitlines()) == 1


def test_pull_of_a_local_path_says_it_is_on_disk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It said "unknown model ...: not a catalog name, local file or cached repo" of a local file.
    empty = tmp_path / "x.gguf"
    empty.write_bytes(b"")
    for path in (empty, embedded_model_path(), tmp_path):
        assert main(["pull", str(path)]) == 1
        err = capsys.readouterr().err
        assert "is on disk" in err and "unknown model" not in err
    assert empty.read_bytes() == b""


def test_every_option_with_a_default_states_it() -> None:
    # A new user reads the default off --help; options whose help said nothing (generate's
    # --max-tokens 256, chat's --temperature 0.7, serve's --max-queue 64, ...) hid it.
    import argparse

    from tests.test_cli import command_parsers

    missing = []
    for name, parser in command_parsers().items():
        for action in parser._actions:
            if not action.option_strings or isinstance(action, argparse._HelpAction):
                continue
            if action.default in (None, False, [], argparse.SUPPRESS):
                continue
            text = (action.help or "").lower()
            if "default" not in text:
                missing.append(f"{name} {action.option_strings[0]} ({action.default!r})")
                continue
            stated = re.search(r"default:? ([\w.]+)", text)
            if stated and isinstance(action.default, int | float) and stated[1][0].isdigit():
                assert float(stated[1].rstrip(".")) == float(action.default), (name, action.help)
    assert not missing, missing


def test_models_size_of_a_catalog_model_is_its_download() -> None:
    # The "~" size of a model not on disk is what pull downloads. On a CPU where the budget
    # picks torch it was torch's float32 copy in memory: smollm2-360m Q8_0 showed ~1.35 GiB
    # (its Q8_0 file is about 367 MiB), whereas `models --device 8GiB` showed 367 MiB.
    from localinfer.commands.models import collect_rows

    here = {r.name: r for r in collect_rows("auto")}
    planned = {r.name: r for r in collect_rows("8GiB")}
    row = here["smollm2-360m"]
    assert not row.on_disk and row.quant == "Q8_0"
    assert 350 * 2**20 < row.size_bytes < 400 * 2**20
    assert row.size_bytes == planned["smollm2-360m"].size_bytes


def test_budget_online_says_when_the_hub_could_not_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # --online asks for the Hub's exact figures; with the Hub unreachable the catalog's numbers
    # answered, and nothing but "params x bits" told the user that --online had done nothing.
    from test_budget_remote import _closed_port, point_at

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    point_at(monkeypatch, f"http://127.0.0.1:{_closed_port()}")
    assert main(["budget", "qwen3-8b", "--online", "--json"]) == 0
    source = json.loads(capsys.readouterr().out)["weights_source"]
    assert "catalog" in source and "--online could not read the Hub" in source


def test_output_cut_short_by_a_closed_pipe_is_no_traceback() -> None:
    # `localinfer embed ... | head -c 1`: the reader goes away; the rest is not wanted. It was a
    # BrokenPipeError traceback (generate's stream alike).
    import subprocess
    import sys

    # ~13 KB a line: 12 lines are over twice the 64 KiB a Linux pipe holds
    texts = [f"text number {i}" for i in range(12)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "localinfer", "embed", "--threads", "1", *texts],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(1) == b"{"
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err


def test_generate_says_when_the_context_cut_the_answer(capsys: pytest.CaptureFixture[str]) -> None:
    # --max-tokens 100 in a 48-token context stopped after 32 tokens with "finish: length", the
    # same words as a --max-tokens stop: nothing said the context had run out. A 24-token context
    # (the 17-token prompt and 8 answered) runs out the same way, for a quarter of the decoding.
    argv = ["generate", "--threads", "1", "--ctx", "24", "--raw", "1, 2, 3, 4, 5, 6,"]
    argv += ["--max-tokens", "100"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "finish: length" in err and "the 24-token context is full" in err
    assert main([*argv[:-1], "5"]) == 0  # stopped by --max-tokens: no such note
    assert "context is full" not in capsys.readouterr().err


def test_budget_empty_kv_dtype_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    # `--kv-dtype ""` (an unset shell variable) silently budgeted the default cache type.
    assert main(["budget", "smollm2-135m", "--kv-dtype", ""]) == 1
    assert "unknown KV cache dtype ''" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (
            ["--threads", "-2"],
            "argument --threads: wants a whole number of at least 1",
        ),  # traceback
        (["--threads", "0"], "argument --threads: wants a whole number of at least 1"),
        (["--ctx", "0"], "argument --ctx: wants a count of at least 1"),
        (["--ctx", "lots"], "argument --ctx: wants a count of at least 1"),
    ],
)
def test_model_command_counts_are_usage_errors(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["generate", *argv, "hi"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and words in err and "Traceback" not in err


def test_ctx_takes_k_as_budget_does() -> None:
    from localinfer.cli import build_parser

    args = build_parser().parse_args(["generate", "--ctx", "8k", "hi"])
    assert args.ctx == 8192


def test_forced_setting_that_cannot_be_allocated_is_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--force past the budget, into an allocation no machine can make (1.5 TB of KV): the
    framework's allocator error becomes one line, not a traceback."""
    overcommit = Path("/proc/sys/vm/overcommit_memory")
    if not overcommit.exists() or overcommit.read_text().strip() == "1":
        pytest.skip("with overcommit always on the allocation succeeds and the OOM killer decides")
    argv = ["generate", "--backend", "torch", "--slots", "1000000", "--force", "hi"]
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith("localinfer: error: not enough memory for torch with 1000000 slot(s)")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--kv-ram", "lots"], "--kv-ram wants a size"),
        (["--kv-disk-cap", "huge"], "--kv-disk-cap wants a size"),
        (["--kv-dtype", "q3_k"], "unknown KV cache dtype 'q3_k'"),
        (["--backend", "torch", "--kv-dtype", "q8_0"], "keeps its KV cache in its compute dtype"),
    ],
)
def test_chat_refuses_bad_flags_before_the_window_opens(argv: list[str], words: str) -> None:
    """They surfaced only inside the chat, as a model that could not load, and exit status 0."""
    from localinfer.cli import build_parser
    from localinfer.commands.chat import check_flags_before_loading
    from localinfer.errors import InvalidParameterError

    args = build_parser().parse_args(["chat", *argv])
    with pytest.raises(InvalidParameterError, match=re.escape(words)):
        check_flags_before_loading(args)
    for fine in (["--kv-ram", "1GiB"], ["--quant", "UD-Q4_K_XL"], ["--kv-dtype", "Q8_0"]):
        check_flags_before_loading(build_parser().parse_args(["chat", *fine]))


@pytest.mark.parametrize(
    "text",
    [
        "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory",
        "CUDA out of memory. Tried to allocate 20.00 GiB",
        "[metal::malloc] Attempting to allocate 68719476736 bytes which is greater than ...",
        "[metal::malloc] Resource limit (499000) exceeded.",
        "[malloc] Unable to allocate 1024 bytes.",
    ],
)
def test_allocation_failures_of_each_framework_are_recognised(text: str) -> None:
    from localinfer.backends.select import _allocation_failure

    assert _allocation_failure(RuntimeError(text))
    assert _allocation_failure(MemoryError())
    assert not _allocation_failure(RuntimeError("shape '[2, 3]' is invalid for input of size 5"))


def test_a_dtype_hint_says_which_commands_have_the_flag() -> None:
    """chat and bench have no --dtype: the torch float32 hint names the commands that do."""
    from localinfer.backend_budget import compute_budget
    from localinfer.budget import BudgetRequest, ensure_fits
    from localinfer.errors import OutOfMemoryBudgetError

    report = compute_budget(
        BudgetRequest("qwen3-8b", ctx=16384, backend="torch", device="24GiB")
    )  # float32 on a CPU: only halving it fits
    assert any(s.change == "--dtype bfloat16" for s in report.suggestions)
    with pytest.raises(OutOfMemoryBudgetError, match=r"try --dtype bfloat16 \(generate, serve\)"):
        ensure_fits(report)


def test_a_broken_pipe_elsewhere_is_an_error_not_a_quiet_exit(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only stdout's reader going away is the quiet 141; a socket or child's broken pipe while
    stdout is fine is reported."""
    from localinfer.commands import generate

    def broken(args: object) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(generate, "run", broken)
    assert main(["generate", "hi"]) == 1
    assert "localinfer: error: [Errno 32] Broken pipe" in capsys.readouterr().err
