"""Debug runs: the script pauses at its own backward calls and is stepped in place.

Every test drives a real worker through ``core.client.handle.WorkerClient``; every wait has a
timeout, so a bug fails a test instead of hanging the suite.
"""

from __future__ import annotations

import queue
import textwrap
import threading

import pytest

from core.client.handle import WorkerClient, run_capture
from core.model.step_state import leaf_digest, same_run_check
from core.model.trace_json import call_from_dict
from core.protocol.messages import StepperState

WAIT_S = 60.0

UNSEEDED = """\
import torch
w = torch.randn(4, requires_grad=True)
x = torch.randn(4)
loss = (w * x).sigmoid().sum()
ref, = torch.autograd.grad(loss, w, retain_graph=True)
print("REF", ref.tolist())
loss.backward()
print("GRAD", w.grad.tolist())
"""

LOOP = """\
import torch
w = torch.tensor([1.0, -2.0], requires_grad=True)
for i in range(6):
    loss = (w * (i + 1)).tanh().sum()
    loss.backward()
"""


class Driver:
    """A client whose events land in a queue, with ways to wait for one kind."""

    def __init__(self):
        self.events: queue.Queue = queue.Queue()
        self.client = WorkerClient(self.events.put, prestart=False)
        self.steps: dict[int, list[dict]] = {}
        self.graphs: dict[int, dict] = {}

    def wait(self, *kinds: str) -> dict:
        while True:
            event = self.events.get(timeout=WAIT_S)
            kind = event.kind
            if kind == "step":
                self.steps.setdefault(event.call, []).append(event.record)
            elif kind == "step_begin":
                self.graphs[event.call] = event
            if kind in kinds:
                return event

    def step_to_end(self, call: int) -> dict:
        """Press Step until the call's backward ends; returns the step_end message."""
        while True:
            event = self.wait("step_paused", "step_end")
            if event.kind == "step_end":
                return event
            assert event.call == call
            self.client.control("step", count=1)

    def close(self):
        self.client.close()


@pytest.fixture
def driver():
    d = Driver()
    yield d
    d.close()


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def _printed(output: str, tag: str) -> list[float]:
    line = next(ln for ln in output.splitlines() if ln.startswith(tag))
    return [float(v) for v in line.split("[", 1)[1].rstrip("]").split(",")]


def debug_unseeded(driver, script) -> tuple:
    driver.client.run(script, debug={"pause_all": False, "skip_to": 1})
    begin = driver.wait("step_begin")
    assert begin.call == 1 and begin.api == "Tensor.backward" and begin.debug
    graph = call_from_dict(begin.graph)
    assert [n.name for n in graph.nodes] == ["SumBackward0", "SigmoidBackward0", "MulBackward0", "AccumulateGrad"]
    assert begin.structure == graph.structure and begin.leaves == leaf_digest(graph)
    end = driver.step_to_end(1)
    assert end.state == StepperState.FINISHED and end.error is None
    result = driver.wait("finished").result
    steps = driver.steps.pop(1)
    driver.graphs.clear()
    return graph, steps, result


@pytest.mark.slow
def test_unseeded_debug_run_steps_its_own_numbers(driver, tmp_path):
    script = write(tmp_path, "unseeded.py", UNSEEDED)
    runs = []
    for _ in range(2):
        graph, steps, result = debug_unseeded(driver, script)
        trace = result.trace
        assert trace.error is None
        # One node per Step press, in the engine's order, the first press included.
        assert [s["name"] for s in steps] == ["SumBackward0", "SigmoidBackward0", "MulBackward0", "AccumulateGrad"]
        stepped = steps[-1]["leaf_grads"]["w"]["data"]
        call = next(c for c in trace.calls if c.index == 1)
        assert call.leaf_grads["w"].data == stepped  # what the inspector shows is what stepping showed
        assert _printed(result.output, "GRAD") == stepped
        assert _printed(result.output, "REF") == stepped  # torch.autograd.grad on the same live tensors
        # The graph sent at the pause is the trace's graph, with the same values before backward.
        assert graph.structure == call.structure and leaf_digest(graph) == leaf_digest(call)
        assert set(trace.seeds) >= {"torch", "random"}
        runs.append((stepped, trace.seeds["torch"]))
    assert runs[0][0] != runs[1][0]  # no seed was forced on the script
    assert runs[0][1] != runs[1][1]


@pytest.mark.slow
def test_loop_paused_at_call_3_then_resumed_captures_the_rest(driver, tmp_path):
    script = write(tmp_path, "loop.py", LOOP)
    driver.client.run(script, debug={"pause_all": False, "skip_to": 3})
    begin = driver.wait("step_begin")
    assert begin.call == 3 and begin.line == 5
    driver.wait("step_paused")
    driver.client.control("step", count=1)
    paused = driver.wait("step_paused")
    assert [s["name"] for s in driver.steps[3]] == ["SumBackward0"]
    assert paused.pending["name"] == "TanhBackward0"
    driver.client.control("resume_all")
    end = driver.wait("step_end")
    assert end.state == StepperState.FINISHED
    trace = driver.wait("finished").result.trace
    assert trace.error is None and trace.call_count == 6
    assert [c.index for c in trace.calls] == [0, 1, 2, 3, 4, 5]
    assert sorted(driver.graphs) == [3]  # no pause after Resume
    # w.grad accumulated over all six calls: sum_i (i+1) * (1 - tanh((i+1) w)^2)
    import math
    expect = [sum((i + 1) * (1 - math.tanh((i + 1) * v) ** 2) for i in range(6)) for v in (1.0, -2.0)]
    assert trace.tensors and next(t for t in trace.tensors if t.name == "w").grad.values.data == \
        pytest.approx(expect, rel=1e-5)


@pytest.mark.slow
def test_breakpoint_line_next_call_and_continue(driver, tmp_path):
    script = write(tmp_path, "two.py", """\
        import torch
        w = torch.ones(2, requires_grad=True)
        (w * 2).sum().backward()
        (w * 3).sum().backward()
        (w * 4).sum().backward()
        (w * 5).sum().backward()
        """)
    driver.client.run(script, debug={"lines": [4], "pause_all": True})
    assert driver.wait("step_begin")["call"] == 1  # only line 4 pauses
    driver.wait("step_paused")
    driver.client.control("next_call")  # the rest of this backward, then pause at the next call
    assert driver.wait("step_end")["state"] == StepperState.FINISHED
    assert driver.wait("step_begin")["call"] == 2
    driver.wait("step_paused")
    driver.client.control("breakpoints", lines=[], pause_all=False)
    driver.client.control("continue")
    assert driver.wait("step_end")["state"] == StepperState.FINISHED
    result = driver.wait("finished").result
    assert result.trace.error is None and sorted(driver.graphs) == [1, 2]
    w = next(t for t in result.trace.tensors if t.name == "w")
    assert w.grad.values.data == [14.0, 14.0]


@pytest.mark.slow
def test_stop_while_paused_leaves_nothing_behind(driver, tmp_path):
    script = write(tmp_path, "unseeded.py", UNSEEDED)
    before = {t.name for t in threading.enumerate()}
    driver.client.run(script, debug={"pause_all": True})
    driver.wait("step_paused")
    worker = driver.client._run["worker"]
    driver.client.control("stop_step")
    driver.client.cancel()
    result = driver.wait("finished").result
    assert result.trace.error is not None and result.trace.error.kind == "cancelled"
    worker.proc.wait(timeout=10)
    assert not worker.alive
    worker.finished.wait(10)
    for t in threading.enumerate():
        if t.name not in before and t.name.startswith(f"worker-{worker.id}-"):
            t.join(5)
            assert not t.is_alive(), t.name
    assert not driver.client.running
    # The next run works, and is a plain run: nothing pauses.
    driver.client.run(script)
    trace = driver.wait("finished").result.trace
    assert trace.error is None and trace.call_count == 2 and not driver.graphs.get(1)


@pytest.mark.slow
def test_rerun_with_recorded_seeds_is_checked(tmp_path):
    script = write(tmp_path, "unseeded.py", UNSEEDED)
    first = run_capture(script).trace
    call = next(c for c in first.calls if c.index == 1)
    begins = []
    again = run_capture(script, step={"call": 1, "mode": "all"}, seeds=first.seeds,
                        on_event=lambda e: begins.append(e) if e.kind == "step_begin" else None)
    assert again.trace.error is None
    assert same_run_check(call, begins[0].structure, begins[0].leaves) is None
    assert next(c for c in again.trace.calls if c.index == 1).leaf_grads["w"] == call.leaf_grads["w"]
    # Without the seeds the re-run draws new numbers, and the check says so.
    begins.clear()
    run_capture(script, step={"call": 1, "mode": "all"},
                on_event=lambda e: begins.append(e) if e.kind == "step_begin" else None)
    problem = same_run_check(call, begins[0].structure, begins[0].leaves)
    assert problem is not None and "not deterministic" in problem and "values differ from the trace" in problem


@pytest.mark.slow
def test_second_run_while_running_does_not_block(tmp_path):
    script = write(tmp_path, "slow.py", "import time\nwhile True:\n    time.sleep(0.05)\n")
    events: queue.Queue = queue.Queue()
    client = WorkerClient(events.put, prestart=False)
    try:
        first = client.run(script)
        while True:
            if events.get(timeout=WAIT_S).kind == "started":
                break
        old = client._run["worker"]
        second = client.run(write(tmp_path, "quick.py", "x = 1\n"))
        # run() waits (up to 5 s) for the reader to see the killed worker's exit; it used to hold
        # a lock the reader needed, so the wait ran out and run() returned before the exit was seen.
        assert old.finished.is_set()
        finished = {}
        while len(finished) < 2:
            e = events.get(timeout=WAIT_S)
            if e.kind == "finished":
                finished[e.run] = e.result
        assert finished[first].trace.error.kind == "cancelled"
        assert finished[second].trace.error is None
    finally:
        client.close()
