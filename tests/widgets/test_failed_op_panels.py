"""The graph a forward pass failed on, headed in the Calls list by the op that failed. The calls are
the ones capture records (see tests/widgets/test_forward_error_marks.py), built here without torch."""

from __future__ import annotations

from dataclasses import replace

from core.model.trace import ErrorInfo, Trace
from tests.fixtures_graphs import mul_call
from tests.widgets.test_forward_error_marks import LEAF, leaf_inplace
from widgets.panels.calls import HEAD_ROLE, STATE_ROLE, CallsPanel


def _run_error(call, message=LEAF, line=17):
    """The run's error for ``call``'s failed op, as the worker sends it (the op with its call's id)."""
    op = {k: v for k, v in call.options["failed_op"].items() if k not in ("type", "message")}
    return ErrorInfo(type="RuntimeError", message=message, line=line, failed_op={**op, "call": call.id})


def _leaf_trace():
    """18_inplace_on_leaf.py: one backward (#0), then ``x += 1`` fails on the leaf x (#1)."""
    failed = leaf_inplace()
    return Trace(calls=[mul_call(), failed], error=_run_error(failed), call_count=1)


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
