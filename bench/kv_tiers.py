"""The KV-tier rows of ``scripts/bench-prefix`` (issue #24): each row runs the same prompts warm
and cold in one run on one model and compares TTFT medians.

(i)   two conversations alternating on one slot: RAM tier on vs off (each turn finds the slot
      holding the other conversation; with the tier its own cells come back from host RAM);
(ii)  eight conversations sharing a ~1,000-token system prompt on four slots, each arriving
      while the previous one streams: prefix copy between slots on vs off, with how many
      system-prompt tokens were prefilled in all;
(iii) a ~2,000-token conversation reopened after a process restart: a first process writes its
      KV through the disk tier, then a new Python process opens the same ``--kv-disk`` folder
      and asks the next turn, against a new process without it (``python -m
      bench.kv_tiers probe`` is that process).

The documents are Python's own module docstrings: fixed, offline, real prose and code.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.child import child_env, module_argv
from localinfer.engine import Request, SamplingParams
from localinfer.session import Session, open_session

TARGET = 0.2  # warm TTFT <= 0.2x cold, for the RAM and disk tiers (issue #24)
PROBE = SamplingParams(max_tokens=1)


@dataclass(slots=True, frozen=True)
class TierRow:
    """One row: TTFT medians warm and cold, and what else the row measured."""

    name: str
    warm_s: float | None  # None: the row could not run (``note`` says why)
    cold_s: float | None
    note: str
    target: float | None = None  # the warm/cold ratio the row must meet, if any

    @property
    def ratio(self) -> float | None:
        if not self.warm_s or not self.cold_s:
            return None
        return self.warm_s / self.cold_s

    def line(self) -> str:
        if self.warm_s is None or self.cold_s is None or self.ratio is None:
            return f"{self.name:<44} {'-':>9} {'-':>9} {'-':>6}  {self.note}"
        verdict = ""
        if self.target is not None:
            met = "meets" if self.ratio <= self.target else "MISSES"
            verdict = f"({met} <= {self.target:.2f}) "
        return (
            f"{self.name:<44} {self.warm_s * 1000:>7.0f}ms {self.cold_s * 1000:>7.0f}ms "
            f"{self.ratio:>6.2f}  {verdict}{self.note}"
        )


def header() -> str:
    return f"{'KV tiers (#24)':<44} {'warm TTFT':>9} {'cold TTFT':>9} {'ratio':>6}  detail"


def document(*names: str) -> str:
    """Module docstrings joined: json ~950, argparse ~575, unittest ~485 tokens (SmolLM2)."""
    import importlib

    return "\n\n".join((importlib.import_module(n).__doc__ or "").strip() for n in names)


def kv(ram: str | None = None, disk: Path | None = None) -> Any:
    from localinfer.kv_options import KVTierOptions

    return KVTierOptions(ram=ram, disk=disk)


def ttft(session: Session, ids: list[int], params: SamplingParams) -> tuple[float, Any]:
    result = session.engine.generate(Request(ids, params))
    assert result.metrics is not None and result.metrics.ttft_s is not None
    return result.metrics.ttft_s, result


def warm_up(session: Session) -> None:
    session.engine.generate(Request(session.raw_prompt_ids("warm up"), PROBE))


# -- (i) two conversations alternating on one slot -----------------------------------------------


def alternating_row(open_kw: dict[str, Any], turns: int, answer_tokens: int) -> TierRow:
    name = "(i) 2 conversations alternating on 1 slot"
    docs = {"a": document("argparse"), "b": document("unittest")}
    questions = [
        "Summarise this in two sentences.",
        "What is the main class?",
        "Give one example.",
        "What can go wrong?",
        "Anything else?",
    ]
    answer = SamplingParams(max_tokens=answer_tokens)
    on = open_session(**open_kw, slots=1, kv=kv(ram="512MiB"))
    off = open_session(**open_kw, slots=1, kv=None)
    warm: list[float] = []
    cold: list[float] = []
    cached: list[tuple[int, int]] = []
    try:
        for s in (on, off):
            warm_up(s)
        chats: dict[str, list[dict[str, str]]] = {k: [] for k in docs}
        before = dict(on.engine.metrics().reused_tokens_by_source)
        for turn in range(turns):
            for key, doc in docs.items():
                q = questions[turn % len(questions)]
                chats[key].append({"role": "user", "content": f"{doc}\n\n{q}" if not turn else q})
                ids = on.chat_prompt_ids(chats[key])
                t_on, result = ttft(on, ids, answer)
                t_off, _ = ttft(off, ids, PROBE)
                chats[key].append({"role": "assistant", "content": result.text})
                if turn:  # the slot holds the other conversation now
                    warm.append(t_on)
                    cold.append(t_off)
                    cached.append((result.metrics.cached_tokens, len(ids)))
        after = on.engine.metrics().reused_tokens_by_source
    finally:
        on.close()
        off.close()
    ram = after.get("ram", 0) - before.get("ram", 0)
    c, p = statistics.median(x[0] for x in cached), statistics.median(x[1] for x in cached)
    note = (
        f"{on.backend}; {len(warm)} turns; cached median {c:.0f} of {p:.0f} prompt tokens "
        f"({ram} from RAM)"
    )
    return TierRow(name, statistics.median(warm), statistics.median(cold), note, TARGET)


# -- (ii) eight conversations sharing a system prompt on four slots ------------------------------


def staggered(session: Session, prompts: Sequence[list[int]], answer: SamplingParams) -> list[Any]:
    """Submit each prompt once the previous one has its first token (so they overlap); the
    results in order."""
    handles = []
    for ids in prompts:
        handle = session.engine.submit(Request(ids, answer))
        next(iter(handle))
        handles.append(handle)
    return [h.result() for h in handles]


def shared_system_row(open_kw: dict[str, Any], answer_tokens: int) -> TierRow:
    name = "(ii) 8 conversations, shared system prompt"
    system = document("json") + "\n\nAnswer questions about the text above in one sentence."
    questions = [
        "What is this about?",
        "Name one function.",
        "What is JSON?",
        "How do I read a file?",
        "How do I write a file?",
        "What about errors?",
        "Is it fast?",
        "Give an example.",
    ]
    answer = SamplingParams(max_tokens=answer_tokens)
    results: dict[bool, list[Any]] = {}
    backend = ""
    for copy in (True, False):
        with open_session(**open_kw, slots=4) as s:
            backend = s.backend
            s.engine._scheduler.placer.copy = copy  # the one switch this row compares
            warm_up(s)
            prompts = [
                s.chat_prompt_ids(
                    [{"role": "system", "content": system}, {"role": "user", "content": q}]
                )
                for q in questions
            ]
            results[copy] = staggered(s, prompts, answer)
    shared = min(_shared(prompts[0], p) for p in prompts[1:])
    sys_prefilled = {
        copy: sum(max(0, shared - r.metrics.cached_tokens) for r in rs)
        for copy, rs in results.items()
    }
    on = statistics.median(r.metrics.ttft_s for r in results[True])
    off = statistics.median(r.metrics.ttft_s for r in results[False])
    note = (
        f"{backend}; copy on vs off; {shared}-token shared prefix prefilled "
        f"{sys_prefilled[True]} vs {sys_prefilled[False]} tokens in all"
    )
    return TierRow(name, on, off, note)


def _shared(a: Sequence[int], b: Sequence[int]) -> int:
    from localinfer.engine.slots import shared_prefix

    return shared_prefix(a, b)


# -- (iii) a conversation reopened after a process restart ---------------------------------------


def disk_restart_row(
    open_kw: dict[str, Any], repeats: int, answer_tokens: int, log: Callable[[str], None]
) -> TierRow:
    name = "(iii) 2,000-token conversation, new process"
    with tempfile.TemporaryDirectory(prefix="bench-kv-disk-") as tmp:
        folder = Path(tmp) / "kv"
        text = document("json", "argparse", "unittest") + "\n\nSummarise."
        messages = [{"role": "user", "content": text}]
        with open_session(**open_kw, slots=2, kv=kv(ram="0", disk=folder)) as s:
            ids = s.chat_prompt_ids(messages)
            result = s.engine.generate(Request(ids, SamplingParams(max_tokens=answer_tokens)))
            stored = s.engine.persist_prefix(ids + list(result.token_ids))
            messages += [
                {"role": "assistant", "content": result.text},
                {"role": "user", "content": "And in one word?"},
            ]
            nxt = s.chat_prompt_ids(messages)
            backend = s.backend
        ids_file = Path(tmp) / "ids.json"
        ids_file.write_text(json.dumps(nxt))
        log(f"disk row: {stored} tokens written by the first process; prompt {len(nxt)} tokens")
        warm, cold, cached = [], [], []
        for _ in range(repeats):
            w = _probe(open_kw, ids_file, folder)
            c = _probe(open_kw, ids_file, None)
            warm.append(w["ttft_s"])
            cold.append(c["ttft_s"])
            cached.append(w["cached"])
    note = (
        f"{backend}; prompt {len(nxt)} tokens, {statistics.median(cached):.0f} restored from disk "
        f"(first process stored {stored}); medians of {repeats} new processes each"
    )
    return TierRow(name, statistics.median(warm), statistics.median(cold), note, TARGET)


def _probe(open_kw: dict[str, Any], ids_file: Path, folder: Path | None) -> dict[str, Any]:
    cmd = module_argv("bench.kv_tiers", "probe", str(ids_file))
    for flag, key in (
        ("--model", "model_spec"),
        ("--backend", "backend"),
        ("--threads", "threads"),
        ("--ctx", "ctx"),
    ):
        if open_kw.get(key) is not None:
            cmd += [flag, str(open_kw[key])]
    if folder is not None:
        cmd += ["--kv-disk", str(folder)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=child_env()).stdout
    return json.loads(out.strip().splitlines()[-1])


def probe_main(argv: Sequence[str]) -> int:
    """A new process: open a session (with ``--kv-disk`` or none), warm up, time the first token
    of the prompt in IDS_FILE; prints one JSON line."""
    ap = argparse.ArgumentParser(prog="python -m bench.kv_tiers probe")
    ap.add_argument("ids_file", type=Path)
    ap.add_argument("--model", default=None)
    ap.add_argument("--backend", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--ctx", type=int, default=None)
    ap.add_argument("--kv-disk", type=Path, default=None)
    args = ap.parse_args(argv)
    ids = json.loads(args.ids_file.read_text())
    tiers = kv(ram="0", disk=args.kv_disk) if args.kv_disk else None
    open_kw = {"backend": args.backend, "threads": args.threads, "slots": 2, "kv": tiers}
    if args.ctx is not None:
        open_kw["ctx"] = args.ctx
    with open_session(args.model, **open_kw) as s:
        warm_up(s)
        seconds, result = ttft(s, ids, PROBE)
        by_source = s.engine.metrics().reused_tokens_by_source
    print(
        json.dumps(
            {"ttft_s": seconds, "cached": result.metrics.cached_tokens, "sources": by_source}
        )
    )
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["probe"]:
        sys.exit(probe_main(sys.argv[2:]))
    sys.exit("usage: python -m bench.kv_tiers probe IDS_FILE [--kv-disk DIR] ...")
