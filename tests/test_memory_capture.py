"""Memory sampled in the worker while a script runs: phases, and a graph leak made visible."""

from pathlib import Path

import pytest

from core.client import run_capture

pytest.importorskip("torch")
EXAMPLES = Path(__file__).resolve().parents[1] / "resources" / "examples"


def _saved_at_calls(trace) -> list[int]:
    """saved_bytes at the start of each backward call (the mark sample that opens the phase)."""
    out, previous = [], None
    for s in trace.memory:
        if s.phase == "backward" and previous != "backward":
            out.append(s.saved_bytes)
        previous = s.phase
    return out


def test_phases_cover_forward_and_backward():
    trace = run_capture(str(EXAMPLES / "13_mlp_classifier.py"), timeout=120).trace
    phases = {s.phase for s in trace.memory}
    assert {"forward", "backward", "between"} <= phases
    assert all(s.rss > 0 and s.device == "cpu" for s in trace.memory)
    times = [s.t for s in trace.memory]
    assert times == sorted(times)
    assert len(_saved_at_calls(trace)) == trace.call_count == 10


def test_leak_grows_and_fix_does_not():
    leak = _saved_at_calls(run_capture(str(EXAMPLES / "30_graph_leak.py"), timeout=120).trace)
    fixed = _saved_at_calls(run_capture(str(EXAMPLES / "31_graph_leak_fixed.py"), timeout=120).trace)
    assert len(leak) == len(fixed) == 20
    # Each epoch keeps one more validation graph alive: about 0.5 MB more saved tensors per call.
    growth = [b - a for a, b in zip(leak[1:], leak[2:])]
    assert all(g > 400_000 for g in growth), growth
    assert leak[-1] - leak[1] > 9_000_000
    assert max(fixed[1:]) - min(fixed[1:]) < 100_000


def test_no_sampling_when_rate_is_zero(tmp_path):
    from core.client import WorkerClient
    import threading

    script = tmp_path / "s.py"
    script.write_text("import torch\nx = torch.ones(2, requires_grad=True)\n(x * 2).sum().backward()\n")
    box, done = {}, threading.Event()

    def on_event(e):
        if e["type"] == "finished":
            box["r"] = e["result"]
            done.set()

    client = WorkerClient(on_event, prestart=False)
    try:
        client.memory_rate = 0
        client.run(str(script))
        assert done.wait(60)
    finally:
        client.close()
    assert box["r"].trace.memory == [] and box["r"].trace.calls[0].leaf_grads["x"].data == [2.0, 2.0]
