"""Debug runs pause in forward: before a breakpoint's line, with the graph alive there.

Every test drives a real worker (``core.client.handle.WorkerClient``); every wait has a timeout.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from core.client.handle import WorkerClient
from core.model.trace_json import call_from_dict
from core.protocol.messages import StepperState
from core.worker.forward_pause import backward_lines

WAIT_S = 90.0
EXAMPLES = Path(__file__).resolve().parents[3] / "resources" / "examples"

SMALL = """\
import torch
a = torch.tensor([1., 2.], requires_grad=True)
b = a * 2
c = b + 1
c.sum().backward()
print("GRAD", a.grad.tolist())
"""

MODEL = """\
import torch
from torch import nn
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)
    def forward(self, x):
        h = self.fc(x)
        return h.relu()
model = Net()
x = torch.ones(1, 2)
out = model(x)
out.sum().backward()
"""

DETACH = """\
import torch
a = torch.tensor([1., 2.], requires_grad=True)
b = a * 2
c = b.detach() * a
c.sum().backward()
"""


class Driver:
    def __init__(self):
        self.events: queue.Queue = queue.Queue()
        self.client = WorkerClient(self.events.put, prestart=False)
        self.pid = None  # the worker's, from its hello

    def wait(self, *kinds: str):
        while True:
            event = self.events.get(timeout=WAIT_S)
            if event.kind == "hello":
                self.pid = event.pid
            if event.kind in kinds:
                return event

    def close(self):
        self.client.close()


@pytest.fixture
def driver():
    d = Driver()
    yield d
    d.close()


def write(tmp_path, text, name="script.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def names(graph) -> list[str]:
    return sorted(n.name for n in graph.nodes)


def test_backward_lines_are_found_with_ast():
    src = "import torch\nx = 1\nloss.backward()\ny = torch.autograd.grad(\n  z, w)\nautograd.backward([l])\nq = 2\n"
    assert backward_lines(src) == {3, 4, 5, 6}


@pytest.mark.slow
def test_breakpoint_pauses_before_its_line_with_the_live_graph(driver, tmp_path):
    script = write(tmp_path, SMALL)
    driver.client.run(script, debug={"lines": [4, 5], "pause_all": False})
    paused = driver.wait("forward_paused")
    assert (paused.pause, paused.line, paused.reason, paused.function) == (1, 4, "breakpoint", "<module>")
    assert paused.file == str(Path(script).resolve())
    graph = call_from_dict(paused.graph)
    assert graph.api == "live" and graph.id == "live1" and graph.line == 4
    assert graph.title == "live graph before line 4 (pause 1)"  # what the inspector's "call" row says
    assert names(graph) == ["AccumulateGrad", "MulBackward0"]  # c = b + 1 has not run
    leaf = next(n for n in graph.nodes if n.name == "AccumulateGrad")
    assert next(t for t in graph.tensors if t.id == leaf.variable).name == "a"
    tensors = {t.name: t for t in graph.tensors if t.name}
    assert set(tensors) == {"a", "b"}
    assert tensors["b"].values.data == [2.0, 4.0] and tensors["b"].grad_fn is not None
    assert tensors["a"].requires_grad and tensors["a"].is_leaf and tensors["a"].grad is None
    assert sorted(paused.new) == sorted(n.id for n in graph.nodes)  # the first pause: all new

    driver.client.control("forward_step", kind="over")
    stepped = driver.wait("forward_paused")
    assert (stepped.pause, stepped.line, stepped.reason) == (2, 5, "step")
    graph2 = call_from_dict(stepped.graph)
    assert names(graph2) == ["AccumulateGrad", "AddBackward0", "MulBackward0"]
    add = next(n for n in graph2.nodes if n.name == "AddBackward0")
    assert stepped.new == [add.id]
    assert {t.name: t.values.data for t in graph2.tensors if t.name} == {"a": [1.0, 2.0], "b": [2.0, 4.0],
                                                                           "c": [3.0, 5.0]}

    driver.client.control("continue")
    begin = driver.wait("step_begin")  # line 5 calls backward: it pauses there, as before
    assert begin.line == 5 and begin.debug
    assert [n.name for n in call_from_dict(begin.graph).nodes] == [
        "SumBackward0", "AddBackward0", "MulBackward0", "AccumulateGrad"]
    seen = []
    while True:
        event = driver.wait("step_paused", "step_end")
        if event.kind == "step_end":
            break
        seen.append(event.pending["name"])
        driver.client.control("step", count=1)
    assert seen == ["SumBackward0", "AddBackward0", "MulBackward0", "AccumulateGrad"]
    assert event.state == StepperState.FINISHED
    result = driver.wait("finished").result
    assert result.trace.error is None
    assert "GRAD [2.0, 2.0]" in result.output


@pytest.mark.slow
def test_breakpoint_in_forward_of_a_module_and_step_into(driver, tmp_path):
    script = write(tmp_path, MODEL)
    driver.client.run(script, debug={"lines": [8], "pause_all": False})
    paused = driver.wait("forward_paused")
    assert (paused.line, paused.function, paused.module) == (8, "forward", "model")
    assert [(s["function"], s["line"], s["module"]) for s in paused.stack] == [("<module>", 12, None),
                                                                              ("forward", 8, "model")]
    tensors = {t.name for t in call_from_dict(paused.graph).tensors}
    assert {"x", "fc.weight", "fc.bias"} <= tensors  # the script's one model names its parameters by path
    driver.client.control("continue")
    driver.wait("finished")

    driver.client.run(script, debug={"lines": [12], "pause_all": False})
    paused = driver.wait("forward_paused")
    assert (paused.line, paused.function) == (12, "<module>")
    seen = []
    for _ in range(3):
        driver.client.control("forward_step", kind="into")
        step = driver.wait("forward_paused")
        seen.append((step.function, step.line, Path(step.file).name))
    # into forward, never into torch's Module.__call__ or nn.Linear
    assert seen == [("forward", 8, "script.py"), ("forward", 9, "script.py"), ("<module>", 13, "script.py")]
    assert names(call_from_dict(step.graph)) == ["AccumulateGrad", "AccumulateGrad", "AddmmBackward0",
                                                  "ReluBackward0", "TBackward0"]
    driver.client.control("resume_all")
    result = driver.wait("finished").result
    assert result.trace.error is None and result.trace.call_count == 1


@pytest.mark.slow
def test_step_out_returns_to_the_callers_next_line(driver, tmp_path):
    script = write(tmp_path, MODEL)
    driver.client.run(script, debug={"lines": [8], "pause_all": False})
    driver.wait("forward_paused")
    driver.client.control("forward_step", kind="out")
    out = driver.wait("forward_paused")
    assert (out.function, out.line, out.reason) == ("<module>", 13, "step")
    assert "ReluBackward0" in names(call_from_dict(out.graph))
    driver.client.control("continue")
    assert driver.wait("finished").result.trace.error is None


@pytest.mark.slow
def test_pause_on_errors_stops_before_the_inplace_op(driver, tmp_path):
    script = str(EXAMPLES / "08_inplace_error.py")
    driver.client.run(script, debug={"lines": [], "pause_all": False, "pause_on_errors": True})
    paused = driver.wait("forward_paused")
    assert (paused.line, paused.reason) == (12, "inplace")
    assert paused.note == ("b was saved by SigmoidBackward0 at version 0; the in-place mul_ makes it "
                           "version 1: backward will fail")
    graph = call_from_dict(paused.graph)
    assert names(graph) == ["AccumulateGrad", "SigmoidBackward0"]
    b = next(t for t in graph.tensors if t.name == "b")
    assert b.version == 0  # the op has not run yet
    driver.client.control("continue")
    result = driver.wait("finished").result
    assert result.trace.error is not None and "inplace operation" in result.trace.error.message


@pytest.mark.slow
def test_pause_on_errors_stops_before_an_inplace_op_on_a_leaf(driver, tmp_path):
    script = write(tmp_path, "import torch\nw = torch.ones(2, requires_grad=True)\nw[0] *= 2\nw.add_(1)\n")
    driver.client.run(script, debug={"lines": [], "pause_all": False, "pause_on_errors": True})
    paused = driver.wait("forward_paused")
    assert (paused.line, paused.reason) == (3, "inplace")
    assert paused.note.startswith("this is a view of w, a leaf that requires grad; the in-place mul_ on it raises")
    driver.client.control("forward_step", kind="over")  # the op raises: the script ends with its error
    result = driver.wait("finished").result
    assert result.trace.error.type == "RuntimeError" and "view of a leaf" in result.trace.error.message
    leaf = write(tmp_path, "import torch\nw = torch.ones(2, requires_grad=True)\npass\nw.add_(1)\n", "leaf.py")
    driver.client.run(leaf, debug={"lines": [], "pause_all": False, "pause_on_errors": True})
    paused = driver.wait("forward_paused")
    assert (paused.line, paused.reason) == (4, "inplace")
    assert paused.note.startswith("w is a leaf that requires grad; the in-place add_ on it raises")
    driver.client.control("continue")
    result = driver.wait("finished").result
    assert result.trace.error.type == "RuntimeError" and "leaf Variable" in result.trace.error.message


@pytest.mark.slow
def test_stop_while_paused_in_forward_ends_the_worker(driver, tmp_path):
    script = write(tmp_path, SMALL)
    driver.client.run(script, debug={"lines": [3], "pause_all": False})
    driver.wait("forward_paused")
    worker = psutil.Process(driver.pid)
    driver.client.cancel()
    result = driver.wait("finished").result
    assert result.trace.error is not None and result.trace.error.kind == "cancelled"
    assert result.trace.error.message == "stopped by you at line 3"
    worker.wait(timeout=WAIT_S)  # the worker process exits: nothing is left behind
    assert not worker.is_running()


@pytest.mark.slow
def test_stop_step_while_paused_in_forward_ends_the_run(driver, tmp_path):
    script = write(tmp_path, SMALL)
    driver.client.run(script, debug={"lines": [3], "pause_all": False})
    driver.wait("forward_paused")
    driver.client.control("stop_step")
    result = driver.wait("finished").result
    assert result.trace.error is not None and result.trace.error.kind == "cancelled"
    assert "GRAD" not in result.output


@pytest.mark.slow
def test_stepping_over_a_detach_line_adds_the_cut_stub(driver, tmp_path):
    script = write(tmp_path, DETACH)
    driver.client.run(script, debug={"lines": [4], "pause_all": False})
    before = call_from_dict(driver.wait("forward_paused").graph)
    assert [n.name for n in before.nodes if n.cuts] == ["MulBackward0"]  # b = a * 2: the constant 2
    driver.client.control("forward_step", kind="over")
    stepped = driver.wait("forward_paused")
    after = call_from_dict(stepped.graph)
    cut = [n for n in after.nodes if n.cuts and n.id in stepped.new]
    assert len(cut) == 1 and cut[0].name == "MulBackward0"
    assert [c["cause"] for c in cut[0].cuts] == ["detach"]
    driver.client.control("resume_all")
    assert driver.wait("finished").result.trace.error is None


@pytest.mark.slow
def test_run_to_first_nan_pauses_after_the_op(driver, tmp_path):
    script = write(tmp_path, """\
        import torch
        w = torch.tensor([1., 0., 2.], requires_grad=True)
        y = w * 3
        z = y.log()
        loss = (z * 0).sum()
        loss.backward()
        """)
    driver.client.run(script, debug={"lines": [], "pause_all": False, "to_nan": True}, nan_check=True)
    paused = driver.wait("forward_paused")
    assert (paused.line, paused.reason) == (4, "nan")
    assert "-inf" in paused.note and "of 3" in paused.note
    assert "LogBackward0" in names(call_from_dict(paused.graph))
    driver.client.control("continue")
    begin = driver.wait("step_begin")  # backward: paused before the first node a non-finite gradient reaches
    assert begin.line == 6
    pending = driver.wait("step_paused").pending
    assert pending["name"] == "MulBackward0"
    driver.client.control("resume_all")
    assert driver.wait("finished").result.trace.error is None


@pytest.mark.slow
def test_a_debug_run_without_forward_breakpoints_pauses_only_at_backward(driver, tmp_path):
    script = write(tmp_path, SMALL)
    driver.client.run(script, debug={"lines": [5], "pause_all": False})
    first = driver.wait("forward_paused", "step_begin")
    assert first.kind == "step_begin" and first.line == 5
    driver.client.control("resume_all")
    assert driver.wait("finished").result.trace.error is None


@pytest.mark.slow
def test_headless_step_at_line_writes_the_live_graph(tmp_path):
    script = write(tmp_path, SMALL)
    out = tmp_path / "live.json"
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, str(root / "main.py"), "step", script, "--at-line", "5", "--json", str(out)],
                          capture_output=True, text=True, timeout=WAIT_S * 2, cwd=root)
    assert done.returncode == 0, done.stderr
    assert "before line 5 (<module>): 3 node(s), 3 live tensor(s)" in done.stdout
    doc = json.loads(out.read_text())
    assert (doc["format"], doc["line"], doc["function"]) == ("backprop-studio-live", 5, "<module>")
    call = call_from_dict(doc["call"])
    assert [(n.name, n.label) for n in call.nodes] == [("AddBackward0", "c"), ("MulBackward0", "b"),
                                                      ("AccumulateGrad", "a")]
    assert {t.name: t.values.data for t in call.tensors if t.name} == {"a": [1.0, 2.0], "b": [2.0, 4.0],
                                                                      "c": [3.0, 5.0]}
    never = subprocess.run([sys.executable, str(root / "main.py"), "step", script, "--at-line", "40"],
                           capture_output=True, text=True, timeout=WAIT_S * 2, cwd=root)
    assert never.returncode == 1
    assert "line 40 of script.py was never reached" in never.stderr


@pytest.mark.slow
def test_headless_step_at_a_notebook_cell_line(tmp_path):
    cells = [{"cell_type": "markdown", "metadata": {}, "source": ["# the graph, cell by cell"]}] + [
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": src} for src in (
            ["import torch\n", "a = torch.tensor([1., 2.], requires_grad=True)"],
            ["b = a * 2\n", "c = b + 1\n", "c.sum().backward()"])]
    notebook = tmp_path / "lesson.ipynb"
    notebook.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    out = tmp_path / "live.json"
    root = Path(__file__).resolve().parents[3]

    def step(*args):
        return subprocess.run([sys.executable, str(root / "main.py"), "step", str(notebook), *args],
                              capture_output=True, text=True, timeout=WAIT_S * 2, cwd=root)

    done = step("--at-line", "3:2", "--json", str(out))  # cell 3, line 2: c = b + 1
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert (doc["cell"], doc["cell_line"]) == (3, 2)
    assert f"before cell 3, line 2 (script line {doc['line']}, <module>): 2 node(s), 2 live tensor(s)" in done.stdout
    assert [n.name for n in call_from_dict(doc["call"]).nodes] == ["MulBackward0", "AccumulateGrad"]
    # the same line of the whole script pauses at the same place
    again = step("--at-line", str(doc["line"]))
    assert again.returncode == 0 and "before cell 3, line 2" in again.stdout
    missing = step("--at-line", "3:9")
    assert missing.returncode == 2
    assert "--at-line 3:9: the notebook has no code cell 3 with a line 9" in missing.stderr


LOOP = """\
import torch
w = torch.tensor([1.0, -2.0], requires_grad=True)
for i in range(3):
    loss = (w * (i + 1)).tanh().sum()
    loss.backward()
"""


@pytest.mark.slow
def test_breakpoint_set_while_running_and_next_call(driver, tmp_path):
    script = write(tmp_path, LOOP)
    driver.client.run(script, debug={"lines": [5], "pause_all": False})
    begin = driver.wait("step_begin")
    assert (begin.call, begin.line) == (0, 5)
    driver.client.control("breakpoints", lines=[4, 5], pause_all=False)  # the loop's frame is running already
    driver.client.control("continue")
    paused = driver.wait("forward_paused")
    assert (paused.pause, paused.line, paused.reason) == (1, 4, "breakpoint")
    driver.client.control("next_call")  # to the next backward call, past line 4's breakpoint
    begin = driver.wait("step_begin", "forward_paused")
    assert (begin.kind, begin.call, begin.line) == ("step_begin", 1, 5)
    driver.client.control("continue")
    paused = driver.wait("forward_paused", "step_begin")
    assert (paused.kind, paused.pause, paused.line) == ("forward_paused", 2, 4)
    driver.client.control("resume_all")
    result = driver.wait("finished").result
    assert result.trace.error is None and result.trace.call_count == 3


@pytest.mark.slow
def test_a_pause_keeps_nothing_alive(driver, tmp_path):
    script = write(tmp_path, """\
        import gc, weakref
        import torch
        a = torch.ones(2, requires_grad=True)
        b = a * 2
        ref = weakref.ref(b)
        del b
        gc.collect()
        print("ALIVE", ref() is not None)
        """)
    driver.client.run(script, debug={"lines": [6], "pause_all": False})
    paused = driver.wait("forward_paused")
    assert "b" in {t.name for t in call_from_dict(paused.graph).tensors}
    driver.client.control("continue")
    result = driver.wait("finished").result
    assert "ALIVE False" in result.output


@pytest.mark.slow
def test_pause_on_errors_lets_an_optimizer_step_run(driver, tmp_path):
    script = write(tmp_path, """\
        import torch
        w = torch.ones(3, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.5)
        for i in range(3):
            loss = (w * w).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        h = w * 1
        print("W", w.tolist())
        """)
    driver.client.run(script, debug={"lines": [], "pause_all": False, "pause_on_errors": True})
    first = driver.wait("forward_paused", "finished")
    assert first.kind == "finished"  # in-place updates under no_grad of a graph already backwarded
    assert first.result.trace.error is None and "W [0.0, 0.0, 0.0]" in first.result.output


@pytest.mark.slow
def test_a_leaf_not_used_yet_is_new_once(driver, tmp_path):
    # torch frees a leaf's AccumulateGrad while no op uses the leaf and makes another one later
    script = write(tmp_path, """\
        import torch
        a = torch.ones(2, requires_grad=True)
        x = 1
        y = 2
        b = a * 3
        z = 0
        """)
    driver.client.run(script, debug={"lines": [3], "pause_all": False})
    first = driver.wait("forward_paused")
    assert [n.name for n in call_from_dict(first.graph).nodes] == ["AccumulateGrad"] and len(first.new) == 1
    driver.client.control("forward_step", kind="over")
    second = driver.wait("forward_paused")
    assert second.line == 4 and second.new == []
    for _ in range(2):
        driver.client.control("forward_step", kind="over")
        third = driver.wait("forward_paused")
    graph = call_from_dict(third.graph)
    assert third.line == 6 and [n.name for n in graph.nodes] == ["MulBackward0", "AccumulateGrad"]
    assert third.new == [graph.nodes[0].id]
    driver.client.control("resume_all")
    driver.wait("finished")


@pytest.mark.slow
def test_stop_while_paused_before_an_inplace_op(driver, tmp_path):
    driver.client.run(str(EXAMPLES / "08_inplace_error.py"),
                      debug={"lines": [], "pause_all": False, "pause_on_errors": True})
    assert driver.wait("forward_paused").reason == "inplace"
    worker = psutil.Process(driver.pid)
    driver.client.cancel()
    result = driver.wait("finished").result
    assert result.trace.error.kind == "cancelled" and result.trace.error.message == "stopped by you at line 12"
    assert "b._version after" not in result.output  # the op never ran
    worker.wait(timeout=WAIT_S)


@pytest.mark.slow
def test_run_to_first_nan_in_backward_only_pauses_in_that_call(driver, tmp_path):
    script = write(tmp_path, """\
        import torch
        w = torch.tensor([2.0, 3.0], requires_grad=True)
        for i in range(4):
            loss = (w - i).clamp(min=0).sqrt().sum()
            loss.backward()
        """)
    driver.client.run(script, debug={"lines": [], "pause_all": False, "to_nan": True}, nan_check=True)
    begin = driver.wait("forward_paused", "step_begin")
    # every forward value is finite; calls 0 and 1 ran without a message, call 2's sqrt(0) has an infinite slope
    assert (begin.kind, begin.call, begin.line) == ("step_begin", 2, 5)
    ran = []
    while True:
        event = driver.wait("step", "step_paused")
        if event.kind == "step_paused":
            break
        ran.append(event.record["name"])
    assert ran == ["SumBackward0", "SqrtBackward0"]  # run before the pause, sent with it
    assert event.pending["name"] == "ClampBackward1" and event.pending["grad_outputs"][0]["data"][0] == "inf"
    driver.client.control("continue")
    assert driver.wait("step_end").state == StepperState.FINISHED
    assert driver.wait("finished").result.trace.error is None
