"""Big trace files, written without torch, and the time the loader takes on each.

Run: python bench/big_traces.py [--nodes 200000 1000000] [--samples 1000000] [--keep DIR].
Writes a chain of N ``MulBackward0`` nodes (each with a saved tensor), a fan-in of N leaves
into one ``AddBackward0``-like node, and a trace with M memory samples, then prints for each
the file size, ``load_trace``'s wall time and the growth of this process's peak RSS (psutil):
what opening such a file costs before any view draws it. The files go to a temporary folder
that is removed at the end unless ``--keep DIR`` names a folder to write them to. Tests use
``chain_trace`` / ``fan_in_trace`` / ``memory_trace`` to build the same documents in memory.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from core.model.trace import FORMAT, VERSION  # noqa: E402


def _tensor(tid: str, shape=(4,)) -> dict:
    numel = 1
    for n in shape:
        numel *= n
    return {"id": tid, "name": None, "shape": list(shape), "dtype": "float32", "device": "cpu",
            "requires_grad": True, "is_leaf": True, "retains_grad": False, "stride": [1] * len(shape),
            "storage_offset": 0, "storage": None, "version": 0, "values": {"numel": numel}}


def _trace(calls: list, memory: list | None = None) -> dict:
    return {"format": FORMAT, "version": VERSION, "calls": calls, "script": "big.py", "device": "cpu",
            "call_count": len(calls), "memory": memory or []}


def _call(nodes: list, tensors: list) -> dict:
    edges = sum(1 for n in nodes for e in n["next"] if e is not None)
    return {"id": "c0", "index": 0, "api": "Tensor.backward", "line": 1, "roots": [nodes[0]["id"]] if nodes else [],
            "nodes": nodes, "tensors": tensors, "node_count": len(nodes), "edge_count": edges}


def chain_trace(n: int) -> dict:
    """One call: n0 -> n1 -> ... -> n(N-1), the last an AccumulateGrad of tensor t0."""
    nodes = [{"id": f"n{i}", "name": "MulBackward0", "kind": "backward", "next": [{"node": f"n{i + 1}", "input_nr": 0}],
              "saved": [{"name": "other", "value": 2}], "line": 1} for i in range(n - 1)]
    nodes.append({"id": f"n{n - 1}", "name": "AccumulateGrad", "kind": "accumulate_grad", "next": [], "variable": "t0"})
    return _trace([_call(nodes, [_tensor("t0")])])


def fan_in_trace(n: int) -> dict:
    """One call: a root whose next functions are n - 1 AccumulateGrad leaves, one tensor each."""
    leaves = [{"id": f"n{i}", "name": "AccumulateGrad", "kind": "accumulate_grad", "next": [], "variable": f"t{i}"}
              for i in range(1, n)]
    root = {"id": "n0", "name": "StackBackward0", "kind": "backward", "line": 1,
            "next": [{"node": leaf["id"], "input_nr": 0} for leaf in leaves]}
    return _trace([_call([root, *leaves], [_tensor(f"t{i}") for i in range(1, n)])])


def memory_trace(samples: int, peak_at: int | None = None) -> dict:
    """No call; ``samples`` memory samples at 50 Hz, RSS rising by a page a sample, one peak."""
    peak_at = samples // 3 if peak_at is None else peak_at
    memory = [{"t": i / 50, "device": "cpu", "rss": 100_000_000 + 4096 * i, "allocated": 0,
               "phase": "forward" if i % 100 < 60 else "backward"} for i in range(samples)]
    memory[peak_at]["rss"] = 9_000_000_000
    return _trace([], memory)


def _measure(name: str, data: dict, folder: Path) -> None:
    from core.model.trace import TraceFormatError
    from core.model.trace_json import load_trace

    path = folder / f"{name}.json"
    path.write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")
    del data
    proc = psutil.Process()
    before = proc.memory_info().rss
    start = time.perf_counter()
    try:
        trace = load_trace(path)
        what = f"opened: {sum(len(c.nodes) for c in trace.calls):,} nodes, {len(trace.memory):,} samples"
    except TraceFormatError as exc:
        trace, what = None, f"refused: {str(exc)[:160]}"
    took = time.perf_counter() - start
    grew = (proc.memory_info().rss - before) / 2 ** 20
    print(f"{name:>22}: {path.stat().st_size / 2 ** 20:7.1f} MiB, {took:6.2f} s, +{grew:6.0f} MiB RSS, {what}",
          flush=True)
    del trace


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="*", default=[200_000, 1_000_000])
    parser.add_argument("--samples", type=int, nargs="*", default=[100_000, 1_000_000])
    parser.add_argument("--keep", type=Path, default=None, help="write the files here and keep them")
    args = parser.parse_args(argv)
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bps-big-traces-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        for n in args.nodes:
            _measure(f"chain-{n}", chain_trace(n), folder)
            _measure(f"fan-in-{n}", fan_in_trace(n), folder)
        for m in args.samples:
            _measure(f"memory-{m}", memory_trace(m), folder)
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
