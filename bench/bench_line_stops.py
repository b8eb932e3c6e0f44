"""What a breakpoint costs a loop that never reaches it, by where line events come from.

Run: python bench/bench_line_stops.py [--iterations 200000] [--repeat 5]

``core.worker.line_stops`` is torch-free, so this times plain Python: a loop of
``--iterations`` calls in a function that holds a breakpoint on a branch never taken, run by
``tests/core/worker/line_stops_run.py`` (which stands in for the capture's name tracer) with
this Python and each CPython 3.12+ found on the machine. Each Python runs it three ways: no
breakpoint (the name tracer alone), the breakpoint with line events from the frame's local
tracer (``sys.settrace``, as on 3.10 and 3.11) and, on 3.12+, from ``sys.monitoring``. Printed: CPU
seconds (the fastest of ``--repeat``), line events received, and the cost per iteration over
the run without the breakpoint.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "core" / "worker"))

from test_line_stops import MONITORING, SCRIPT, run  # noqa: E402

NEVER_LINE = 10  # SCRIPT's ``print("never")``, inside the loop of total(n)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    n = args.iterations
    pythons = [sys.executable] + [p for p in MONITORING if p != sys.executable]
    assert "total({n})" in SCRIPT
    print(f"a loop of {n} iterations, a breakpoint on a branch never taken; CPU s, fastest of {args.repeat}")
    print(f"{'python':8} {'line events from':18} {'CPU s':>8} {'line events':>12} {'us/iter over none':>18}")
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        for python in pythons:
            ways = [("none", [], False), ("sys.settrace", [NEVER_LINE], False)]
            if python in MONITORING:
                ways.append(("sys.monitoring", [NEVER_LINE], True))
            best: dict[str, dict] = {}
            for _ in range(args.repeat):
                for name, lines, monitoring in ways:
                    result = run(python, tmp, lines, [], n=n, monitoring=monitoring)
                    if name not in best or result["cpu_s"] < best[name]["cpu_s"]:
                        best[name] = result
            base = best["none"]["cpu_s"]
            version = ".".join(map(str, best["none"]["python"]))
            for name, _, _ in ways:
                result = best[name]
                source = name if name == "none" else result["source"]
                print(f"{version:8} {source:18} {result['cpu_s']:8.3f} {result['line_events']:12d} "
                      f"{(result['cpu_s'] - base) / n * 1e6:18.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
