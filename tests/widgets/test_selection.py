"""One selection: the session owns it; the graph, inspector, tensors table, storage, source and
problems show it, and picking in any of them moves all the others."""

from pathlib import Path

import pytest
from PySide6.QtCore import QUrl, Qt
from PySide6.QtTest import QTest

EXAMPLES = Path(__file__).resolve().parents[2] / "resources" / "examples"


@pytest.fixture
def window(window, qtbot):
    """The conftest window, on 01_multiply.py."""
    w = window
    with qtbot.waitSignal(w.sig_trace_shown, timeout=60_000):
        w.open_script(str(EXAMPLES / "01_multiply.py"))
    return w


def highlighted(window) -> list[str]:
    return sorted(vid for vid, item in window.graph.node_items.items() if item.selected)


def table_row(window) -> str | None:
    item = window.tensors.tree.currentItem()
    return item.data(0, Qt.ItemDataRole.UserRole) if item is not None else None


@pytest.mark.slow
def test_every_view_follows_the_one_selection(qtbot, window):
    session, call, trace = window.session, window.call, window.trace
    leaf_a = next(n for n in call.nodes if n.label == "a")
    leaf_b = next(n for n in call.nodes if n.label == "b")
    mul = next(n for n in call.nodes if n.name == "MulBackward0")
    top_a = next(t for t in trace.tensors if t.name == "a")
    top_b = next(t for t in trace.tensors if t.name == "b")

    # The tensors table picks `b`: the session selects it, and the graph highlights b's AccumulateGrad.
    window.left_tabs.setCurrentWidget(window.tensors)
    with qtbot.waitSignal(session.sig_selection, timeout=1000) as blocker:
        window.tensors.select_tensor(top_a.id)  # marks a row without emitting
        row = next(i for i in range(window.tensors.tree.topLevelItemCount())
                   if window.tensors.tree.topLevelItem(i).data(0, Qt.ItemDataRole.UserRole) == top_b.id)
        window.tensors.tree.setCurrentItem(window.tensors.tree.topLevelItem(row))
    sel = blocker.args[0]
    assert (sel.node, sel.tensor, sel.scope, sel.origin) == (leaf_b.id, top_b.id, "top", "tensor")
    assert session.selected == leaf_b.id == window.graph.shown_selection()
    assert highlighted(window) == [leaf_b.id]
    assert "b" in window.inspector.text() and window.storage.tensor_id() == top_b.id

    # The inspector's link to a node: the graph's highlight moves, the table follows the node's tensor.
    window.inspector._on_anchor(QUrl(f"node:{leaf_a.id}"))
    assert session.selected == leaf_a.id and highlighted(window) == [leaf_a.id]
    assert table_row(window) == top_a.id
    assert "AccumulateGrad" in window.inspector.text()

    # A click in the graph asks the session; the answer moves every view (one source of truth).
    window.left_tabs.setCurrentWidget(window.calls)
    with qtbot.waitSignal(session.sig_selection, timeout=1000):
        QTest.mouseClick(window.graph.viewport(), Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier,
                         window.graph.mapFromScene(window.graph.node_items[leaf_b.id].sceneBoundingRect().center()))
    assert session.selected == leaf_b.id and highlighted(window) == [leaf_b.id]
    assert table_row(window) == top_b.id
    # A node that holds no named tensor: the graph and the source follow, the rest keep their rows.
    window.select_node(mul.id)
    assert highlighted(window) == [mul.id] and window.graph.shown_selection() == session.selected == mul.id
    assert window.source.highlighted_lines() == [mul.line]
    assert "MulBackward0" in window.inspector.text()

    # The graph never selects on its own: an unanswered click leaves the session's selection drawn.
    window.graph.sig_select_requested.disconnect(window.select_node)
    QTest.mouseClick(window.graph.viewport(), Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier,
                     window.graph.mapFromScene(window.graph.node_items[leaf_a.id].sceneBoundingRect().center()))
    assert highlighted(window) == [mul.id] and session.selected == mul.id


@pytest.mark.slow
def test_a_malformed_worker_message_is_shown_and_kept_with_the_run(qtbot, window):
    """Said in the Output panel and the status bar when it arrives, listed in Problems with the
    result; the run's trace is shown as usual."""
    from core.protocol import events
    from core.client.handle import RunResult
    from core.model.trace import Trace

    error = "'call' message: field 'index' must be int, got str 'three'"
    window.handle.sig_event.emit(events.BadMessage(error=error, raw={"type": "call", "index": "three"}))
    assert f"the worker sent a message the app cannot read: {error}" in window.output.text()
    assert error in window.state_label.text()
    session = window.session
    session.run_id, session.run_kind = 99, "run"
    window.handle.current_run = 99
    shown = Trace(calls=list(window.trace.calls), script=window.trace.script, call_count=window.trace.call_count)
    result = RunResult(shown, "", 0, 0.2, 99, [error])
    window.handle.sig_event.emit(events.Finished(run=99, result=result))
    assert window.trace is shown
    assert [p.summary for p in window.problems.problems() if error in p.details or error in p.summary]
