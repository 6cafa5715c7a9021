"""Grammar engines compared on the embedded SmolLM2-135M vocabulary (49,152 tokens): llguidance,
xgrammar and outlines-core, the candidates for constrained decoding (issue #20).

For each engine installed: the time to build its vocabulary index, the compile time of each JSON
schema (OpenAI's strict subset: objects, required, enums, arrays, nesting, anyOf, $defs, string
formats; median of --repeats), and the time of each token mask while walking a valid answer token
by token (the answer's own tokenization, then the EOS check), as p50/p99/max over every step of
every walk. It also probes regex and grammar support and reads each package's installed size and
declared requirements. An engine that is not installed is skipped with a line saying so.

    scripts/compare-grammar-engines
    scripts/compare-grammar-engines --repeats 5 --threads 1
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bench.structured_cases import obj

# numpy is imported where it is used, after the arguments are parsed: `--help` does not import it.
if TYPE_CHECKING:
    import numpy as np

STR, INT, NUM, BOOL = ({"type": t} for t in ("string", "integer", "number", "boolean"))
ITEM = obj(id=INT, label=STR)
FORMATS = {"when": "date-time", "day": "date", "email": "email"}
# Each schema comes with one valid instance: the walk feeds the instance's tokens.
SCHEMAS: dict[str, tuple[dict[str, Any], Any]] = {
    "flat": (obj(name=STR, age=INT), {"name": "Ada Lovelace", "age": 36}),
    "enum": (
        obj(
            status={"enum": ["active", "inactive", "pending"]},
            priority={"enum": [1, 2, 3]},
            done=BOOL,
        ),
        {"status": "pending", "priority": 2, "done": False},
    ),
    "arrays": (
        obj(tags={"type": "array", "items": STR}, scores={"type": "array", "items": NUM}),
        {"tags": ["red", "green", "blue"], "scores": [1.5, -2, 3.25e2]},
    ),
    "nested": (
        obj(user=obj(name=STR, address=obj(street=STR, city=STR, zip=STR))),
        {"user": {"name": "Bo", "address": {"street": "1 Main St", "city": "Oslo", "zip": "0150"}}},
    ),
    "anyOf": (
        obj(
            result={"anyOf": [obj(value=NUM), obj(error=STR)]},
            note={"anyOf": [STR, {"type": "null"}]},
        ),
        {"result": {"error": "division by zero"}, "note": None},
    ),
    "formats": (
        obj(**{k: {"type": "string", "format": f} for k, f in FORMATS.items()}),
        {"when": "2024-05-01T12:30:00Z", "day": "2024-05-01", "email": "ada@example.com"},
    ),
    "defs+ref": (
        {
            **obj(items={"type": "array", "items": {"$ref": "#/$defs/item"}}),
            "$defs": {"item": ITEM},
        },
        {"items": [{"id": 1, "label": "one"}, {"id": 2, "label": "two"}]},
    ),
    "tool-call": (
        obj(
            location=STR,
            unit={"type": "string", "enum": ["celsius", "fahrenheit"]},
            days=INT,
            include_hourly=BOOL,
            fields={"type": "array", "items": {"enum": ["temp", "wind", "rain", "uv"]}},
            lat={"type": ["number", "null"]},
            lon={"type": ["number", "null"]},
            lang=STR,
        ),
        json.loads(
            '{"location": "Paris, France", "unit": "celsius", "days": 3, "include_hourly": true,'
            ' "fields": ["temp", "rain"], "lat": 48.8566, "lon": null, "lang": "fr"}'
        ),
    ),
}
PROBE_REGEX = r"[0-9]{3}-[0-9]{4}"
PROBE_LARK = 'start: "yes" | "no"'
PROBE_EBNF = 'root ::= "yes" | "no"'


@dataclass
class Vocab:
    """The model's vocabulary as the engines need it: bytes per id, specials, EOS ids."""

    tokens: list[bytes]
    special_ids: frozenset[int]
    eos_ids: list[int]
    encode: Callable[[str], list[int]]

    @property
    def size(self) -> int:
        return len(self.tokens)


@dataclass
class Engine:
    """One engine behind four calls: compile a spec, start a matcher, fill a mask, advance."""

    package: str
    module: str
    setup: Callable[[Vocab, int], Any]  # -> engine state (vocabulary index)
    compile: Callable[[Any, str, Any], Any]  # (state, kind, source) -> compiled
    start: Callable[[Any], Any]  # compiled -> matcher
    fill: Callable[[Any, np.ndarray], None]  # writes the int32 bitmask
    advance: Callable[[Any, int], bool]
    grammar_kind: str = "grammar"
    grammar_source: str = ""
    results: dict[str, Any] = field(default_factory=dict)


def llguidance_engine() -> Engine:
    def setup(vocab: Vocab, threads: int) -> Any:
        import llguidance as llg

        class Wrapper:  # llguidance's TokenizerWrapper protocol; 0xff marks special tokens
            eos_token_id = vocab.eos_ids[0]
            bos_token_id = None
            tokens = [
                b"\xff" + t if i in vocab.special_ids else t for i, t in enumerate(vocab.tokens)
            ]
            special_token_ids = sorted(vocab.special_ids)

            def __call__(self, text: str | bytes) -> list[int]:
                return vocab.encode(text.decode() if isinstance(text, bytes) else text)

        return llg.LLTokenizer(
            llg.TokenizerWrapper(Wrapper()), n_vocab=vocab.size, eos_token=vocab.eos_ids
        )

    def compile_(tok: Any, kind: str, source: Any) -> Any:
        import llguidance as llg

        build = {"json": "grammar_from_json_schema", "regex": "grammar_from_regex"}
        grammar = getattr(llg.LLMatcher, build.get(kind, "grammar_from_lark"))(source)
        matcher = llg.LLMatcher(tok, grammar, log_level=0)  # builds the lexer: the compile step
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher

    def start(compiled: Any) -> Any:
        return compiled.deep_copy()  # a compiled matcher is copied per request

    def fill(matcher: Any, mask: np.ndarray) -> None:
        matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)

    def advance(matcher: Any, token: int) -> bool:
        return matcher.consume_token(token)

    return Engine(
        "llguidance", "llguidance", setup, compile_, start, fill, advance, "lark", PROBE_LARK
    )


def xgrammar_engine() -> Engine:
    def setup(vocab: Vocab, threads: int) -> Any:
        import xgrammar as xgr

        # A special token other than EOS maps to b"": xgrammar then never allows it.
        tokens = [
            b"" if i in vocab.special_ids and i not in vocab.eos_ids else t
            for i, t in enumerate(vocab.tokens)
        ]
        info = xgr.TokenizerInfo(
            tokens, xgr.VocabType.RAW, vocab_size=vocab.size, stop_token_ids=vocab.eos_ids
        )
        return xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)

    def compile_(compiler: Any, kind: str, source: Any) -> Any:
        if kind == "json":
            return compiler.compile_json_schema(json.dumps(source))
        if kind == "regex":
            return compiler.compile_regex(source)
        return compiler.compile_grammar(source)

    def start(compiled: Any) -> Any:
        import xgrammar as xgr

        return xgr.GrammarMatcher(compiled)

    def fill(matcher: Any, mask: np.ndarray) -> None:
        matcher.fill_next_token_bitmask(mask)  # a numpy array works (DLPack)

    def advance(matcher: Any, token: int) -> bool:
        return matcher.accept_token(token)

    return Engine("xgrammar", "xgrammar", setup, compile_, start, fill, advance, "ebnf", PROBE_EBNF)


def outlines_engine() -> Engine:
    def setup(vocab: Vocab, threads: int) -> Any:
        import outlines_core as oc

        by_bytes: dict[bytes, list[int]] = {}
        for i, t in enumerate(vocab.tokens):
            if i not in vocab.special_ids:
                by_bytes.setdefault(t, []).append(i)
        return oc.Vocabulary(vocab.eos_ids[0], by_bytes)  # one EOS id only

    def compile_(vocabulary: Any, kind: str, source: Any) -> Any:
        import outlines_core as oc

        if kind == "json":
            source = oc.json_schema.build_regex_from_schema(json.dumps(source))
        elif kind != "regex":
            raise ValueError("regular languages only: no context-free grammar")
        return oc.Index(source, vocabulary)

    def start(index: Any) -> Any:
        import outlines_core as oc

        return oc.Guide(index)

    def fill(guide: Any, mask: np.ndarray) -> None:
        guide.write_mask_into(mask.ctypes.data, mask.size, 4)

    def advance(guide: Any, token: int) -> bool:
        guide.advance(token, return_tokens=False)
        return True

    return Engine("outlines-core", "outlines_core", setup, compile_, start, fill, advance, "-", "")


def allowed(mask: np.ndarray, token: int) -> bool:
    return bool((int(mask[token >> 5]) >> (token & 31)) & 1)


def walk(engine: Engine, compiled: Any, tokens: list[int], vocab: Vocab, times: list[float]) -> str:
    """Feed ``tokens`` through a fresh matcher, timing each mask; then the end must allow EOS."""
    import numpy as np

    state = engine.start(compiled)
    mask = np.zeros((vocab.size + 31) // 32, dtype=np.int32)
    for step, token in enumerate([*tokens, None]):
        t0 = time.perf_counter()
        engine.fill(state, mask)
        times.append(time.perf_counter() - t0)
        if token is None:
            return "ok" if any(allowed(mask, e) for e in vocab.eos_ids) else "no EOS at the end"
        if not allowed(mask, token) or not engine.advance(state, token):
            return f"token {step} refused"
    return "ok"


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def measure(engine: Engine, vocab: Vocab, args: argparse.Namespace) -> None:
    state, engine.results["setup"] = timed(lambda: engine.setup(vocab, args.threads))
    compile_ms: dict[str, tuple[float, ...] | str] = {}
    mask_times: list[float] = []
    for name, (schema, instance) in SCHEMAS.items():
        tokens = vocab.encode(json.dumps(instance, separators=(",", ":")))
        runs: list[tuple[float, float]] = []  # (compile, compile + the first mask)
        try:
            for _ in range(args.repeats):
                compiled, seconds = timed(lambda s=schema: engine.compile(state, "json", s))
                masks: list[float] = []
                verdict = walk(engine, compiled, tokens, vocab, masks)
                runs.append((seconds, seconds + masks[0]))
                mask_times += masks
        except Exception as exc:  # an engine that refuses a schema: reported, not fatal
            compile_ms[name] = f"error: {str(exc).splitlines()[0][:40]}"
            continue
        medians = tuple(statistics.median(r) * 1e3 for r in zip(*runs, strict=True))
        compile_ms[name] = medians if verdict == "ok" else verdict
    engine.results["compile"] = compile_ms
    engine.results["mask"] = mask_times
    engine.results["regex"] = probe(lambda: engine.compile(state, "regex", PROBE_REGEX))
    grammar_ok = probe(lambda: engine.compile(state, engine.grammar_kind, engine.grammar_source))
    engine.results["grammar"] = engine.grammar_kind if grammar_ok == "yes" else "no"


def probe(fn: Callable[[], Any]) -> str:
    try:
        fn()
    except Exception:
        return "no"
    return "yes"


def install_weight(package: str) -> tuple[str, str, str]:
    """(version, installed MB of the package itself, its declared runtime requirements)."""
    dist = md.distribution(package)
    size = sum((f.size or 0) for f in dist.files or [])
    needs = [r.split(";")[0].strip() for r in dist.requires or [] if "extra ==" not in r]
    return dist.version, f"{size / 2**20:.1f}", ", ".join(needs) or "none"


def percentile(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def print_tables(engines: list[Engine]) -> None:
    head = ["engine", "version", "MB", "vocab ms", "compile ms", "+1st mask ms", "mask p50 us",
            "p99 us", "max us", "schemas", "regex", "grammar"]  # fmt: skip
    rows = [head]
    for e in engines:
        r = e.results
        ok = [v for v in r["compile"].values() if isinstance(v, tuple)]
        version, size, _ = install_weight(e.package)
        rows.append([
            e.package, version, size, f"{r['setup'] * 1e3:.0f}",
            *([f"{statistics.median(v):.1f}" for v in zip(*ok, strict=True)] or ["-", "-"]),
            f"{percentile(r['mask'], 50) * 1e6:.0f}", f"{percentile(r['mask'], 99) * 1e6:.0f}",
            f"{max(r['mask'], default=float('nan')) * 1e6:.0f}",
            f"{len(ok)}/{len(SCHEMAS)}", r["regex"], r["grammar"],
        ])  # fmt: skip
    print_rows(rows)
    print("\ncompile ms / compile + first mask ms, per schema (medians; failures say so)")
    rows = [["schema", *(e.package for e in engines)]]
    for name in SCHEMAS:
        cells = [e.results["compile"][name] for e in engines]
        rows.append(
            [name, *(c if isinstance(c, str) else f"{c[0]:.1f} / {c[1]:.1f}" for c in cells)]
        )
    print_rows(rows)
    print("\ndeclared runtime requirements")
    for e in engines:
        print(f"  {e.package}: {install_weight(e.package)[2]}")


def print_rows(rows: list[list[str]]) -> None:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def load_vocab() -> Vocab:
    from localinfer.loading.embedded import embedded_model_path
    from localinfer.loading.loader import load_model

    tok = load_model(embedded_model_path()).tokenizer
    return Vocab(
        tokens=[tok.token_bytes(i) for i in range(tok.vocab_size)],
        special_ids=frozenset(tok.special_ids),
        eos_ids=list(tok.eos_ids),
        encode=lambda text: tok.encode(text, parse_special=False),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="scripts/compare-grammar-engines",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--repeats", type=int, default=3, help="compiles (and walks) per schema")
    parser.add_argument(
        "--threads", type=int, default=2, help="compile threads where an engine takes them"
    )
    args = parser.parse_args()
    vocab = load_vocab()
    shape = f"{len(SCHEMAS)} schemas x {args.repeats}"
    print(f"vocabulary: {vocab.size} tokens, EOS {vocab.eos_ids}; {shape}")
    engines = []
    for engine in (llguidance_engine(), xgrammar_engine(), outlines_engine()):
        try:
            __import__(engine.module)
        except ImportError as exc:
            print(f"{engine.package}: not installed ({exc}); skipped")
            continue
        measure(engine, vocab, args)
        engines.append(engine)
    if engines:
        print()
        print_tables(engines)


if __name__ == "__main__":
    main()
