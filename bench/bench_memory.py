"""Memory sampling overhead on the ~5,000-node example's forward + backward.

Run: python bench/bench_memory.py [--runs N] [--iters N]. Runs alternate (the order rotates each
round) so drift on a shared machine hits every mode alike; ratios are of medians and of best runs.
"sampled" is the 50 Hz sampler thread alone; "sampled + marks" also marks each backward as the
capture does, which walks the graph for saved-tensor bytes before and after every backward.
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

from core.worker.memory import MemorySampler  # noqa: E402
from core.worker.saved_bytes import saved_tensor_bytes  # noqa: E402

SCRIPT = ROOT / "resources" / "examples" / "50_big_residual_mlp.py"


def workload(model, inputs, iters: int, sampler: MemorySampler | None, live: list) -> tuple[float, float]:
    """Forward + backward ``iters`` times; wall seconds and the seconds of CPU this thread used."""
    marks = sampler is not None and sampler.saved_bytes_fn is not None
    t0, c0 = time.perf_counter(), time.thread_time()
    for i in range(iters):
        loss = model(inputs).pow(2).mean()
        live[:] = [loss]
        if marks:
            sampler.mark("backward", {"type": "call", "index": i, "t": time.perf_counter() - sampler.origin})
        loss.backward()
        if marks:
            sampler.mark("between")
    return time.perf_counter() - t0, time.thread_time() - c0


def timed(model, inputs, iters: int, mode: str) -> tuple[float, float, MemorySampler | None]:
    live: list = []
    if mode.startswith("bare"):
        return (*workload(model, inputs, iters, None, live), None)
    saved = (lambda: saved_tensor_bytes(live)) if mode == "marks" else None
    with MemorySampler(rate_hz=50, saved_bytes_fn=saved) as sampler:
        wall, cpu = workload(model, inputs, iters, sampler, live)
    return wall, cpu, sampler


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with contextlib.redirect_stdout(io.StringIO()):
        ns = runpy.run_path(str(SCRIPT), run_name="bench")
    model, inputs = ns["model"], ns["inputs"]
    timed(model, inputs, 2, "bare")  # warm-up
    modes = ["bare", "sampled", "bare again", "marks"]
    wall: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    last: dict[str, MemorySampler | None] = {}
    for r in range(args.runs):
        for mode in modes[r % 4:] + modes[:r % 4]:  # rotate, so no mode always runs first
            w, c, last[mode] = timed(model, inputs, args.iters, mode)
            wall[mode].append(w)
            cpu[mode].append(c)
    med = {m: (statistics.median(wall[m]), statistics.median(cpu[m])) for m in modes}
    print(f"workload  {SCRIPT.name}: {args.iters} x forward + backward (4,802 nodes), torch {torch.__version__}, "
          f"1 thread, medians of {args.runs} rotating runs; ratios to bare as wall / script-thread CPU")
    labels = {"bare": "bare", "bare again": "bare again", "sampled": "sampled 50 Hz", "marks": "sampled + marks"}
    for m in modes:
        ratio = "" if m == "bare" else f"  = {med[m][0] / med['bare'][0]:.3f}x / {med[m][1] / med['bare'][1]:.3f}x"
        note = {"bare again": "  (noise: the same run twice)", "sampled": "  (target <= 1.05x)"}.get(m, "")
        print(f"{labels[m]:<16} {med[m][0]:.3f} s wall, {med[m][1]:.3f} s CPU{ratio}{note}")
    over = last["sampled"].overhead()
    print(f"sampler thread   {over['samples']} samples in the last run, {over['per_sample_us']:.0f} us each "
          "(wall time in the thread, waiting for the GIL included)")
    loss = model(inputs).pow(2).mean()
    walk0 = time.perf_counter()
    held = saved_tensor_bytes([loss])
    print(f"saved-bytes walk {(time.perf_counter() - walk0) * 1e3:.1f} ms for {held / 2**20:.1f} MB saved in one graph"
          " (\"sampled + marks\" walks twice per backward)")
    per_op(model, inputs)
    return 0


def per_op(model, inputs) -> None:
    """What the per-op accounting of a forward pass costs: ``on_node`` for each node of one graph,
    against the forward pass that made them (the capture calls it once per new node)."""
    from core.worker.capture.node_graph import number_nodes, root_nodes

    t0 = time.perf_counter()
    loss = model(inputs).pow(2).mean()
    forward = time.perf_counter() - t0
    nodes = number_nodes(root_nodes([loss]))[0]
    best = float("inf")
    for _ in range(3):
        sampler = MemorySampler(rate_hz=50, origin=time.perf_counter() - 60)  # a minute in: within budget
        sampler.mark("forward", force_saved=False)
        t0 = time.perf_counter()
        for node in reversed(nodes):  # creation order
            sampler.on_node(node, "")
        best = min(best, time.perf_counter() - t0)
    print(f"per-op accounting {best * 1e6 / len(nodes):.1f} us per node ({len(nodes):,} nodes, "
          f"{len(sampler.samples)} samples at most one per 0.2 ms) = {best / forward:.3f}x of the forward pass "
          f"({forward * 1e3:.1f} ms); saved bytes counted {sampler._saved / 2**20:.1f} MB")


if __name__ == "__main__":
    sys.exit(main())
