"""torch's int8 / int4 products on CUDA against the device's memory bandwidth (scripts/gpu-check).

A one-token product reads every weight once, so its best time is weight bytes / bandwidth. For
Llama-3-8B's and SmolLM2-135M's matrix shapes this measures, in one run: the bandwidth (a sum
over a buffer far larger than the caches, median of several), then per shape and form (bf16,
int8 per row, int4 in groups of 32 / 64 / 128) the kernel KernelChooser picks, its error against
the dequantized product, the median time of a one-token product (CUDA events) and its bytes
read / time as a ratio to the bandwidth, and its speed-up over bf16. Then whole decode steps of
the torch runner (bf16, int8, int4) on SmolLM2-135M's shapes (random weights: same bytes, same
speed), each as a ratio to bandwidth / weight bytes per step.

    scripts/bench-quant-cuda
    scripts/bench-quant-cuda --device cpu --quick     # smoke run of the script itself
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

SHAPES = {  # name -> (out, in)
    "8B q|k|v": (6144, 4096),
    "8B o": (4096, 4096),
    "8B gate|up": (28672, 4096),
    "8B down": (4096, 14336),
    "8B head": (128256, 4096),
    "135M gate|up": (3072, 576),
    "135M down": (576, 1536),
}
FORMS = (("bf16", 0, 0), ("int8", 8, 0), ("int4-g32", 4, 32), ("int4-g64", 4, 64),
         ("int4-g128", 4, 128))  # fmt: skip


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/bench-quant-cuda",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument("--device", default="cuda")
    p.add_argument("--iters", type=int, default=50, help="timed products per figure")
    p.add_argument("--bandwidth-mib", type=int, default=4096, help="buffer for the bandwidth run")
    p.add_argument("--steps", type=int, default=48, help="decode steps per runner")
    p.add_argument("--quick", action="store_true", help="small shapes and few iterations")
    return p.parse_args()


class Timer:
    """Median seconds of ``fn()``: CUDA events on a GPU, perf_counter elsewhere."""

    def __init__(self, torch, device) -> None:
        self.torch, self.cuda = torch, device.type == "cuda"

    def median(self, fn, iters: int) -> float:
        for _ in range(3):
            fn()
        times = []
        for _ in range(iters):
            if self.cuda:
                start = self.torch.cuda.Event(enable_timing=True)
                end = self.torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)


def bandwidth(torch, device, timer: Timer, mib: int) -> float:
    buf = torch.ones(mib * 2**20 // 4, dtype=torch.float32, device=device)
    seconds = timer.median(buf.sum, 9)
    return mib * 2**20 / seconds


def product_rows(torch, device, timer: Timer, args, bw: float) -> None:
    import torch.nn.functional as F

    from localinfer.backends.torch.quant_kernels import KernelChooser
    from localinfer.backends.torch.quant_layout import quantize_int4, quantize_int8

    print(f"{'matrix':<13} {'form':<9} {'kernel':<9} {'rel err':>8} {'us':>8} "
          f"{'GB/s':>7} {'x bw':>6} {'x bf16':>7}")  # fmt: skip
    shapes = {"small": (256, 512)} if args.quick else SHAPES
    for name, (out_f, in_f) in shapes.items():
        w = torch.randn(out_f, in_f, device=device) * 0.02
        x = torch.randn(1, in_f, device=device).to(torch.bfloat16)
        dense = w.to(torch.bfloat16)
        base = timer.median(lambda x=x, dense=dense: F.linear(x, dense), args.iters)
        for form, bits, group in FORMS:
            if not bits:
                kernel, err, seconds, nbytes = "dense", 0.0, base, dense.numel() * 2
            else:
                m = quantize_int8(w) if bits == 8 else quantize_int4(w, group)
                linear = KernelChooser(bits, torch.bfloat16, device).build(m)
                want = F.linear(x.float(), m.to(device).dequantize(torch.float32))
                err = float((linear(x).float() - want).norm() / want.norm())
                kernel, nbytes = linear.kernel, linear.nbytes()
                seconds = timer.median(lambda linear=linear, x=x: linear(x), args.iters)
            rate = nbytes / seconds
            print(f"{name:<13} {form:<9} {kernel:<9} {err:>8.1e} {seconds * 1e6:>8.1f} "
                  f"{rate / 1e9:>7.1f} {rate / bw:>6.2f} {base / seconds:>7.2f}")  # fmt: skip
        del w, dense  # the next shape's matrices may need the room


def runner_rows(torch, device, timer: Timer, args, bw: float) -> None:
    from localinfer.backends.base import RunnerConfig, SlotWork
    from localinfer.backends.torch.runner import TorchRunner
    from localinfer.loading.model import LoadedModel

    # tests/ sits beside bench/ at the repository root (or in gpu-check's symlink tree).
    from tests.tiny import tiny_config, tiny_weights

    # SmolLM2-135M's shapes with random weights (tied head), as scripts/bench-runner's "random".
    small = dict(n_layers=2, hidden_size=128, n_heads=4, n_kv_heads=2, head_dim=32, ffn_size=256)
    shape = small if args.quick else dict(
        n_layers=30, hidden_size=576, n_heads=9, n_kv_heads=3, head_dim=64, ffn_size=1536,
        vocab_size=49152, tied_embeddings=True,
    )  # fmt: skip
    config = tiny_config("llama", **shape)
    model = LoadedModel(name="random-smollm2", path="random-smollm2", format="gguf",
                        config=config, tokenizer=None, chat_template=None,
                        weights=tiny_weights(config), file_quant="F32")  # fmt: skip
    print(f"\ndecode, {config.n_layers} layers x {config.hidden_size} (random weights), "
          f"{args.steps} steps, one slot")  # fmt: skip
    print(f"{'quant':<9} {'kernels':<28} {'MB/step':>8} {'tok/s':>8} {'x limit':>8}")
    for quant in (None, "int8", "int4"):
        runner = TorchRunner(model, RunnerConfig(slots=1, max_ctx=args.steps + 16,
                                                 dtype="bfloat16", device=device.type,
                                                 quant=quant))  # fmt: skip
        runner.forward([SlotWork(0, tuple(range(1, 9)), 0)])

        def steps(runner=runner) -> None:
            runner.truncate(0, 8)
            for i in range(args.steps):
                runner.forward([SlotWork(0, (5,), 8 + i)])

        seconds = timer.median(steps, 3) / args.steps
        step_bytes = runner.decode_bytes_per_step()
        limit = bw / step_bytes
        kernels = ",".join(f"{k}:{n}" for k, n in sorted(runner.quant_kernels.items())) or "-"
        print(f"{runner.info.quant:<9} {kernels:<28} {step_bytes / 1e6:>8.1f} "
              f"{1 / seconds:>8.1f} {1 / seconds / limit:>8.2f}")  # fmt: skip
        runner.close()


def main() -> int:
    args = parse_args()
    import torch

    if args.quick:
        args.iters, args.bandwidth_mib, args.steps = 5, 64, 4
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench-quant-cuda: no CUDA device", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    timer = Timer(torch, device)
    bw = bandwidth(torch, device, timer, args.bandwidth_mib)
    print(f"torch {torch.__version__} on {name}; bandwidth {bw / 1e9:.1f} GB/s "
          f"(sum over {args.bandwidth_mib} MiB, median of 9)")  # fmt: skip
    print("one-token products (x bw: weight bytes read / time against the bandwidth)")
    with torch.inference_mode():
        product_rows(torch, device, timer, args, bw)
    runner_rows(torch, device, timer, args, bw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
