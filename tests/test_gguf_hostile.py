"""Hostile GGUF files through the real CLI: a real tiny model written with the test writer, then
one header field made impossible. ``localinfer generate`` (a separate process: llama.cpp used to
abort it with SIGABRT) and ``localinfer budget`` must print one line and exit 1, never a traceback.

Issue #18 items 5 (architecture numbers against the tensors) and 6 (parser gaps: nested arrays,
dimension products past 2^63, special-token ids outside the vocabulary). Special-token ids the
engine never reads (pad, unk) outside the vocabulary are dropped with one warning instead, as
llama.cpp runs such files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from gguf_writer import (
    raw_f32,
    raw_nested_array,
    raw_string,
    raw_u32,
    rewrite_gguf,
)
from model_files import TINY_VOCAB_SIZE, write_gguf
from tiny import tiny_config, tiny_weights

from localinfer.cli import main
from localinfer.loading.gguf_file import GGUFFile

pytestmark = pytest.mark.usefixtures("session_cache")


def one_key(
    case_id: str, key: str, raw: bytes, words: tuple[str, ...], budget_refuses: bool = True
) -> tuple[str, dict, tuple[str, ...], bool]:
    """A case whose one edit sets the metadata ``key`` to ``raw``."""
    return case_id, {"set_kv": {key: raw}}, words, budget_refuses


# (id, rewrite_gguf edits, words the one-line error must hold, whether `budget` refuses it too:
# the budget runs the header checks every architecture shares and block_count against the blk.N
# tensors; the tensor shapes are checked for the architectures localinfer runs, before any
# backend loads the file)
CASES: list[tuple[str, dict, tuple[str, ...], bool]] = [
    # item 5: architecture numbers against the tensors present
    one_key("block_count 0", "llama.block_count", raw_u32(0), ("block_count", "0")),
    one_key(
        "block_count 1e6",
        "llama.block_count",
        raw_u32(10**6),
        ("block_count", "1000000", "2 layers"),
    ),
    one_key("block_count 1", "llama.block_count", raw_u32(1), ("block_count", "1", "layer 1")),
    one_key("block_count 3", "llama.block_count", raw_u32(3), ("block_count", "3", "2 layers")),
    one_key(
        "block_count a string",
        "llama.block_count",
        raw_string("2"),
        ("block_count", "not an integer"),
    ),
    one_key("context_length 0", "llama.context_length", raw_u32(0), ("context_length",)),
    one_key(
        "embedding_length off by one",
        "llama.embedding_length",
        raw_u32(65),
        ("embedding_length", "65"),
    ),
    one_key("vocab_size past token_embd", "llama.vocab_size", raw_u32(10**6), ("vocab_size",)),
    one_key("rope.freq_base nan", "llama.rope.freq_base", raw_f32(float("nan")), ("freq_base",)),
    one_key(
        "rms epsilon 0",
        "llama.attention.layer_norm_rms_epsilon",
        raw_f32(0.0),
        ("layer_norm_rms_epsilon",),
    ),
    one_key("head_count 0", "llama.attention.head_count", raw_u32(0), ("head",)),
    one_key(
        "head_count 1000",
        "llama.attention.head_count",
        raw_u32(1000),
        ("attn_q", "head_count"),
        budget_refuses=False,
    ),
    one_key(
        "head_count_kv 3",
        "llama.attention.head_count_kv",
        raw_u32(3),
        ("3 groups",),
        budget_refuses=False,
    ),
    one_key(
        "head_count_kv 1",
        "llama.attention.head_count_kv",
        raw_u32(1),
        ("attn_k", "head_count_kv"),
        budget_refuses=False,
    ),
    (
        "key_length 1000",
        {
            "set_kv": {
                "llama.attention.key_length": raw_u32(1000),
                "llama.attention.value_length": raw_u32(1000),
            }
        },
        ("attn_q", "key_length"),
        False,
    ),
    one_key(
        "feed_forward_length 7",
        "llama.feed_forward_length",
        raw_u32(7),
        ("ffn_gate", "feed_forward_length"),
        budget_refuses=False,
    ),
    (
        "a layer tensor missing",
        {"drop_tensors": ["blk.1.ffn_down.weight"]},
        ("missing tensor 'blk.1.ffn_down.weight'",),
        False,
    ),
    # item 6: parser gaps
    one_key(
        "arrays nested 5000 deep", "x.nested", raw_nested_array(5000), ("x.nested", "nests arrays")
    ),
    (
        "a dimension of 2^63",
        {"tensor_dims": {"blk.0.attn_q.weight": (64, 2**63)}},
        ("blk.0.attn_q.weight", "2^63"),
        True,
    ),
    (
        "dimensions whose int64 product wraps negative",
        {"tensor_dims": {"blk.0.attn_q.weight": (64, 2**32, 2**31)}},
        ("blk.0.attn_q.weight", "2^63"),
        True,
    ),
    (
        "a dimension of 2^64-1",
        {"tensor_dims": {"blk.0.attn_q.weight": (64, 2**64 - 1)}},
        ("blk.0.attn_q.weight", "2^63"),
        True,
    ),
    one_key(
        "bos id outside the vocabulary",
        "tokenizer.ggml.bos_token_id",
        raw_u32(99999),
        ("bos_token_id", "99999", "vocabulary"),
    ),
    one_key(
        "eos id one past the vocabulary",
        "tokenizer.ggml.eos_token_id",
        raw_u32(TINY_VOCAB_SIZE),
        ("eos_token_id", str(TINY_VOCAB_SIZE)),
    ),
    one_key(
        "eot id outside the vocabulary",
        "tokenizer.ggml.eot_token_id",
        raw_u32(10**6),
        ("eot_token_id",),
    ),
    one_key(
        "eom id outside the vocabulary",
        "tokenizer.ggml.eom_token_id",
        raw_u32(TINY_VOCAB_SIZE),
        ("eom_token_id",),
    ),
    one_key(
        "pad id a string",
        "tokenizer.ggml.padding_token_id",
        raw_string("0"),
        ("padding_token_id", "not a token id"),
    ),
    one_key(
        "bos id a string",
        "tokenizer.ggml.bos_token_id",
        raw_string("1"),
        ("bos_token_id", "not a token id"),
    ),
    one_key("alignment a string", "general.alignment", raw_string("32"), ("general.alignment",)),
]
IDS = [case[0] for case in CASES]

# Ids only llama.cpp's tokenizer would read: it warns about bad ones and runs the file.
STRAY_IDS = {
    "tokenizer.ggml.padding_token_id": raw_u32(2**32 - 1),
    "tokenizer.ggml.unknown_token_id": raw_u32(10**6),
}


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    config = tiny_config("llama", vocab_size=TINY_VOCAB_SIZE)
    ws = tiny_weights(config)
    path = tmp_path_factory.mktemp("hostile") / "tiny.gguf"
    return write_gguf(path, config, {n: ws.get(n) for n in ws.names()})


def _hostile(tiny_gguf: Path, tmp_path: Path, edits: dict) -> Path:
    return rewrite_gguf(tiny_gguf, tmp_path / "hostile.gguf", **edits)


def _generate(path: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "localinfer", "generate", str(path), "Hi"]
    argv += ["--max-tokens", "2", "--ctx", "128", "--slots", "1", *extra]
    env = {**os.environ, "LOCALINFER_CACHE_DIR": str(cache)}
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)


def _assert_one_line_error(returncode: int, stderr: str, path: Path, words: tuple[str, ...]):
    assert returncode == 1, f"exit {returncode} (negative: killed by a signal)\n{stderr}"
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("localinfer: error: "), stderr
    assert str(path.name) in lines[0], "the error names the file"
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_the_unedited_file_generates(tiny_gguf: Path, tmp_path: Path) -> None:
    same = rewrite_gguf(tiny_gguf, tmp_path / "same.gguf")
    assert same.read_bytes() == tiny_gguf.read_bytes(), "the rewriter changes nothing by itself"
    done = _generate(same, tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    assert "finish:" in done.stderr


# `localinfer generate` of every hostile file, each in a process of its own, forked from one
# driver that has imported the CLI once: each child is the state of a fresh `python -m localinfer`
# (nothing an earlier case did leaks into it), its stderr is its file descriptor 2 (llama.cpp's
# own log included), and a SIGABRT ends only that child. One interpreter start instead of one per
# case: the start is most of a refusal's cost.
FORK_DRIVER = textwrap.dedent(
    """
    import json, os, sys, threading
    import localinfer.backend_budget, localinfer.loading.loader, localinfer.session
    from localinfer.cli import build_parser, main

    build_parser()  # imports every command: the children start with the modules loaded
    assert threading.active_count() == 1  # nothing a fork would copy half-way
    for case_id, path, cache, err in json.loads(sys.argv[1]):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # stdout: only this driver's lines
            os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
            os.environ["LOCALINFER_CACHE_DIR"] = cache
            argv = ["generate", path, "Hi", "--max-tokens", "2", "--ctx", "128", "--slots", "1"]
            try:
                code = main(argv)
            except SystemExit as exc:  # what `sys.exit(main())` would exit with
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        status = os.waitpid(pid, 0)[1]
        print(json.dumps([case_id, os.waitstatus_to_exitcode(status)]), flush=True)
    """
)


@pytest.fixture(scope="module")
def refusals(
    tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[int, str, Path]]:
    """Every case's (exit status, stderr, hostile file) from `generate` in its own process."""
    root = tmp_path_factory.mktemp("refusals")
    jobs = []
    for number, (case_id, edits, _, _) in enumerate(CASES):
        folder = root / str(number)
        folder.mkdir()
        path = _hostile(tiny_gguf, folder, edits)
        jobs.append([case_id, str(path), str(folder / "cache"), str(folder / "stderr")])
    done = subprocess.run(
        [sys.executable, "-c", FORK_DRIVER, json.dumps(jobs)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    codes = dict(json.loads(line) for line in done.stdout.splitlines())
    return {
        case_id: (codes[case_id], Path(err).read_text(), Path(path))
        for case_id, path, _, err in jobs
    }


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_generate_refuses_with_one_line(refusals: dict, case) -> None:
    case_id, _, words, _ = case
    returncode, stderr, path = refusals[case_id]
    _assert_one_line_error(returncode, stderr, path, words)


@pytest.mark.parametrize("case", [c for c in CASES if c[3]], ids=[c[0] for c in CASES if c[3]])
def test_budget_refuses_with_one_line(tiny_gguf: Path, tmp_path: Path, capsys, case) -> None:
    _, edits, words, _ = case
    path = _hostile(tiny_gguf, tmp_path, edits)
    code = main(["budget", str(path)])
    _assert_one_line_error(code, capsys.readouterr().err, path, words)


def _stray_warnings(stderr: str, path: Path) -> list[str]:
    lines = [line for line in stderr.splitlines() if "padding_token_id" in line]
    for line in lines:
        assert path.name in line and "unknown_token_id" in line and "ignoring" in line, line
    return lines


@pytest.mark.parametrize("backend", ["torch", "llamacpp"])
def test_stray_pad_and_unk_ids_are_dropped_with_one_warning(
    tiny_gguf: Path, tmp_path: Path, backend: str, capsys, caplog
) -> None:
    pytest.importorskip({"torch": "torch", "llamacpp": "llama_cpp"}[backend])
    path = _hostile(tiny_gguf, tmp_path, {"set_kv": STRAY_IDS})
    if backend == "llamacpp":  # a process of its own: llama.cpp reads the file, and could abort
        done = _generate(path, tmp_path / "cache", "--backend", backend)
        returncode, stderr, warned = done.returncode, done.stderr, done.stderr
    else:  # torch reads the file through localinfer's own loader: in this process (a separate
        # one would spend most of its time importing torch); the warning is a log record here
        argv = ["generate", str(path), "Hi", "--max-tokens", "2", "--ctx", "128"]
        returncode = main([*argv, "--slots", "1", "--backend", backend])
        stderr, warned = capsys.readouterr().err, caplog.text
    assert returncode == 0, stderr
    assert "Traceback" not in stderr and "finish:" in stderr, stderr
    assert len(_stray_warnings(warned, path)) == 1, warned


def test_stray_ids_leave_the_metadata_and_the_budget_runs(
    tiny_gguf: Path, tmp_path: Path, capsys, caplog
) -> None:
    path = _hostile(tiny_gguf, tmp_path, {"set_kv": STRAY_IDS})
    with GGUFFile(path) as gguf:
        assert not set(STRAY_IDS) & set(gguf.metadata)
        assert gguf.get("tokenizer.ggml.bos_token_id") is not None  # the used ones stay
    assert len(_stray_warnings(caplog.text, path)) == 1
    caplog.clear()
    assert main(["budget", str(path), "--device", "1GiB"]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert len(_stray_warnings(caplog.text, path)) == 1
