"""A second turn about the same image (#37): TTFT of turn 2 against turn 1 through `localinfer
serve --backend llamacpp`, on a real-shape random Gemma 3 vision model made offline.
  scripts/bench-vision                       gemma3-1b-shaped Q4_K_M + a 4-layer SigLIP, 3 repeats
  scripts/bench-vision --layers 27           SigLIP's whole depth (minutes an image on 2 cores)
  scripts/bench-vision --model M.gguf --mmproj P.gguf      any model and projector instead

The default model: bench/random_gguf.py's gemma3-1b shape (Q4_K_M, quantized by `localinfer
quantize`) and bench/random_mmproj.py's Gemma 3 SigLIP projector (896x896 images in 4,096
patches 1,152 wide, pooled into 256 image tokens) made as wide as that text model; both written
once into the user's cache. The projector has 4 of SigLIP's 27 layers by default: the whole
encoder takes minutes an image on two cores, and a shallower one only makes turn 1 cheaper than
the real model's, so the ratio it gives is an upper bound.

Each repeat, on one slot: turn 1 asks a question about a new random PNG (cold: the image is
encoded and every token prefilled; its answer is generated greedily, --answer-tokens long); turn 2
sends that image and question again, the answer as the assistant's message and a new question
(the slot's cached cells hold the image: only the answer's tail and the new question prefill); then
the same turn 2 with another image of the same size, a reference that no cache can serve (the
image is encoded again). TTFT is the client's: from sending the streamed request to its first
chunk carrying text or a finish. Figures are medians; the target is turn 2 / turn 1 <= 0.3.
The last line is the figures as JSON.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

# numpy, the HTTP client and the server stack (bench/peer_servers.py) are imported where they
# are used: `--help` imports none of them.
if TYPE_CHECKING:
    from bench.peer_servers import Server

TARGET = 0.3
FIRST = "Describe this picture in a few words."
SECOND = "What colour is most common in it, and where?"
TEXT_SHAPE = "gemma3-1b"  # a 4B text model prefills too slowly on two cores for a quick bench


@dataclass(slots=True)
class Turn:
    """One streamed chat completion as the client saw it."""

    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    text: str


@dataclass(slots=True)
class Repeat:
    first: Turn  # a new image
    second: Turn  # the same image again, after the first answer
    other: Turn  # the second turn with another image: the cold reference


def gguf_int(path: Path, suffix: str) -> int:
    """The integer metadata field of ``path`` whose key ends with ``suffix``."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    for key, field in reader.fields.items():
        if key.endswith(suffix):
            return int(field.parts[field.data[0]][0])
    raise KeyError(f"{path}: no {suffix} field")


def check_widths(model: Path, projector: Path) -> int:
    """The text model's hidden size, after checking that the projector's image tokens are as
    wide (mtmd refuses a pair that differs; this says why before a server starts)."""
    text = gguf_int(model, ".embedding_length")
    image = gguf_int(projector, "clip.vision.projection_dim")
    if text != image:
        raise SystemExit(
            f"{projector.name} makes {image}-wide image tokens; {model.name} is {text}"
        )
    return text


def default_pair(layers: int) -> tuple[Path, Path]:
    """The cached gemma3-1b-shaped Q4_K_M and a SigLIP projector of ``layers`` layers as wide
    as it (written first when missing: minutes, once)."""
    from bench.random_gguf import cached_q4_k_m
    from bench.random_mmproj import GEMMA3_SIGLIP, cached_pair

    model = cached_q4_k_m(TEXT_SHAPE)
    width = gguf_int(model, ".embedding_length")
    # cached_pair also writes a two-layer text model of that width beside it (small, unused).
    _, projector = cached_pair(replace(GEMMA3_SIGLIP, layers=layers, text_width=width))
    return model, projector


def png_url(seed: int, side: int) -> str:
    """A ``side`` x ``side`` PNG of random pixels (each seed another image) as a data: URL."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def user_turn(image_url: str, question: str) -> dict[str, Any]:
    # The image first: only the template's few tokens before it are shared with another image.
    content = [{"type": "image_url", "image_url": {"url": image_url}},
               {"type": "text", "text": question}]  # fmt: skip
    return {"role": "user", "content": content}


def chat(server: Server, messages: list[dict[str, Any]], max_tokens: int) -> Turn:
    """A greedy streamed chat completion of exactly ``max_tokens`` tokens; its client-side TTFT
    and usage."""
    import httpx

    body = {"model": server.model, "messages": messages, "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    parts: list[str] = []
    usage: dict[str, Any] = {}
    ttft: float | None = None
    t0 = time.perf_counter()
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=900) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read().decode()[:500]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content") or ""
                parts.append(text)
                # A first token may hold half a character (no text yet): its finish counts too.
                if ttft is None and (text or choice.get("finish_reason")):
                    ttft = time.perf_counter() - t0
    if ttft is None or not usage:
        raise RuntimeError("the stream ended without a token or usage")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return Turn(usage["prompt_tokens"], cached, ttft, "".join(parts))


def one_repeat(server: Server, seed: int, side: int, answer_tokens: int) -> Repeat:
    image, other = png_url(2 * seed, side), png_url(2 * seed + 1, side)
    first = chat(server, [user_turn(image, FIRST)], answer_tokens)

    def second_turn(image_url: str) -> list[dict[str, Any]]:
        return [user_turn(image_url, FIRST), {"role": "assistant", "content": first.text},
                {"role": "user", "content": SECOND}]  # fmt: skip

    second = chat(server, second_turn(image), 1)
    # After the real turn 2: on the one slot it replaces the first image's cells.
    return Repeat(first, second, chat(server, second_turn(other), 1))


def start_serve(model: Path, projector: Path, args: argparse.Namespace) -> Server:
    """`localinfer serve` on llama.cpp with one slot, the projector named."""
    from bench.peer_servers import start
    from localinfer.server.host import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "localinfer", "serve", str(model), "--mmproj", str(projector),
           "--backend", "llamacpp", "--port", str(port), "--slots", "1", "--ctx", str(args.ctx),
           "--log-level", "warning", "--served-name", "bench"]  # fmt: skip
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    url = f"http://127.0.0.1:{port}"
    return start("localinfer serve", cmd, url, "/health", extra_body={}, model="bench")


def summary(runs: list[Repeat]) -> dict[str, Any]:
    """The medians and ratios the table and the JSON line print."""

    def median(pick: Any) -> float:
        return float(statistics.median(pick(r) for r in runs))

    rows = {}
    for name in ("first", "second", "other"):
        rows[name] = {
            "prompt": median(lambda r, n=name: getattr(r, n).prompt_tokens),
            "cached": median(lambda r, n=name: getattr(r, n).cached_tokens),
            "ttft_ms": 1000 * median(lambda r, n=name: getattr(r, n).ttft_s),
        }
    ratio = rows["second"]["ttft_ms"] / rows["first"]["ttft_ms"]
    per_run = [r.second.ttft_s / r.first.ttft_s for r in runs]
    return {
        **rows,
        "ratio": ratio,
        "ratio_cold": rows["second"]["ttft_ms"] / rows["other"]["ttft_ms"],
        "per_run_ratios": per_run,
        # The second turn starts from every cell of the first turn's prompt, image included.
        "image_reused": all(r.second.cached_tokens >= r.first.prompt_tokens for r in runs),
        "met": ratio <= TARGET,
        "loadavg": list(os.getloadavg()),
    }


def table(s: dict[str, Any]) -> list[str]:
    lines = [f"{'turn':28} {'prompt':>7} {'cached':>7} {'prefilled':>9} {'TTFT':>10} "
             f"{'vs turn 1':>9}"]  # fmt: skip
    labels = {"first": "1 (new image)", "second": "2 (same image)",
              "other": "2 (another image: no reuse)"}  # fmt: skip
    for key, label in labels.items():
        row = s[key]
        lines.append(f"{label:28} {row['prompt']:7.0f} {row['cached']:7.0f} "
                     f"{row['prompt'] - row['cached']:9.0f} {row['ttft_ms']:8.0f}ms "
                     f"{row['ttft_ms'] / s['first']['ttft_ms']:9.2f}")  # fmt: skip
    per_run = s["per_run_ratios"]
    lines.append(
        f"turn 2 / turn 1: {s['ratio']:.3f} (per run {min(per_run):.3f}..{max(per_run):.3f}; "
        f"target <= {TARGET:.2f}: {'met' if s['met'] else 'NOT met'}); turn 2 / turn 2 with "
        f"another image: {s['ratio_cold']:.3f}; turn 2 reused turn 1's whole prompt, image "
        f"included: {'yes' if s['image_reused'] else 'NO'}"
    )
    lines.append("load average (1, 5, 15 min): " + " ".join(f"{x:.2f}" for x in s["loadavg"]))
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(prog="scripts/bench-vision", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--model", type=Path, help="a GGUF (default: the random gemma3-1b shape)")
    ap.add_argument("--mmproj", type=Path, help="its projector (with --model)")
    ap.add_argument("--layers", type=int, default=4, help="the default projector's depth")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--image-side", type=int, default=896, help="each PNG's width and height")
    ap.add_argument("--answer-tokens", type=int, default=24, help="turn 1's answer")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if (args.model is None) != (args.mmproj is None):
        ap.error("--model and --mmproj go together")
    t0, load = time.perf_counter(), " ".join(f"{x:.2f}" for x in os.getloadavg())
    model, projector = (args.model, args.mmproj) if args.model else default_pair(args.layers)
    width = check_widths(model, projector)
    server = start_serve(model, projector, args)
    try:
        chat(server, [user_turn(png_url(10**6, args.image_side), FIRST)], 1)  # first-call costs
        print(f"{model.name} + {projector.name} ({width} wide) · serve --backend llamacpp, one "
              f"slot, ctx {args.ctx}, threads {args.threads or 'default'} · "
              f"{args.image_side}x{args.image_side} PNGs · median of {args.repeats} · ready in "
              f"{time.perf_counter() - t0:.0f} s · load average at start {load}",
              flush=True)  # fmt: skip
        runs = []
        for seed in range(args.repeats):
            runs.append(one_repeat(server, seed, args.image_side, args.answer_tokens))
            print(f"repeat {seed + 1}/{args.repeats}: {time.perf_counter() - t0:.0f} s elapsed",
                  file=sys.stderr, flush=True)  # fmt: skip
    except Exception:
        print(f"the server's last words:\n{server.log_tail(20)}", file=sys.stderr)
        raise
    finally:
        server.stop()
    s = summary(runs)
    print("\n".join(table(s)))
    figures = [{k: {f: v for f, v in t.items() if f != "text"} for k, t in asdict(r).items()}
               for r in runs]  # fmt: skip
    print(json.dumps({**s, "runs": figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
