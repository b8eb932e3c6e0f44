"""Retained grads and autograd.grad's results, captured and written on their nodes with torch's numbers."""

import textwrap

import pytest

from core.model.grad_notes import node_notes
from core.worker.capture.recorder import capture_script

UNNAMED = """
import types
import torch
x = torch.tensor(2.0, requires_grad=True)
box = types.SimpleNamespace()
box.h = x * 3
box.h.retain_grad()
kept = {"a": {"b": x * 5}}
kept["a"]["b"].retain_grad()
(box.h * 2 + kept["a"]["b"] * 4).backward()
"""

TWICE = """
import torch
x = torch.tensor(2.0, requires_grad=True)
hidden = x * 3
hidden.retain_grad()
out = hidden * (x + 1)
out.backward(retain_graph=True)
out.backward(retain_graph=True)
(gx,) = torch.autograd.grad(out, x)
"""


def _capture(tmp_path, source):
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(source))
    trace = capture_script(str(path))
    assert trace.error is None, trace.error
    return trace


def _plain(source) -> dict:
    namespace: dict = {}
    exec(compile(textwrap.dedent(source), "<plain>", "exec"), namespace)
    return namespace


def test_a_retained_tensor_the_script_holds_under_no_name_keeps_its_grad(tmp_path):
    plain = _plain(UNNAMED)
    assert (plain["box"].h.grad.item(), plain["kept"]["a"]["b"].grad.item()) == (2.0, 4.0)
    call = _capture(tmp_path, UNNAMED).calls[0]
    notes = node_notes(call)
    assert sorted(notes.values()) == [[".grad = 2 (retained)"], [".grad = 4 (retained)"]]
    # on the nodes that made box.h = x * 3 and kept["a"]["b"] = x * 5
    assert [call.node(nid).name for nid in notes] == ["MulBackward0", "MulBackward0"]
    assert sorted(call.tensor(call.node(nid).tensor).values.data[0] for nid in notes) == [6.0, 10.0]


def test_a_retained_grad_sums_over_calls_and_autograd_grad_fills_it_too(tmp_path):
    plain = _plain(TWICE)
    # torch's numbers: each call adds other_hidden = 3 into hidden.grad, autograd.grad included
    assert plain["hidden"].grad.item() == 9.0 and plain["gx"].item() == 15.0
    trace = _capture(tmp_path, TWICE)
    hidden = [next(n.id for n in c.nodes if n.label == "hidden") for c in trace.calls]
    leaf = next(n.id for n in trace.calls[2].nodes if n.label == "x")
    assert [node_notes(c) for c in trace.calls] == [
        {hidden[0]: ["hidden.grad = 3"]},
        {hidden[1]: ["hidden.grad = 3 (before) + 3 = 6"]},
        {hidden[2]: ["hidden.grad = 6 (before) + 3 = 9"], leaf: ["returns ∂out/∂x = 15"]},
    ]


INPUTS = """
import torch
x = torch.tensor(2.0, requires_grad=True)
hidden = x * 3
out = hidden * (x + 1)
out.backward(inputs=[hidden], retain_graph=True)
first = hidden.grad.item()
torch.autograd.backward(out, inputs=[x, hidden])
"""


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_backward_inputs_fill_a_non_leafs_grad_and_the_trace_reads_it(tmp_path):
    plain = _plain(INPUTS)
    # torch: backward(inputs=[hidden]) retains hidden's grad; x gets none until it is an input too
    assert (plain["first"], plain["hidden"].grad.item(), plain["x"].grad.item()) == (3.0, 6.0, 15.0)
    assert plain["hidden"].retains_grad
    trace = _capture(tmp_path, INPUTS)
    hidden = [next(n.id for n in c.nodes if n.label == "hidden") for c in trace.calls]
    assert [node_notes(c) for c in trace.calls] == [{hidden[0]: ["hidden.grad = 3"]},
                                                    {hidden[1]: ["hidden.grad = 3 (before) + 3 = 6"]}]
    assert [next(t for t in c.tensors if t.name == "hidden").retains_grad for c in trace.calls] == [True, True]


@pytest.mark.slow
def test_a_stepped_call_reports_unnamed_retained_grads_as_their_nodes_run(tmp_path):
    from core.model.step_state import step_view
    from tests.core.worker.test_debug_run import Driver

    path = tmp_path / "unnamed.py"
    path.write_text(textwrap.dedent(UNNAMED))
    driver = Driver()
    try:
        driver.client.run(str(path), debug={"pause_all": False, "skip_to": 0})
        driver.wait("step_begin")
        driver.step_to_end(0)
        trace = driver.wait("finished").result.trace
    finally:
        driver.close()
    call, steps = trace.calls[0], driver.steps[0]
    # each retained grad is reported, keyed by its node, by the step of the node that made it
    made = {nid for nid, notes in node_notes(call).items()}
    reported = [(s["node"], sorted(s["leaf_grads"])) for s in steps if s["leaf_grads"] and s["node"] in made]
    assert sorted(reported) == sorted((nid, [nid]) for nid in made)
    first = min(i for i, s in enumerate(steps) if s["node"] in made)
    before = node_notes(call, step_view(call, steps, upto=first).leaf_grads)
    assert sorted(before.values()) == [[".grad = None (retained)"]] * 2
    after = node_notes(call, step_view(call, steps).leaf_grads)
    assert sorted(after.values()) == [[".grad = 2 (retained)"], [".grad = 4 (retained)"]] == sorted(node_notes(call).values())
