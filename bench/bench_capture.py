"""Capture overhead, trace size and JSON round-trip time on the ~5,000-node example.

Run: python bench/bench_capture.py [--repeat N]. Prints ratios measured in this one run.
Both runs use one thread, in this process, after a warm-up, so the ratio compares the same
work: the script's own run time against the same script under capture.
"""

from __future__ import annotations

import argparse
import os
import runpy
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from core.worker.capture.recorder import capture_script  # noqa: E402
from core.model.trace import Trace  # noqa: E402
from core.model.trace_json import load_trace  # noqa: E402

SCRIPT = ROOT / "resources" / "examples" / "50_big_residual_mlp.py"
LOOP = ROOT / "resources" / "examples" / "11_linear_regression_scratch.py"


def _quiet(fn):
    devnull = open(os.devnull, "w")
    saved = sys.stdout
    sys.stdout = devnull
    try:
        return fn()
    finally:
        sys.stdout = saved
        devnull.close()


CPU: dict[str, list[float]] = {"bare": [], "captured": []}  # CPU seconds of each run (this process, 1 thread)


def bare(script: Path) -> float:
    t0, c0 = time.perf_counter(), time.process_time()
    _quiet(lambda: runpy.run_path(str(script), run_name="__main__"))
    CPU["bare"].append(time.process_time() - c0)
    return time.perf_counter() - t0


def captured(script: Path) -> tuple[float, Trace]:
    t0, c0 = time.perf_counter(), time.process_time()
    trace = _quiet(lambda: capture_script(str(script)))
    CPU["captured"].append(time.process_time() - c0)
    return time.perf_counter() - t0, trace


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--overhead-only", action="store_true", help="only the 4,802-node capture overhead")
    args = parser.parse_args()
    torch.set_num_threads(1)
    bare(SCRIPT)  # warm-up: first-call costs of the kernels
    captured(SCRIPT)
    CPU["bare"].clear()
    CPU["captured"].clear()
    bare_times, cap_times = [], []
    trace = None
    for _ in range(args.repeat):  # alternated, so both see the same machine load
        bare_times.append(bare(SCRIPT))
        t, trace = captured(SCRIPT)
        cap_times.append(t)
    b, c = statistics.median(bare_times), statistics.median(cap_times)
    nodes = trace.calls[0].node_count
    print(f"script: {SCRIPT.name} ({nodes} autograd nodes), torch {torch.__version__}, 1 thread")
    print(f"bare run          {b:.3f} s (median of {args.repeat})")
    print(f"captured run      {c:.3f} s (median of {args.repeat})")
    print(f"capture overhead  {c / b:.2f}x   (target <= 1.5x; torchlens ~14x a forward pass)")
    cb, cc = statistics.median(CPU["bare"]), statistics.median(CPU["captured"])
    print(f"in CPU seconds    {cb:.3f} s bare, {cc:.3f} s captured: {cc / cb:.2f}x (less disturbed by other load)")
    if args.overhead_only:
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        t0 = time.perf_counter()
        trace.save(path)
        t1 = time.perf_counter()
        again = load_trace(path)
        t2 = time.perf_counter()
        size = path.stat().st_size
    assert again.calls[0].node_count == nodes
    print(f"trace size        {size / 1e6:.2f} MB   (target < 5 MB)")
    print(f"JSON write + read {t1 - t0:.3f} s + {t2 - t1:.3f} s = {t2 - t0:.3f} s   (target < 1 s)")

    # The same 4,802-node architecture at the sizes of a real model: compute dominates.
    with tempfile.TemporaryDirectory() as tmp:
        wide = Path(tmp) / "wide_residual_mlp.py"
        wide.write_text(SCRIPT.read_text().replace("width=64", "width=256").replace("torch.randn(8, 64)",
                                                                                  "torch.randn(512, 256)"))
        bare(wide)
        captured(wide)
        runs = [(bare(wide), captured(wide)[0]) for _ in range(args.repeat)]  # alternated: same memory state
        wb = statistics.median(r[0] for r in runs)
        wc = statistics.median(r[1] for r in runs)
    print(f"same graph, larger tensors (width 256, batch 512): bare {wb:.3f} s, captured {wc:.3f} s, "
          f"overhead {wc / wb:.2f}x (target <= 1.5x)")

    t, loop = captured(LOOP)
    size = len(loop.to_json())
    full = sum(1 for c in loop.calls if c.snapshot == "full")
    print(f"training loop     {LOOP.name}: {loop.call_count} backward calls, {full} full snapshots, "
          f"trace {size / 1e6:.3f} MB (target < 5 MB), captured in {t:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
