"""Memory sampling overhead on the ~5,000-node example's forward + backward.

Run: python bench/bench_memory.py [--runs N] [--iters N]. Runs alternate bare / sampled so drift
on a shared machine hits both alike; the ratio is of medians. "sampled" is the 50 Hz sampler
thread alone; "sampled + marks" also marks each backward like the capture does, which walks the
graph for saved-tensor bytes on the script's thread before and after every backward.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import runpy
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from core.memory import MemorySampler, saved_tensor_bytes  # noqa: E402

SCRIPT = ROOT / "resources" / "examples" / "50_big_residual_mlp.py"


def workload(model, inputs, iters: int, sampler: MemorySampler | None = None, marks: bool = False) -> float:
    live: list = []
    t0 = time.perf_counter()
    for i in range(iters):
        loss = model(inputs).pow(2).mean()
        live[:] = [loss]
        if marks:
            sampler.mark("backward", {"type": "call", "index": i, "t": time.perf_counter() - sampler.origin})
        loss.backward()
        if marks:
            sampler.mark("between")
    elapsed = time.perf_counter() - t0
    return elapsed


def timed(model, inputs, iters: int, mode: str) -> tuple[float, MemorySampler | None]:
    if mode == "bare":
        return workload(model, inputs, iters), None
    live: list = []
    sampler = MemorySampler(rate_hz=50, saved_bytes_fn=lambda: saved_tensor_bytes(live))
    with sampler:
        elapsed = workload(model, inputs, iters, sampler, marks=(mode == "marks"))
    return elapsed, sampler


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with contextlib.redirect_stdout(io.StringIO()):
        ns = runpy.run_path(str(SCRIPT), run_name="bench")
    model, inputs = ns["model"], ns["inputs"]
    timed(model, inputs, 2, "bare")  # warm-up
    times: dict[str, list[float]] = {"bare": [], "sampled": [], "marks": []}
    last: dict[str, MemorySampler | None] = {}
    for _ in range(args.runs):
        for mode in times:
            elapsed, last[mode] = timed(model, inputs, args.iters, mode)
            times[mode].append(elapsed)
    bare = statistics.median(times["bare"])
    print(f"workload  {SCRIPT.name}: {args.iters} x forward + backward, 4,802 nodes, torch {torch.__version__}, "
          f"1 thread, median of {args.runs} alternating runs")
    print(f"bare             {bare:.3f} s")
    for mode, label in (("sampled", "sampled 50 Hz"), ("marks", "sampled + marks")):
        med = statistics.median(times[mode])
        over = last[mode].overhead()
        target = "   (target <= 1.05x)" if mode == "sampled" else ""
        print(f"{label:<16} {med:.3f} s  = {med / bare:.3f}x{target}; {over['samples']} thread samples, "
              f"{over['per_sample_us']:.0f} us each")
    start = time.perf_counter()
    loss = model(inputs).pow(2).mean()
    walk0 = time.perf_counter()
    held = saved_tensor_bytes([loss])
    walk = time.perf_counter() - walk0
    print(f"saved-bytes walk {walk * 1e3:.1f} ms for {held / 2**20:.1f} MB saved "
          f"(forward took {(walk0 - start) * 1e3:.0f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
