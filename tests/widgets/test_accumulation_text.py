"""A leaf whose .grad accumulates over calls shows the sum on its chip: '4 (before) + 4 = 8'."""

from __future__ import annotations

import textwrap

import pytest

from core.model.step_state import StepTracker, leaf_chip_lines, leaf_lines_after, step_texts, step_view
from core.model.trace_json import trace_from_json
from core.worker.capture.recorder import capture_script

SCRIPT = """
import torch
x = torch.tensor(2.0, requires_grad=True)
(x * 2).backward()
(x * 2).backward()
x.grad.zero_()
(x * 2).backward()
w = torch.tensor([1.0, 2.0], requires_grad=True)
(w * 3).sum().backward()
(w * 3).sum().backward()
s = torch.tensor(2.0, requires_grad=True)
(s * s).backward()
(s * s).backward()
v = torch.arange(6.0, requires_grad=True)
v.sum().backward()
v.sum().backward()
"""


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("accumulate") / "accumulate.py"
    path.write_text(textwrap.dedent(SCRIPT))
    captured = capture_script(str(path))
    assert captured.error is None, captured.error
    return trace_from_json(captured.to_json())


def leaf_chips(call) -> list[list[str]]:
    return [leaf_lines_after(call, n) for n in call.nodes if n.kind == "accumulate_grad"]


def test_a_call_that_adds_to_a_held_grad_writes_before_plus_this_call(trace):
    chips = [leaf_chips(c) for c in trace.calls]
    assert chips == [
        [["x = 2", ".grad = 2"]],
        [["x = 2", ".grad = 2 (before) + 2 = 4"]],
        [["x = 2", ".grad = 2"]],  # zero_() emptied it: nothing held before
        [["w = [1, 2]", ".grad = [3, 3]"]],
        [["w = [1, 2]", ".grad = [3, 3] (before) + [3, 3] = [6, 6]"]],
        [["s = 2", ".grad = 2 + 2 = 4"]],  # two edges into s, nothing held before
        [["s = 2", ".grad = 4 (before) + 2 + 2 = 8"]],
        [["v = [0, 1, 2, 3, 4, 5]", ".grad = [1, 1, 1, 1, 1, 1]"]],
        # Too long to write as a sum: the chip says the call added to what was held.
        [["v = [0, 1, 2, 3, 4, 5]", ".grad = [2, 2, 2, 2, 2, 2]", "(this call added to the .grad held before)"]],
    ]


def test_the_graph_draws_the_sum_on_the_leaf_chip(qtbot, trace):
    from widgets.export.graph_export import offscreen_view

    with offscreen_view(trace.calls[1], values=True) as view:
        values = [" ".join(t.lines) for t in view.marks.tags if t.kind == "value"]
        assert "x = 2 .grad = 2 (before) + 2 = 4" in values


def _steps(call, held: float, added: float) -> list[dict]:
    """The engine's records of backward of ``call`` (x * 2): MulBackward0, then x's AccumulateGrad."""
    mul = next(n for n in call.nodes if n.kind != "accumulate_grad")
    leaf = next(n for n in call.nodes if n.kind == "accumulate_grad")
    grad = {"data": [added], "numel": 1}
    return [{"index": 0, "node": mul.id, "name": mul.name, "grad_outputs": [{"data": [1.0], "numel": 1}],
             "grad_inputs": [grad if e is not None and e.node == leaf.id else None for e in mul.next],
             "leaf_grads": {}, "error": None},
            {"index": 1, "node": leaf.id, "name": "AccumulateGrad", "grad_outputs": [grad], "grad_inputs": [],
             "leaf_grads": {"x": {"data": [held + added], "numel": 1}}, "error": None}]


def test_a_stepped_leaf_shows_before_plus_this_step_once_its_accumulate_grad_ran(trace):
    call = trace.calls[1]
    leaf = next(n for n in call.nodes if n.kind == "accumulate_grad")
    mul = next(n for n in call.nodes if n.kind != "accumulate_grad")
    steps = _steps(call, 2.0, 2.0)
    tracker = StepTracker(call)
    tracker.add(steps[0])
    # Before its AccumulateGrad ran, the .grad held when backward began (what call 0 left).
    assert leaf_chip_lines(call, leaf, tracker.leaf_grads, trace.calls[0]) == ["x = 2", ".grad = 2"]
    tracker.add(steps[1])
    assert leaf_chip_lines(call, leaf, tracker.leaf_grads) == ["x = 2", ".grad = 2 (before) + 2 = 4"]
    assert tracker.edge_texts[(mul.id, leaf.id)] == "grad = 2  \u21d2 .grad 2 (before) + 2 = 4"
    # A replayed step says the same.
    view = step_view(call, steps)
    assert leaf_chip_lines(call, leaf, view.leaf_grads) == ["x = 2", ".grad = 2 (before) + 2 = 4"]
    assert step_texts(call, view)[(mul.id, leaf.id)] == "grad = 2  \u21d2 .grad 2 (before) + 2 = 4"


def test_a_stepped_leaf_that_held_no_grad_shows_this_step_alone(trace):
    call = trace.calls[0]
    leaf = next(n for n in call.nodes if n.kind == "accumulate_grad")
    mul = next(n for n in call.nodes if n.kind != "accumulate_grad")
    view = step_view(call, _steps(call, 0.0, 2.0))
    assert leaf_chip_lines(call, leaf, view.leaf_grads) == ["x = 2", ".grad = 2"]
    assert step_texts(call, view)[(mul.id, leaf.id)] == "grad = 2  \u21d2 .grad 2"
