"""What typing worker messages costs: reading lines as JSON alone against JSON then the protocol
dataclass (``core.client.process.typed``, every field checked), on the two heaviest kinds: batches of step
records and one big trace. Prints medians of several runs: decoding, typing, and their ratio.

    python bench/bench_protocol.py
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.client.process import typed  # noqa: E402


def median_s(fn, runs: int = 7) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    record = {"index": 1, "node": "n3", "name": "MulBackward0", "grad_inputs": [],
              "grad_outputs": [{"shape": [4], "data": [1.0] * 4}], "leaf_grads": {}}
    steps = [json.dumps({"type": "steps", "call": 0, "records": [record] * 20, "run": 1}).encode()
             for _ in range(2000)]
    calls = [{"id": f"c{i}", "nodes": list(range(200))} for i in range(3000)]
    trace = json.dumps({"type": "trace", "run": 1, "trace": {"calls": calls}}).encode()
    for label, lines in (("2,000 'steps' messages of 20 records", steps), (f"one {len(trace) / 1e6:.1f} MB 'trace'", [trace])):
        plain = median_s(lambda: [json.loads(line) for line in lines])
        parsed = [json.loads(line) for line in lines]
        only = median_s(lambda: [typed(data) for data in parsed])
        print(f"{label}: JSON decoding {plain * 1e3:.1f} ms, typing {only * 1e3:.2f} ms "
              f"({only / len(lines) * 1e6:.1f} us a message), typing / decoding {only / plain:.4f}")


if __name__ == "__main__":
    main()
