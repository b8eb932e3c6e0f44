"""What forward breakpoints cost a debug run: a 1,000-iteration loop under capture, four ways.

Run: python bench/bench_forward_breakpoints.py [--iterations 1000] [--repeat 5]

The script (written to a temporary folder) runs a loop of small ops, then one backward. Each way
runs it in this process under ``core.worker.capture.recorder.Capture`` with one torch thread and
times ``Capture.run()`` (CPU seconds and wall seconds; the fastest of ``--repeat`` is printed):

- ``plain``: a capture without a debug plan, as a debug run without breakpoints ran before forward
  pauses existed (no ``ForwardPauser``: the name tracer's ``line_tracer`` is None);
- ``debug, no forward breakpoints``: a debug run's ``ForwardPauser`` with no lines (must cost the
  same: the pauser installs nothing);
- ``breakpoint never hit``: a breakpoint on a line of a branch never taken (the loop's frame gets
  line events, each answered by the pauser's line tracer);
- ``breakpoint hit, Continue``: a breakpoint on the loop's first line, paused 1,000 times, each
  pause reading the live graph into its message and answered with Continue at once (from the
  message's send, so no thread hop is timed: the worker adds the pipe's round trip to the app).

The overhead per iteration over ``plain`` is printed for each.

``--worker``: the same loop as debug runs of a real worker (``core.client.handle.WorkerClient``), with
no breakpoints and with the breakpoint hit every iteration, each pause answered with Continue by the
client as soon as its message arrives: the run's wall time from ``run`` to its result, so each pause's
round trip through the pipes and both processes' threads is in it.
"""

from __future__ import annotations

import argparse
import queue
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from core.client.handle import WorkerClient  # noqa: E402
from core.worker.capture.recorder import Capture  # noqa: E402
from core.worker.debug import DebugPlan  # noqa: E402
from core.worker.forward_pause import ForwardPauser  # noqa: E402

SCRIPT = """\
import torch
w = torch.randn(16, requires_grad=True)
total = 0.0
for i in range({n}):
    h = (w * i).tanh()
    if i < 0:
        print("never")
    loss = h.sum()
    total += loss.item()
loss.backward()
"""
HIT_LINE, NEVER_LINE = 5, 7
SOURCES: set[str] = set()  # where the runs' line events came from (core.worker.line_stops)


def run_once(script: str, lines: list[int] | None) -> tuple[float, float, int]:
    """(CPU s, wall s, pauses) of one captured run; ``lines`` None: no debug plan at all."""
    capture = Capture(script)
    pauser = None
    if lines is not None:
        plan = DebugPlan(lines, pause_all=False)

        def send(message: dict) -> None:
            pauser.command("continue", {})  # the app's Continue, answered before the pause waits

        pauser = ForwardPauser(capture, plan, send)
    cpu, wall = time.process_time(), time.perf_counter()
    trace = capture.run()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if pauser is not None:
        pauser.close()
        if lines:
            SOURCES.add(pauser.source)
    if trace.error is not None:
        raise SystemExit(f"the script failed: {trace.error.type}: {trace.error.message}")
    return cpu, wall, pauser.pauses if pauser is not None else 0


def worker_seconds(script: str, lines: list[int]) -> tuple[float, int]:
    """(wall s, pauses) of one debug run of a real worker, each forward pause continued at once."""
    events: queue.Queue = queue.Queue()
    client = WorkerClient(events.put, prestart=True)
    client.memory_rate = 0  # the pauses alone
    try:
        while events.get(timeout=120).kind != "hello":
            pass
        pauses, start = 0, time.perf_counter()
        client.run(script, debug={"lines": lines, "pause_all": False})
        while True:
            event = events.get(timeout=600)
            if event.kind == "forward_paused":
                pauses += 1
                client.control("continue")
            elif event.kind == "finished":
                return time.perf_counter() - start, pauses
    finally:
        client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--worker", action="store_true", help="also time debug runs of a real worker")
    args = parser.parse_args()
    torch.set_num_threads(1)
    ways = [("plain", None), ("debug, no forward breakpoints", []), ("breakpoint never hit", [NEVER_LINE]),
            ("breakpoint hit, Continue", [HIT_LINE])]
    with tempfile.TemporaryDirectory() as folder:
        script = str(Path(folder) / "loop.py")
        Path(script).write_text(textwrap.dedent(SCRIPT.format(n=args.iterations)))
        run_once(script, None)  # warm: imports, the first ops' caches
        best: dict[str, tuple[float, float, int]] = {}
        for _ in range(args.repeat):
            for name, lines in ways:
                cpu, wall, pauses = run_once(script, lines)
                old = best.get(name)
                best[name] = (min(cpu, old[0]) if old else cpu, min(wall, old[1]) if old else wall, pauses)
    base_cpu, base_wall, _ = best["plain"]
    n = args.iterations
    print(f"{n} iterations, fastest of {args.repeat}, one torch thread; line events from {', '.join(SOURCES)}")
    print(f"{'':32} {'CPU s':>8} {'wall s':>8} {'pauses':>7} {'CPU us/iter over plain':>24}")
    for name, _ in ways:
        cpu, wall, pauses = best[name]
        print(f"{name:32} {cpu:8.3f} {wall:8.3f} {pauses:7d} {(cpu - base_cpu) / n * 1e6:24.1f}")
    if args.worker:
        with tempfile.TemporaryDirectory() as folder:
            script = str(Path(folder) / "loop.py")
            Path(script).write_text(textwrap.dedent(SCRIPT.format(n=n)))
            runs = {name: [worker_seconds(script, lines) for _ in range(args.repeat)]
                    for name, lines in (("no breakpoints", []), ("breakpoint hit, Continue", [HIT_LINE]))}
        base = min(w for w, _ in runs["no breakpoints"])
        print(f"\nreal worker, run to result, fastest of {args.repeat}")
        for name, results in runs.items():
            wall = min(w for w, _ in results)
            print(f"{name:32} {wall:8.3f} s {results[0][1]:6d} pauses {(wall - base) / n * 1e3:8.2f} ms/iter")
    return 0


if __name__ == "__main__":
    sys.exit(main())
