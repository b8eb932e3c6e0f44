"""Memory sampled in the worker while a script runs: phases, and a graph leak made visible."""

from pathlib import Path

import pytest

from core.client.handle import run_capture

pytest.importorskip("torch")
EXAMPLES = Path(__file__).resolve().parents[3] / "resources" / "examples"


def _saved_at_calls(trace) -> list[int]:
    """saved_bytes at the start of each backward call (the mark sample that opens the phase)."""
    out, previous = [], None
    for s in trace.memory:
        if s.phase == "backward" and previous != "backward":
            out.append(s.saved_bytes)
        previous = s.phase
    return out


@pytest.mark.slow
def test_phases_cover_forward_and_backward():
    trace = run_capture(str(EXAMPLES / "13_mlp_classifier.py"), timeout=120).trace
    phases = {s.phase for s in trace.memory}
    assert {"forward", "backward", "between"} <= phases
    assert all(s.rss > 0 and s.device == "cpu" for s in trace.memory)
    times = [s.t for s in trace.memory]
    assert times == sorted(times)
    assert len(_saved_at_calls(trace)) == trace.call_count == 10
    # Worker start and the script's set-up are "starting", apart from the first forward pass.
    assert trace.memory[0].phase == "starting"
    assert phases_in_order(trace)[:4] == ["starting", "forward", "backward", "between"]
    # Saved tensors rise while the first forward pass builds the graph, before any backward.
    first_op = next(i for i, s in enumerate(trace.memory) if s.phase == "forward")
    first_bwd = next(i for i, s in enumerate(trace.memory) if s.phase == "backward")
    rising = [s.saved_bytes for s in trace.memory[first_op:first_bwd] if s.saved_bytes]
    assert len(set(rising)) >= 3 and rising == sorted(rising), rising
    assert trace.memory[first_bwd].saved_bytes == max(rising) == 6196  # what backward then frees
    assert any(s.where.startswith("AddmmBackward0 · line 18") for s in trace.memory[first_op:first_bwd])
    # zero_grad (line 33) and optimizer.step (line 35) are marked where they ran, once per epoch.
    marks = [(s.mark, s.where) for s in trace.memory if s.mark]
    assert marks == [("zero_grad", "line 33"), ("optimizer.step", "line 35")] * 10


def phases_in_order(trace) -> list[str]:
    out: list[str] = []
    for s in trace.memory:
        if not out or out[-1] != s.phase:
            out.append(s.phase)
    return out


@pytest.mark.slow
def test_leak_grows_and_fix_does_not():
    leak = _saved_at_calls(run_capture(str(EXAMPLES / "30_graph_leak.py"), timeout=120).trace)
    fixed = _saved_at_calls(run_capture(str(EXAMPLES / "31_graph_leak_fixed.py"), timeout=120).trace)
    assert len(leak) == len(fixed) == 20
    # Each epoch keeps one more validation graph alive: about 0.5 MB more saved tensors per call.
    growth = [b - a for a, b in zip(leak[1:], leak[2:])]
    assert all(g > 400_000 for g in growth), growth
    assert leak[-1] - leak[1] > 9_000_000
    assert max(fixed[1:]) - min(fixed[1:]) < 100_000


@pytest.mark.slow
def test_no_sampling_when_rate_is_zero(tmp_path):
    from core.client.handle import WorkerClient
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


@pytest.mark.slow
def test_export_memory_headless_writes_an_svg(tmp_path):
    import subprocess
    import sys
    import xml.etree.ElementTree as ET

    out = tmp_path / "mlp.svg"
    root_dir = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "main.py", "export", str(EXAMPLES / "13_mlp_classifier.py"), "--memory",
                           "--call", "2", "-o", str(out)], cwd=root_dir, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert f"{out}: memory chart" in done.stdout
    root = ET.parse(out).getroot()
    assert root.tag.endswith("svg") and "saved (KB)" in out.read_text()
    bad = subprocess.run([sys.executable, "main.py", "export", str(EXAMPLES / "13_mlp_classifier.py"), "--memory",
                          "-o", str(tmp_path / "m.pdf")], cwd=root_dir, capture_output=True, text=True, timeout=180)
    assert bad.returncode == 1 and "a memory chart is written as .png or .svg" in bad.stderr
