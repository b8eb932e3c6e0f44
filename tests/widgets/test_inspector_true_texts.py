"""The inspector tells a tensor as the script ended against the call whose graph is shown."""

import textwrap

import pytest

from core.model.trace_json import trace_from_json
from core.worker.capture.recorder import capture_script
from widgets.panels.inspector import InspectorPanel

UNUSED = """
import torch
x = torch.ones(2, requires_grad=True)
w = torch.ones(2, requires_grad=True)
y = x * 2
u = w * 5
loss = y.sum()
loss.backward()
"""


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("unused") / "unused.py"
    path.write_text(textwrap.dedent(UNUSED))
    return trace_from_json(capture_script(str(path)).to_json())


def _lines(inspector):
    return [line.strip() for line in inspector.text().splitlines() if line.strip()]


def _row(lines, key):
    """A table row's value (the plain text puts each cell on its own line)."""
    return lines[lines.index(key) + 1]


def test_a_top_level_tensor_names_its_node_in_the_shown_call(qtbot, trace):
    inspector = InspectorPanel()
    qtbot.addWidget(inspector)
    call = trace.calls[0]
    y = next(t for t in trace.tensors if t.name == "y")
    assert y.grad_fn is None and y.grad_fn_name == "MulBackward0"  # ids of the top table name no node
    inspector.show_tensor({t.id: t for t in trace.tensors}, y.id, call)
    assert _row(_lines(inspector), "grad_fn") == "MulBackward0 (y) · in call #0"
    u = next(t for t in trace.tensors if t.name == "u")
    inspector.show_tensor({t.id: t for t in trace.tensors}, u.id, call)
    assert _row(_lines(inspector), "grad_fn") == "MulBackward0 (not in call #0's graph)"


def test_a_leaf_the_loss_never_used_is_off_the_path(qtbot, trace):
    inspector = InspectorPanel()
    qtbot.addWidget(inspector)
    w = next(t for t in trace.tensors if t.name == "w")
    inspector.show_tensor({t.id: t for t in trace.tensors}, w.id, trace.calls[0])
    lines = _lines(inspector)
    assert _row(lines[lines.index(".grad"):], "None") == "not on the path to the loss: backward never reaches it"
    assert "not reached by backward yet" not in inspector.text()


def test_the_shown_calls_own_table_links_its_nodes(qtbot, trace):
    inspector = InspectorPanel()
    qtbot.addWidget(inspector)
    call = trace.calls[0]
    y = next(t for t in call.tensors if t.name == "y")
    inspector.show_tensor({t.id: t for t in call.tensors}, y.id, call)
    assert _row(_lines(inspector), "grad_fn") == "MulBackward0 (y)"


def test_a_tensors_shape_is_written_as_a_shape(qtbot, trace):
    inspector = InspectorPanel()
    qtbot.addWidget(inspector)
    call = trace.calls[0]
    y = next(t for t in call.tensors if t.name == "y")
    inspector.show_tensor(call, y.id)
    lines = _lines(inspector)
    assert lines[1] == "float32  shape 2 · cpu · non-leaf · requires grad"
    assert _row(lines, "shape") == "2"
    assert _row(lines, "Value") == "2 elements" and _row(lines, "2 elements") == "[2.0, 2.0]"
