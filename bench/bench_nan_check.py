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

``--run-to-nan``: through a fresh worker, the traced run with the check on against a debug run
with Run to First NaN/Inf on a script that never makes one: the check runs in forward as in the
traced run, and each backward call runs under the backward stepper node by node, looking for the
first non-finite gradient, so this is what searching costs when there is nothing to find.

``--gpt2``: GPT-2 small (``transformers``' ``GPT2LMHeadModel(GPT2Config())``, random weights,
nothing downloaded; a benchmark-only install) on a batch of 1 x 128 tokens, one forward and
backward, run as plain ``python``, traced with the check off and traced with it on, each in a
fresh process with one torch thread; the script times its own forward + backward (wall and CPU
seconds), so the worker's start and the import of transformers are left out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_SCRIPT = ROOT / "bench" / "scripts" / "residual_mlp.py"
GPT2_SCRIPT = ROOT / "bench" / "scripts" / "gpt2_small.py"


TO_NAN = {"lines": [], "pause_all": False, "skip_to": None, "pause_on_errors": False, "to_nan": True}


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


def gpt2_seconds(how: str, times: Path, device: str) -> dict:
    """One GPT-2 small run, ``how`` = "plain", "off" or "on": the script's own timings of it."""
    times.write_text("")
    if how == "plain":
        subprocess.run([sys.executable, str(GPT2_SCRIPT)], check=True, capture_output=True)
    else:
        _, found = traced_seconds(GPT2_SCRIPT, device, how == "on")
        assert (found is not None) == (how == "on"), "the check is on in the run with it only"
    return json.loads(times.read_text().splitlines()[-1])


def gpt2_case(repeat: int, device: str) -> int:
    times = Path(tempfile.mkdtemp()) / "gpt2_times.jsonl"
    # the worker and the plain run inherit these: 1 x 128 tokens, one torch thread, timings to a file
    os.environ.update(GPT2_BATCH="1x128", GPT2_TIMES=str(times), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                      BACKPROP_STUDIO_DEVICE=device)
    runs: dict[str, list[dict]] = {"plain": [], "off": [], "on": []}
    for i in range(repeat):
        for how in runs:
            runs[how].append(gpt2_seconds(how, times, device))
        print(f"run {i + 1}: " + ", ".join(f"{how} {r[-1]['step'][0]:.2f} s (CPU {r[-1]['step'][1]:.2f})"
                                          for how, r in runs.items()), flush=True)
    for part in ("step", "build"):
        for k, unit in ((0, "wall"), (1, "CPU")):
            med = {how: statistics.median(r[part][k] for r in rs) for how, rs in runs.items()}
            what = "forward + backward" if part == "step" else "building the model"
            print(f"GPT-2 small 1x128 on {device}, {what}, median of {repeat}, {unit} s: plain {med['plain']:.2f}, "
                  f"traced {med['off']:.2f} ({med['off'] / med['plain']:.2f}x), with the NaN check "
                  f"{med['on']:.2f} ({med['on'] / med['plain']:.2f}x; {med['on'] / med['off']:.2f}x of traced)")
    return 0


def to_nan_seconds(script: Path, device: str) -> tuple[float, int]:
    """(capture seconds, pauses) of a debug run with Run to First NaN/Inf through a fresh worker; a
    pause (the script made a non-finite value after all) is answered with Resume Without Pausing."""
    import queue

    from core.client.handle import WorkerClient

    events: queue.Queue = queue.Queue()
    client = WorkerClient(events.put, prestart=True)
    client.memory_rate = 0
    pauses = 0
    try:
        client.run(str(script), device=device, debug=TO_NAN, nan_check=True)
        while True:
            event = events.get(timeout=600)
            if event.kind in ("forward_paused", "step_paused"):
                pauses += 1
                client.control("resume_all")
            elif event.kind == "finished":
                trace = event.result.trace
                if trace.error is not None:
                    raise SystemExit(f"{script.name} failed: {trace.error.type}: {trace.error.message}")
                return trace.duration_s, pauses
    finally:
        client.close()


def run_to_nan_case(script: Path, repeat: int, device: str) -> int:
    checked, searched = [], []
    for i in range(repeat):
        checked.append(traced_seconds(script, device, True)[0])
        seconds, pauses = to_nan_seconds(script, device)
        searched.append(seconds)
        if pauses:
            print(f"  (the script made a non-finite value: paused {pauses} time(s), resumed at once)")
        print(f"run {i + 1}: traced with the check {checked[-1]:.3f} s, Run to First NaN/Inf {searched[-1]:.3f} s",
              flush=True)
    for what, pick in (("fastest", min), ("median", statistics.median)):
        a, b = pick(checked), pick(searched)
        print(f"{script.name} on {device}, {what} of {repeat}: traced with the check {a:.3f} s, Run to First "
              f"NaN/Inf {b:.3f} s, ratio {b / a:.2f}x")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--script", type=Path, default=DEFAULT_SCRIPT)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--in-process", action="store_true", help="CPU seconds of a capture in this process")
    parser.add_argument("--gpt2", action="store_true",
                        help="GPT-2 small, 1 x 128 tokens: plain python, traced, traced with the check")
    parser.add_argument("--run-to-nan", action="store_true",
                        help="the check's traced run against a debug run with Run to First NaN/Inf (none to find)")
    args = parser.parse_args(argv)
    if args.gpt2:
        return gpt2_case(args.repeat, args.device)
    if args.run_to_nan:
        return run_to_nan_case(args.script, args.repeat, args.device)
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
