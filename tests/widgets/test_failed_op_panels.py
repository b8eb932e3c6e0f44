"""The op a forward pass failed in, told by the panels: the inspector's "Failed here" on the op's
inputs, the Problems entry that names the graph it is drawn on and opens it, and the Calls row
headed by the op. The calls are the ones capture records (see tests/widgets/test_forward_error_marks.py),
built here without torch."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt, QUrl

from app.session.opening import opening_node
from core.model.trace import ErrorInfo, Trace
from tests.fixtures_graphs import mul_call
from tests.widgets.test_forward_error_marks import LEAF, MM, device_mismatch_under_a_consumer, leaf_inplace, \
    mm_mismatch
from widgets.panels.calls import HEAD_ROLE, STATE_ROLE, CallsPanel
from widgets.panels.inspector import InspectorPanel
from widgets.panels.problems import ProblemsPanel

EXAMPLES = Path(__file__).resolve().parents[2] / "resources" / "examples"


def _run_error(call, message=LEAF, line=17):
    """The run's error for ``call``'s failed op, as the worker sends it (the op with its call's id)."""
    op = {k: v for k, v in call.options["failed_op"].items() if k not in ("type", "message")}
    return ErrorInfo(type="RuntimeError", message=message, line=line, failed_op={**op, "call": call.id})


def _leaf_trace():
    """18_inplace_on_leaf.py: one backward (#0), then ``x += 1`` fails on the leaf x (#1)."""
    failed = leaf_inplace()
    return Trace(calls=[mul_call(), failed], error=_run_error(failed), call_count=1)


def _failed_here(text: str) -> list[str]:
    """The inspector's "Failed here" section, one line per row (key and value joined by a tab)."""
    if "Failed here" not in text:
        return []
    section = text.split("Failed here\n", 1)[1].split("\nThis node\n", 1)[0]
    lines, out = [line for line in section.split("\n") if line], []
    keys = ("op", "why", "script line") + tuple(f"input {i}" for i in range(4))
    for line in lines:
        if out and out[-1] in keys:
            out[-1] += "\t" + line
        else:
            out.append(line)
    return out


# -- inspector ------------------------------------------------------------------------------------


@pytest.fixture
def inspector(qtbot):
    panel = InspectorPanel()
    qtbot.addWidget(panel)
    panel.resize(420, 900)
    return panel


def test_the_failed_ops_input_says_it_failed_here_with_the_whole_error(inspector):
    inspector.show_node(leaf_inplace(), "n0")
    assert _failed_here(inspector.text()) == [
        "the script stopped in forward at this op, called on this node's tensor; backward never ran on this graph",
        "✖ x.add_(1) raised RuntimeError",
        LEAF,
        "op\tx.add_(1)",
        "why\ta leaf that requires grad cannot be changed in place",
        "script line\tline 17",
        "input 0\tx (this node) · shape 2 · float32 · requires_grad True · leaf True",
    ]
    assert "call\n#1 failed in forward: x.add_(1) (line 17)\n" in inspector.text()
    assert "href='line:17'" in inspector.browser.toHtml().replace('"', "'")


def test_each_input_of_a_two_input_op_links_to_the_other(qtbot, inspector):
    call = mm_mismatch()
    inspector.show_node(call, "n2")
    assert _failed_here(inspector.text())[1:] == [
        "✖ torch.mm(h, w) raised RuntimeError",
        MM,
        "op\ttorch.mm(h, w)",
        "why\tshapes 2×3 and 4×5 cannot be multiplied (3 ≠ 4)",
        "script line\tline 6",
        "input 0\th · shape 2×3 · float32 · requires_grad True · leaf False",
        "input 1\tw (this node) · shape 4×5 · float32 · requires_grad True · leaf True",
    ]
    with qtbot.waitSignal(inspector.sig_node_selected) as picked:
        inspector._on_anchor(QUrl("node:n0"))  # the link on h
    assert picked.args == ["n0"]
    inspector.show_node(call, "n0")
    assert _failed_here(inspector.text())[-2:] == [
        "input 0\th (this node) · shape 2×3 · float32 · requires_grad True · leaf False",
        "input 1\tw · shape 4×5 · float32 · requires_grad True · leaf True",
    ]


def test_a_node_the_op_was_not_called_on_has_no_failed_section(inspector):
    inspector.show_node(mm_mismatch(), "n1")  # x: h = x * 2 was fine
    assert _failed_here(inspector.text()) == [] and "This node" not in inspector.text()
    inspector.show_node(device_mismatch_under_a_consumer(), "n0")  # fine = on_meta * also_meta
    assert _failed_here(inspector.text()) == []
    inspector.show_node(device_mismatch_under_a_consumer(), "n1")
    assert _failed_here(inspector.text())[3:5] == ["op\ton_meta.mul(cpu_tensor)",
                                                    "why\ta tensor on cpu meets one on meta: move one with .to()"]
    inspector.show_node(mul_call(), "n1")
    assert _failed_here(inspector.text()) == [] and "call\n#0 Tensor.backward (line 3)\n" in inspector.text()


def test_a_notebooks_failed_op_is_placed_by_cell_and_line(inspector):
    call = leaf_inplace()
    op = dict(call.options["failed_op"], text="x.mul_(3)", line=5, where="cell 2, line 2")
    inspector.cells = [{"first": 1, "lines": 2}, {"first": 4, "lines": 2}]
    inspector.show_node(replace(call, options={"failed_op": op}), "n0")
    rows = _failed_here(inspector.text())
    assert rows[3] == "op\tx.mul_(3)" and rows[5] == "script line\tcell 2, line 2"
    assert "call\n#1 failed in forward: x.mul_(3) (cell 2, line 2)\n" in inspector.text()


# -- problems -------------------------------------------------------------------------------------


@pytest.fixture
def problems(qtbot):
    panel = ProblemsPanel()
    qtbot.addWidget(panel)
    return panel


def _activated(panel: ProblemsPanel, row: int = 0) -> list[tuple[str, object]]:
    """What activating a row (Enter, double-click) asks for, in order."""
    said: list[tuple[str, object]] = []
    panel.sig_call_selected.connect(lambda c: said.append(("call", c)))
    panel.sig_node_selected.connect(lambda n: said.append(("node", n)))
    panel.sig_line_activated.connect(lambda n: said.append(("line", n)))
    panel.tree.itemActivated.emit(panel.tree.topLevelItem(row), 0)
    return said


def test_the_runs_error_names_the_graph_its_op_is_drawn_on_and_opens_it(problems):
    problems.set_trace(_leaf_trace())
    (problem,) = problems.problems()
    assert (problem.summary, problem.where, problem.call, problem.node, problem.line) == (
        f"RuntimeError: {LEAF}", "line 17 · call #1", "c1", "n0", 17)
    assert problems.tree.topLevelItem(0).text(1) == "line 17 · call #1"
    assert problems.current_text().splitlines()[:4] == [
        "The script raised an exception", f"RuntimeError: {LEAF}", "at line 17", "Drawn on graph #1 at x"]
    details = problems.details.toPlainText()
    assert "Drawn on graph #1 at x (Enter or double-click opens it)" in details
    assert "href='node:n0'" in problem.details
    assert _activated(problems) == [("call", "c1"), ("node", "n0"), ("line", 17)]
    # the trace's error shown again (as the window does after set_trace) stays one entry
    problems.show_error(_leaf_trace().error)
    assert problems.count() == 1


def test_an_op_on_two_inputs_is_drawn_at_both(problems):
    failed = mm_mismatch()
    problems.set_trace(Trace(calls=[failed], error=_run_error(failed, MM, 6)))
    (problem,) = problems.problems()
    assert (problem.where, problem.call, problem.node) == ("line 6 · call #0", "c0", "n0")
    assert problems.current_text().splitlines()[3] == "Drawn on graph #0 at h and w"


def test_only_an_error_whose_op_is_drawn_on_a_listed_graph_points_there(problems):
    problems.set_trace(_leaf_trace())
    assert (problems.problems()[0].call, problems.problems()[0].node) == ("c1", "n0")
    plain = ErrorInfo(type="RuntimeError", message=LEAF, line=17)
    problems.set_trace(Trace(calls=[mul_call(), leaf_inplace()], error=plain))
    (problem,) = problems.problems()
    assert (problem.where, problem.call, problem.node) == ("line 17", None, None)
    assert "Drawn on graph" not in problems.current_text()
    assert _activated(problems) == [("line", 17)]
    # an op whose inputs had no graph: told, and nothing to open
    nothing = replace(plain, failed_op={"name": "add_", "text": "x.add_(1)", "line": 17, "inputs": [], "call": None})
    problems.set_trace(Trace(calls=[mul_call()], error=nothing))
    assert problems.problems()[0].call is None and "Drawn on graph" not in problems.current_text()
    # an error whose graph is not among the listed calls (another run's) is not linked to them
    problems.set_trace(Trace(calls=[mul_call(), replace(leaf_inplace(), options={})], error=_leaf_trace().error))
    assert (problems.problems()[0].call, problems.problems()[0].node) == (None, None)


# -- calls ----------------------------------------------------------------------------------------


def test_the_calls_list_heads_the_failed_graph_by_its_op(qtbot):
    panel = CallsPanel()
    qtbot.addWidget(panel)
    unreached = replace(mul_call(), id="c2", index=2, api="unreached")
    panel.set_trace(replace(_leaf_trace(), calls=[mul_call(), leaf_inplace(), unreached]))
    rows = [panel.list.item(r).text() for r in range(panel.list.count())]
    assert rows == [
        "#0 Tensor.backward · line 3 · 3 nodes",
        "#1 failed in forward: x.add_(1) · line 17 · 1 node · RuntimeError",
        "#2 (never backwarded) · line 3 · 3 nodes",
    ]
    failed = panel.list.item(1)
    assert (failed.data(HEAD_ROLE), failed.data(STATE_ROLE)) == ("#1 failed in forward: x.add_(1)", "error")
    assert panel.list.item(2).data(STATE_ROLE) == "unreached"
    assert failed.toolTip() == (
        "#1 failed in forward: x.add_(1)\n"
        "The graph the script had built when x.add_(1) raised; backward never ran on it. "
        "The op is drawn joined to the inputs it was called on.\n"
        f"RuntimeError: {LEAF}")


def test_a_notebooks_failed_graph_is_placed_by_cell_and_line(qtbot):
    panel = CallsPanel()
    qtbot.addWidget(panel)
    call = leaf_inplace()
    op = dict(call.options["failed_op"], text="x.mul_(3)", line=5, where="cell 2, line 2")
    panel.set_trace(Trace(calls=[replace(call, options={"failed_op": op})],
                          cells=[{"first": 1, "lines": 2}, {"first": 4, "lines": 2}]))
    assert panel.list.item(0).text() == "#1 failed in forward: x.mul_(3) · cell 2, line 2 · 1 node · RuntimeError"


# -- the window -----------------------------------------------------------------------------------


def _rows(window) -> list[str]:
    return [window.calls.list.item(r).text() for r in range(window.calls.list.count())]


def test_the_window_opens_on_the_failed_graph_and_problems_opens_it_again(qtbot, window):
    window.source.set_source((EXAMPLES / "18_inplace_on_leaf.py").read_text(), None)
    with qtbot.waitSignal(window.sig_trace_shown, timeout=60_000):
        window.show_trace(_leaf_trace())
    assert window.call.id == "c1" and window.calls.current_call() == "c1"
    assert _rows(window)[1] == "#1 failed in forward: x.add_(1) · line 17 · 1 node · RuntimeError"
    assert _failed_here(window.inspector.text())[1] == "✖ x.add_(1) raised RuntimeError"  # described on opening

    window.show_call("c0")
    assert window.call.id == "c0"
    window.problems.tree.itemActivated.emit(window.problems.tree.topLevelItem(0), 0)
    assert window.call.id == "c1" and window.calls.current_call() == "c1"
    assert window.session.selected == "n0" and window.graph.shown_selection() == "n0"
    assert _failed_here(window.inspector.text())[-1] == \
        "input 0\tx (this node) · shape 2 · float32 · requires_grad True · leaf True"
    assert window.source.highlighted_lines() == [17]
    assert window.state_label.text() == "Line 17: x.add_(1) failed in forward (graph #1)"


def test_the_failed_ops_line_selects_its_input(qtbot, window):
    failed = mm_mismatch()
    window.source.set_source("".join(f"line{i}\n" for i in range(1, 9)), None)
    with qtbot.waitSignal(window.sig_trace_shown, timeout=60_000):
        window.show_trace(Trace(calls=[failed], error=_run_error(failed, MM, 6)))
    window.select_node("n1")
    window.inspector._on_anchor(QUrl("line:6"))  # the same link as the "script line" row of "Failed here"
    assert window.session.selected == "n0" and window.source.highlighted_lines() == [6]
    window.select_node("n2")  # already an input: the line keeps it
    window.select_line(6)
    assert window.session.selected == "n2"
    window.select_line(3)
    assert window.state_label.text() == "Line 3 created no node of this graph"


def test_a_failed_graph_is_described_at_the_ops_first_input_before_anything_is_selected():
    assert opening_node(device_mismatch_under_a_consumer()) == "n1"  # on_meta, not the root fine
    assert opening_node(mm_mismatch()) == "n0"
    assert opening_node(mul_call()) == "n0"


@pytest.mark.slow
def test_the_bundled_in_place_example_opens_on_its_failed_op(qtbot, window):
    with qtbot.waitSignal(window.sig_trace_shown, timeout=60_000):
        window.open_script(str(EXAMPLES / "18_inplace_on_leaf.py"))
    assert _rows(window) == ["#0 Tensor.backward · line 14 · 3 nodes · x.grad [4, 6]",
                             "#1 failed in forward: x.add_(1) · line 17 · 1 node · RuntimeError"]
    assert window.call.id == window.calls.current_call() == "c1"
    problem = window.problems.problems()[0]
    assert (problem.where, problem.node) == ("line 17 · call #1", "n0")
    assert "Drawn on graph #1 at x" in window.problems.current_text().splitlines()
    assert _failed_here(window.inspector.text())[3:] == [
        "op\tx.add_(1)",
        "why\ta leaf that requires grad cannot be changed in place",
        "script line\tline 17",
        "input 0\tx (this node) · shape 2 · float32 · requires_grad True · leaf True",
    ]
    window.calls.list.setCurrentRow(0)
    assert window.call.id == "c0"
    window.problems.tree.setFocus()
    qtbot.keyClick(window.problems.tree, Qt.Key.Key_Return)
    assert window.call.id == "c1" and window.session.selected == "n0"
