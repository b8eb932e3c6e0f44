"""What the teaching facts cost capture: cut notes, edge marks, grad states, edge-gradient hooks.

Run: python bench/bench_teaching.py [--repeat N]. Captures the 4,802-node example and a small
example (where edge-gradient hooks are on) with those recorders switched on and off, in this
one process, and prints the ratio of the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import core.worker.capture.recorder as capture  # noqa: E402
import core.worker.capture.snapshot as snapshot  # noqa: E402
from core.worker.capture.cuts import CutRecorder  # noqa: E402

BIG = ROOT / "resources" / "examples" / "50_big_residual_mlp.py"
SMALL = ROOT / "resources" / "examples" / "13_mlp_classifier.py"


@contextmanager
def teaching_off():
    """Every recorder this bench measures replaced by a no-op."""
    saved = (CutRecorder.note_inputs, CutRecorder.note_free, snapshot.edge_marks, capture.grad_states,
             capture.saved_by_checkpoint, capture.EDGE_GRAD_LIMIT)
    CutRecorder.note_inputs = lambda self, md, args: None
    CutRecorder.note_free = lambda self, out, op, args: None
    snapshot.edge_marks = lambda node, name: None
    capture.grad_states = lambda order, name_of: {}
    capture.saved_by_checkpoint = lambda: False
    capture.EDGE_GRAD_LIMIT = -1
    try:
        yield
    finally:
        (CutRecorder.note_inputs, CutRecorder.note_free, snapshot.edge_marks, capture.grad_states,
         capture.saved_by_checkpoint, capture.EDGE_GRAD_LIMIT) = saved


def timed(script: Path) -> float:
    devnull = open(os.devnull, "w")
    out, sys.stdout = sys.stdout, devnull
    try:
        t0 = time.perf_counter()
        capture.capture_script(str(script))
        return time.perf_counter() - t0
    finally:
        sys.stdout = out
        devnull.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    for script in (SMALL, BIG):
        timed(script)  # warm-up
        on, off = [], []
        for _ in range(args.repeat):  # interleaved, so machine load hits both alike
            on.append(timed(script))
            with teaching_off():
                off.append(timed(script))
        a, b = statistics.median(on), statistics.median(off)
        print(f"{script.name}: capture {a:.3f} s with the teaching recorders, {b:.3f} s without: {a / b:.2f}x")


if __name__ == "__main__":
    main()
