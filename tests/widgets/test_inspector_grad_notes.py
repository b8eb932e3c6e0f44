"""The inspector writes a node's retained grad and autograd.grad's result for it, as the graph does."""

import textwrap

import pytest

from core.model.grad_notes import RESULT_TIP, RETAINED_TIP
from core.model.trace_json import trace_from_json
from core.worker.capture.recorder import capture_script
from widgets.panels.inspector import InspectorPanel

SCRIPT = """
import torch
x = torch.tensor(2.0, requires_grad=True)
hidden = x * 3
hidden.retain_grad()
out = hidden * (x + 1)
out.backward(retain_graph=True)
out.backward()
w = torch.tensor([1.0, 2.0], requires_grad=True)
(gw,) = torch.autograd.grad((w * w).sum(), w)
"""


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("notes") / "notes.py"
    path.write_text(textwrap.dedent(SCRIPT))
    return trace_from_json(capture_script(str(path)).to_json())


def _section(inspector, title):
    lines = [line.strip() for line in inspector.text().splitlines() if line.strip()]
    return lines[lines.index(title) + 1:lines.index(title) + 3]


def test_a_retained_grad_and_its_sum_over_two_calls(qtbot, trace):
    inspector = InspectorPanel()
    qtbot.addWidget(inspector)
    first, second = trace.calls[0], trace.calls[1]
    node = next(n.id for n in first.nodes if n.label == "hidden")
    inspector.show_node(first, node)
    assert _section(inspector, "Gradient after this call") == [RETAINED_TIP.replace("\n", " "), "hidden.grad = 3"]
    node = next(n.id for n in second.nodes if n.label == "hidden")
    inspector.show_node(second, node)
    assert _section(inspector, "Gradient after this call")[1] == "hidden.grad = 3 (before) + 3 = 6"


def test_an_autograd_grad_result_on_its_leaf(qtbot, trace):
    inspector = InspectorPanel()
    qtbot.addWidget(inspector)
    call = trace.calls[2]
    leaf = next(n.id for n in call.nodes if n.kind == "accumulate_grad")
    inspector.show_node(call, leaf)
    assert _section(inspector, "Gradient after this call") == [RESULT_TIP, "returns ∂output/∂w = [2, 4]"]


def test_a_node_without_such_a_gradient_has_no_section(qtbot, trace):
    inspector = InspectorPanel()
    qtbot.addWidget(inspector)
    call = trace.calls[0]
    inspector.show_node(call, call.roots[0])
    assert "Gradient after this call" not in inspector.text()


def test_a_tensor_given_to_autograd_grad_shows_what_it_returned(qtbot, trace):
    inspector = InspectorPanel()
    qtbot.addWidget(inspector)
    call = trace.calls[2]
    w = next(t for t in call.tensors if t.name == "w")
    inspector.show_tensor(call, w.id)
    lines = [line.strip() for line in inspector.text().splitlines() if line.strip()]
    assert lines[lines.index(".grad") + 1:lines.index(".grad") + 3] == [
        "None", "autograd.grad() returns gradients instead of filling .grad"]
    assert lines[lines.index("Returned by autograd.grad (call #2)") + 1:] == [RESULT_TIP, "[2.0, 4.0]"]
    hidden = next(t for t in trace.calls[0].tensors if t.name == "hidden")
    inspector.show_tensor(trace.calls[0], hidden.id)
    assert "Returned by autograd.grad" not in inspector.text()
