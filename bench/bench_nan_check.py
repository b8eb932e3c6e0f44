"""What the NaN/Inf check costs: a traced run's time with ``--nan-check`` off and on.

Run: python bench/bench_nan_check.py [--script bench/scripts/residual_mlp.py] [--device cpu] [--repeat 3]
     python bench/bench_nan_check.py --in-process   (this process's CPU time, one torch thread)

Each repeat runs the script twice through a fresh worker, off then on, and reads the capture's
own run time (``Trace.duration_s``: the script under capture, without the worker's start); the
fastest and the median of each and their ratios are printed (on a shared machine the fastest is
the one least disturbed). Off, the check pushes no mode and hooks no node, so the off
time is the plain traced run's. On, each forward op's output is summed once and each backward
node's gradients are checked by a hook; on a GPU each check reads a sum back (a sync per op), so
run it there too (``--script bench/scripts/gpt2_small.py --device cuda``). On a machine others load,
wall times swing several-fold; ``--in-process`` captures in this process with one torch thread
and times its CPU seconds instead, which the neighbours disturb far less.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_SCRIPT = ROOT / "bench" / "scripts" / "residual_mlp.py"


def traced_seconds(script: Path, device: str, nan_check: bool) -> tuple[float, dict | None]:
    from core.client.handle import run_capture

    result = run_capture(str(script), device=device, timeout=600, memory_rate=0, nan_check=nan_check)
    trace = result.trace
    if trace.error is not None:
        raise SystemExit(f"{script.name} failed: {trace.error.type}: {trace.error.message}")
    return trace.duration_s, trace.nan_check


def cpu_seconds(script: Path, device: str, nan_check: bool) -> tuple[float, dict | None]:
    """The capture in this process: CPU seconds of the run (one torch thread)."""
    import time

    import torch

    from core.worker.capture.nan_check import NanCheck
    from core.worker.capture.recorder import Capture

    torch.set_num_threads(1)
    capture = Capture(str(script), device=device)
    if nan_check:
        capture.nan_check = NanCheck()
    start = time.process_time()
    trace = capture.run()
    if trace.error is not None:
        raise SystemExit(f"{script.name} failed: {trace.error.type}: {trace.error.message}")
    return time.process_time() - start, trace.nan_check


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--script", type=Path, default=DEFAULT_SCRIPT)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--in-process", action="store_true", help="CPU seconds of a capture in this process")
    args = parser.parse_args(argv)
    timed = cpu_seconds if args.in_process else traced_seconds
    off, on = [], []
    found = None
    for i in range(args.repeat):
        t_off, absent = timed(args.script, args.device, False)
        t_on, found = timed(args.script, args.device, True)
        assert absent is None
        off.append(t_off)
        on.append(t_on)
        print(f"run {i + 1}: off {t_off:.3f}, on {t_on:.3f}", flush=True)
    for what, pick in (("fastest", min), ("median", statistics.median)):
        t_off, t_on = pick(off), pick(on)
        unit = "CPU s" if args.in_process else "s"
        print(f"{args.script.name} on {args.device}, {what} of {args.repeat}: nan-check off {t_off:.3f} {unit}, "
              f"on {t_on:.3f} {unit}, ratio {t_on / t_off:.2f}x")
    print(f"found: forward {found['forward'] and found['forward']['op']}, "
          f"backward {found['backward'] and found['backward']['name']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
