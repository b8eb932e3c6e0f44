"""What gradient norms cost a traced run, on the 4,802-node residual MLP.

Run: python bench/bench_grad_norms.py [--repeat N] [--steps S]. Two scripts: bench/scripts/residual_mlp.py
(one backward, 1,600 parameters) and the same model trained for S SGD steps with clip_grad_norm_
(norms per call, the clipping record and each step's update per module). Each is captured in this
process with the norms on and with them off (GradNorms' hooks made no-ops), interleaved, after a
warm-up; the time spent inside the norm hooks themselves is timed too, the figure that holds on a
shared machine, where two whole runs differ by more than the norms cost. Prints the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from core.worker.capture import grad_norms  # noqa: E402
from core.worker.capture.recorder import capture_script  # noqa: E402

SCRIPT = ROOT / "bench" / "scripts" / "residual_mlp.py"
LOOP = """
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range({steps}):
    optimizer.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    optimizer.step()
"""

SPENT = [0.0]  # seconds inside the norm hooks, this run


def _timed(fn):
    def run(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[0] += time.perf_counter() - t0

    return run


@contextmanager
def norms(on: bool):
    cls = grad_norms.GradNorms
    saved = {name: getattr(cls, name) for name in ("before", "after", "install", "_step_pre", "_step_post")}
    if on:
        for name in ("before", "after", "_step_pre", "_step_post"):
            setattr(cls, name, _timed(saved[name]))
    else:
        cls.before = lambda self, index, order: None
        cls.after = lambda self, index, api: None
        cls.install = lambda self: None
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(cls, name, fn)


def _quiet(fn):
    devnull = open(os.devnull, "w")
    saved = sys.stdout
    sys.stdout = devnull
    try:
        return fn()
    finally:
        sys.stdout = saved
        devnull.close()


def run(script: Path, on: bool) -> tuple[float, float, object]:
    SPENT[0] = 0.0
    with norms(on):
        t0 = time.perf_counter()
        trace = _quiet(lambda: capture_script(str(script)))
        return time.perf_counter() - t0, SPENT[0], trace


def measure(script: Path, repeat: int, label: str) -> None:
    run(script, True)  # warm-up
    on, off, spent = [], [], []
    trace = None
    for _ in range(repeat):
        t, s, trace = run(script, True)
        on.append(t)
        spent.append(s)
        off.append(run(script, False)[0])
    # The fastest run of each kind: on a shared machine the others only add other people's load.
    t_on, t_off, t_spent = min(on), min(off), statistics.median(spent)
    calls = sum(1 for c in trace.calls if c.grad_norms)
    params = len(trace.calls[0].grad_norms["params"])
    print(f"{label}: {trace.calls[0].node_count:,} nodes, {params:,} parameters, {calls} calls, "
          f"{len(trace.grad_events)} events")
    print(f"  traced run with norms {t_on:.3f} s, without {t_off:.3f} s (fastest of {repeat}): "
          f"ratio {t_on / t_off:.3f}")
    # The time inside the hooks is the cost itself; the two runs' difference also holds the machine's noise.
    print(f"  inside the norm hooks {t_spent * 1000:.1f} ms (median) = {100 * t_spent / t_on:.2f} % of the traced "
          f"run (budget 5 %)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    measure(SCRIPT, args.repeat, "residual_mlp.py (one backward)")
    with tempfile.TemporaryDirectory() as tmp:
        loop = Path(tmp) / "residual_mlp_loop.py"
        loop.write_text(SCRIPT.read_text() + LOOP.format(steps=args.steps))
        measure(loop, args.repeat, f"residual_mlp.py + {args.steps} SGD steps with clip_grad_norm_")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
