"""The main window with a real worker: open, show, select, search, fail, crash, and no torch in the GUI."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app.session.session import SessionState
from core.protocol.messages import StepperState

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "resources" / "examples"


def _open(qtbot, window, path, timeout=60_000):
    with qtbot.waitSignal(window.sig_trace_shown, timeout=timeout):
        window.open_script(str(path))


@pytest.mark.slow
def test_example_graph_inspector_and_search(qtbot, window):
    _open(qtbot, window, EXAMPLES / "01_multiply.py")
    call = window.call
    assert call is not None and call.api == "Tensor.backward"
    graph = window.graph
    assert set(graph.node_items) == {n.id for n in call.nodes}
    assert len(graph.edge_items) == sum(1 for n in call.nodes for e in n.next if e is not None) == 2
    assert graph.legend.isVisible()
    # Selecting the AccumulateGrad of `a` shows its variable with its grad (3.0, the value of b).
    leaf = next(n for n in call.nodes if n.label == "a")
    window.select_node(leaf.id)
    text = window.inspector.text()
    assert "AccumulateGrad" in text
    var = call.tensor(leaf.variable)
    window.select_tensor(var.id)
    text = window.inspector.text()
    assert "3.0" in text and "()" in text  # grad value; stride of a 0-d tensor
    # Search finds a variable by name and selects its node.
    window.search_box.setText("b")
    window.search_box.returnPressed.emit()
    assert graph.shown_selection() == next(n.id for n in call.nodes if n.label == "b")
    # The source panel highlights the line that created the selected node.
    mul = next(n for n in call.nodes if n.name == "MulBackward0")
    window.select_node(mul.id)
    assert window.source.highlighted_lines() == [mul.line]


@pytest.mark.slow
def test_stride_of_a_transposed_tensor(qtbot, window, tmp_path):
    script = tmp_path / "t.py"
    script.write_text("import torch\nw = torch.arange(12.0).view(3, 4).requires_grad_()\n"
                      "wt = w.t()\nloss = (wt * 2).sum()\nloss.backward()\n")
    _open(qtbot, window, script)
    call = window.call
    wt = next(t for t in call.tensors if t.name == "wt")
    window.select_tensor(wt.id)
    assert "(1, 4)" in window.inspector.text()
    w = next(t for t in call.tensors if t.name == "w")
    window.select_tensor(w.id)
    assert "2.0" in window.inspector.text()


@pytest.mark.slow
def test_failing_script_keeps_previous_graph(qtbot, window, tmp_path):
    _open(qtbot, window, EXAMPLES / "02_polynomial.py")
    before = window.call
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nx = torch.ones(2)\nraise RuntimeError('broken on purpose')\n")
    _open(qtbot, window, bad)
    assert window.call is before
    assert set(window.graph.node_items) == {n.id for n in before.nodes}
    problems = window.problems.problems()
    assert any("broken on purpose" in p.summary and p.line == 3 for p in problems)
    assert "RuntimeError" in window.state_label.text()


@pytest.mark.slow
def test_worker_crash_leaves_window_usable(qtbot, window, tmp_path):
    crash = tmp_path / "crash.py"
    crash.write_text("import os\nimport torch\nos.abort()\n")
    _open(qtbot, window, crash)
    assert window.last_error is not None and window.last_error.kind == "crash"
    assert "signal 6" in window.last_error.message
    _open(qtbot, window, EXAMPLES / "01_multiply.py")
    assert window.last_error is None
    assert {n.name for n in window.call.nodes} == {"MulBackward0", "AccumulateGrad"}


@pytest.mark.slow
def test_gui_process_never_imports_torch(tmp_path):
    out = tmp_path / "shot.png"
    code = textwrap.dedent(f"""
        import sys
        from app.gui import main
        code = main([{str(EXAMPLES / '01_multiply.py')!r}, '--screenshot', {str(out)!r}])
        print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', code)
    """)
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", BACKPROP_STUDIO_SETTINGS=str(tmp_path / "s.ini"))
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 0, result.stderr
    assert "NO-TORCH 0" in result.stdout
    assert out.stat().st_size > 10_000


@pytest.mark.xvfb
@pytest.mark.skipif(shutil.which("xvfb-run") is None, reason="needs Xvfb (xvfb-run)")
def test_real_window_under_xvfb(tmp_path):
    from PIL import Image

    out = tmp_path / "window.png"
    env = dict(os.environ, QT_QPA_PLATFORM="xcb", BACKPROP_STUDIO_SETTINGS=str(tmp_path / "s.ini"))
    result = subprocess.run(
        ["xvfb-run", "-a", "-s", "-screen 0 1600x1000x24", sys.executable, "main.py",
         str(EXAMPLES / "13_mlp_classifier.py"), "--screenshot", str(out), "--size", "1300x800"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    image = Image.open(out).convert("RGB")
    assert image.size == (1300, 800)
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50  # text, nodes, edges: far from a blank window
    most = max(colours)[0]
    assert most < 0.9 * image.size[0] * image.size[1]


@pytest.mark.slow
def test_step_continue_and_replay(qtbot, window):
    _open(qtbot, window, EXAMPLES / "01_multiply.py")
    call = window.call
    mul = next(n.id for n in call.nodes if n.name == "MulBackward0")
    leaf_a = next(n.id for n in call.nodes if n.label == "a")
    # After a plain Run, Step re-runs the script (with the trace's seeds) to this call; the press
    # that started it is the first step: one node executed.
    session = window.session
    window.act_step.trigger()
    assert session.state is SessionState.STARTING and window.act_step.iconText() == "Step (1 queued)"
    qtbot.waitUntil(lambda: session.state is SessionState.PAUSED and len(session.steps) == 1, timeout=60_000)
    assert window.graph.node_items[mul].state == "executed"
    assert session.warning == ""  # the same graph and leaf values as the trace
    qtbot.waitUntil(lambda: window.step_log.count() == 1, timeout=5_000)
    with qtbot.waitSignal(window.handle.sig_step_end, timeout=10_000):
        window.act_continue.trigger()
    qtbot.waitUntil(lambda: window.step_log.count() == 3, timeout=5_000)
    steps = window.stepper.steps
    assert [s["name"] for s in steps] == ["MulBackward0", "AccumulateGrad", "AccumulateGrad"]
    leaf_values = {k: v["data"] for s in steps for k, v in (s.get("leaf_grads") or {}).items()}
    assert leaf_values == {"a": [3.0], "b": [2.0]}
    assert window.graph.node_items[leaf_a].state == "executed"
    # Replaying step 1 shows MulBackward0 as the last executed node, the leaves not yet run.
    window.step_log.sig_step_selected.emit(1)
    assert window.graph.node_items[mul].state == "current"
    assert window.graph.node_items[leaf_a].state == "frontier"
    # The graph stays usable: a normal run afterwards shows the new result.
    window.open_script(str(EXAMPLES / "02_polynomial.py"))
    qtbot.waitUntil(lambda: window.call is not None and
                    {n.name for n in window.call.nodes} >= {"PowBackward0", "AccumulateGrad"}, timeout=60_000)


@pytest.mark.slow
def test_stepping_stops_at_the_inplace_error(qtbot, window):
    _open(qtbot, window, EXAMPLES / "08_inplace_error.py")
    # The failed call opens on the node it is about, without selecting it (the view stays fitted).
    text = window.inspector.text()
    assert "SigmoidBackward0" in text and "SumBackward0" not in text.split("\n")[0]
    assert window.graph.shown_selection() is None
    with qtbot.waitSignal(window.handle.sig_step_end, timeout=60_000) as blocker:
        window.act_continue.trigger()
    assert blocker.args[0]["state"] == StepperState.FAILED
    failed = next(n.id for n in window.call.nodes if n.name == "SigmoidBackward0")
    qtbot.waitUntil(lambda: window.graph.node_items[failed].state == "failed", timeout=5_000)
    assert "SigmoidBackward0" in window.state_label.text()


@pytest.mark.slow
def test_recent_files_drop_and_rerun_on_change(qtbot, window, tmp_path):
    from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
    from PySide6.QtGui import QDropEvent

    script = tmp_path / "grow.py"
    script.write_text("import torch\nx = torch.tensor(2.0, requires_grad=True)\n(x * 3).backward()\n")
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(script))])
    drop = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                      Qt.KeyboardModifier.NoModifier)
    with qtbot.waitSignal(window.sig_trace_shown, timeout=60_000):
        window.dropEvent(drop)
    assert window.call.leaf_grads["x"].data == [3.0]
    assert [a.text() for a in window.recent_menu.actions()][0] == str(script.resolve())
    # Editing the file re-runs it when "Re-run When the File Changes" is on.
    window.act_rerun_on_change.setChecked(True)
    with qtbot.waitSignal(window.sig_trace_shown, timeout=60_000):
        script.write_text("import torch\nx = torch.tensor(2.0, requires_grad=True)\n(x * 5).backward()\n")
    assert window.call.leaf_grads["x"].data == [5.0]
    assert window.device_box.itemData(0) == "cpu"
    assert window.act_step.shortcut().toString() == "F10" and window.act_continue.shortcut().toString() == "F5"
    assert window.act_stop.shortcut().toString() == "Shift+F5" and window.act_run.shortcut().toString() == "Ctrl+R"


@pytest.mark.slow
def test_anatomy_script_shows_tensors_and_storage(qtbot, window):
    _open(qtbot, window, EXAMPLES / "20_views_and_strides.py")
    assert window.call is None
    assert window.center.currentWidget() is window.storage
    names = [window.trace.tensors[[t.id for t in window.trace.tensors].index(i)].name
             for i in window.tensors.tensor_ids()]
    assert {"x", "transposed", "row", "flat", "permuted"} <= set(names)
    assert window.select_named("transposed")
    assert window.storage.highlighted_offsets() == [0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]
    assert window.select_named("row")
    assert window.storage.highlighted_offsets() == [4, 5, 6, 7]
    assert "(1, 4)" not in window.inspector.text() and "(1,)" in window.inspector.text()


DEBUGGED = """\
import torch
w = torch.randn(3, requires_grad=True)
for i in range(3):
    loss = (w * (i + 1)).sigmoid().sum()
    loss.backward()
"""


@pytest.mark.slow
def test_debug_run_steps_continues_and_runs_to_the_next_call(qtbot, window, tmp_path):
    from PySide6.QtCore import Qt

    script = tmp_path / "debugged.py"
    script.write_text(DEBUGGED)
    window.open_script(str(script), run=False)
    session = window.session
    stepped = []
    session.sig_step.connect(stepped.append)
    with qtbot.waitSignal(session.sig_paused, timeout=60_000):
        window.act_debug.trigger()
    assert session.state is SessionState.PAUSED and window.call.index == 0
    assert window.graph.wait_ready()
    names = [n.name for n in window.call.nodes]
    assert names == ["SumBackward0", "SigmoidBackward0", "MulBackward0", "AccumulateGrad"]
    assert window.graph.node_items["n0"].state == "current"  # paused before the first node
    assert window.source.editor.paused_line == 5
    # Three F10 presses in a row, without waiting: three nodes executed, none lost.
    window.activateWindow()
    for _ in range(3):
        qtbot.keyClick(window.graph, Qt.Key.Key_F10)
    qtbot.waitUntil(lambda: len(session.steps) == 3 and session.state is SessionState.PAUSED, timeout=10_000)
    assert [s["name"] for s in session.steps] == names[:3]
    qtbot.waitUntil(lambda: window.step_log.count() == 3, timeout=5_000)
    assert [window.graph.node_items[f"n{i}"].state for i in range(4)] == ["executed"] * 3 + ["current"]
    # F5: this backward to its end; the run goes on and pauses at the next call (every call breaks).
    with qtbot.waitSignal(session.sig_step_end, timeout=10_000) as ended:
        qtbot.keyClick(window.graph, Qt.Key.Key_F5)
    assert ended.args[0]["state"] == StepperState.FINISHED
    first_grad = stepped[3]["leaf_grads"]["w"]["data"]
    qtbot.waitUntil(lambda: session.state is SessionState.PAUSED and window.call.index == 1, timeout=10_000)
    # Run to the next call: the whole of call 1, then a pause at call 2.
    with qtbot.waitSignal(session.sig_step_begin, timeout=10_000) as began:
        window.act_next_call.trigger()
    assert began.args[0].index == 2
    qtbot.waitUntil(lambda: session.state is SessionState.PAUSED, timeout=10_000)
    assert window.calls.call_ids() == ["c0", "c1", "c2"]
    # Resume to the end: the trace shown is this run's, with the grads stepped.
    window.act_resume.trigger()
    qtbot.waitUntil(lambda: session.state is SessionState.IDLE and window.trace.call_count == 3, timeout=30_000)
    assert window.trace.error is None and not window.handle.running
    c0 = next(c for c in window.trace.calls if c.index == 0)
    assert c0.leaf_grads["w"].data == first_grad
    assert window.call.index == 2  # the call last stepped stays on screen


@pytest.mark.slow
def test_restart_while_paused_then_stop(qtbot, window, tmp_path):
    script = tmp_path / "debugged.py"
    script.write_text(DEBUGGED)
    window.open_script(str(script), run=False)
    session = window.session
    with qtbot.waitSignal(session.sig_paused, timeout=60_000):
        window.act_debug.trigger()
    with qtbot.waitSignal(session.sig_paused, timeout=10_000):
        window.act_step.trigger()
    assert len(session.steps) == 1
    old_worker = window.handle.client._run["worker"]
    # Restart while the worker is alive and paused: a new run pauses at the same call, no step made.
    with qtbot.waitSignal(session.sig_paused, timeout=60_000):
        window.act_restart.trigger()
    assert session.state is SessionState.PAUSED and session.steps == [] and session.step_call.index == 0
    assert window.handle.client._run["worker"] is not old_worker and not old_worker.alive
    assert window.graph.node_items["n0"].state == "current"
    # Stop: no error in the event loop (pytest-qt fails the test on one), and nothing left running.
    window.act_stop.trigger()
    assert session.state is SessionState.IDLE
    qtbot.waitUntil(lambda: not window.handle.running, timeout=10_000)
    assert window.graph.node_items["n0"].state == "current"  # the graph stays as it was when stopped


@pytest.mark.slow
def test_session_states_of_a_run_and_a_debug_run(qtbot, window, tmp_path):
    script = tmp_path / "tiny.py"
    script.write_text("import torch\nx = torch.ones(2, requires_grad=True)\n(x * 3).sum().backward()\n")
    window.open_script(str(script), run=False)
    session = window.session
    seen = []
    session.sig_state.connect(seen.append)
    assert session.state is SessionState.IDLE
    with qtbot.waitSignal(session.sig_result, timeout=60_000):
        window.act_run.trigger()
    assert seen == [SessionState.RUNNING, SessionState.IDLE]
    assert all(type(s) is SessionState for s in seen)  # the signal carries the members themselves
    seen.clear()
    # A debug run pauses before the call's first node, steps it to its end, then ends with the script.
    with qtbot.waitSignal(session.sig_paused, timeout=60_000):
        window.act_debug.trigger()
    assert seen == [SessionState.DEBUGGING, SessionState.PAUSED] and session.active
    with qtbot.waitSignal(session.sig_result, timeout=60_000):
        window.act_continue.trigger()
    assert seen == [SessionState.DEBUGGING, SessionState.PAUSED, SessionState.STEPPING, SessionState.DEBUGGING,
                    SessionState.IDLE]
    assert session.state is SessionState.IDLE and not session.active and len(session.steps) == 3


@pytest.mark.slow
def test_run_while_running_keeps_the_window_responsive(qtbot, window, tmp_path):
    slow = tmp_path / "slow.py"
    slow.write_text("import time\nimport torch\nwhile True:\n    time.sleep(0.05)\n")
    window.open_script(str(slow), run=False)
    with qtbot.waitSignal(window.handle.sig_started, timeout=60_000):
        window.act_run.trigger()
    slow.write_text("import torch\nx = torch.ones(2, requires_grad=True)\n(x * 3).sum().backward()\n")
    old = window.handle.client._run["worker"]
    window.act_run.trigger()
    # The old worker's exit was seen before Run returned: Run did not sit out the 5 s wait for a
    # reader blocked on a lock it held.
    assert old.finished.is_set()
    qtbot.waitUntil(lambda: window.trace is not None and window.trace.call_count == 1, timeout=60_000)
    assert window.trace.error is None and window.call.leaf_grads["x"].data == [3.0, 3.0]


@pytest.mark.slow
def test_nondeterministic_rerun_is_said(qtbot, window, tmp_path):
    script = tmp_path / "urandom.py"
    script.write_text("import os\nimport torch\n"
                      "w = torch.tensor([float(b) for b in os.urandom(3)], requires_grad=True)\n"
                      "(w * w).sum().backward()\n")
    _open(qtbot, window, script)
    with qtbot.waitSignal(window.session.sig_warning, timeout=60_000) as warned:
        window.act_step.trigger()
    assert "not deterministic" in warned.args[0] and "values differ from the trace" in warned.args[0]
    qtbot.waitUntil(lambda: window.session.state is SessionState.PAUSED, timeout=10_000)
    assert "not deterministic" in window.state_label.text()
    window.act_stop.trigger()


@pytest.mark.slow
def test_gutter_breakpoint_and_debug_to_call(qtbot, window, tmp_path):
    from PySide6.QtCore import QPoint, Qt

    script = tmp_path / "lines.py"
    script.write_text("import torch\n"
                      "w = torch.ones(2, requires_grad=True)\n"
                      "(w * 2).sum().backward()\n"
                      "for i in range(3):\n"
                      "    (w * i).sum().backward()\n"
                      "(w * 7).sum().backward()\n")
    window.open_script(str(script), run=False)
    editor = window.source.editor
    block = editor.document().findBlockByNumber(5)  # line 6
    y = round(editor.blockBoundingGeometry(block).translated(editor.contentOffset()).center().y())
    window.docks["source"].raise_()
    qtbot.mouseClick(editor.gutter, Qt.MouseButton.LeftButton, pos=QPoint(6, y))
    assert window.session.breakpoints == [6] and window.source.breakpoints() == [6]
    with qtbot.waitSignal(window.session.sig_step_begin, timeout=60_000) as began:
        window.act_debug.trigger()
    assert (began.args[0].index, began.args[0].line) == (4, 6)  # calls from other lines did not pause
    window.act_stop.trigger()
    qtbot.waitUntil(lambda: not window.handle.running, timeout=10_000)
    # Debug to call #2 (a loop's later call): the calls before it do not pause.
    qtbot.mouseClick(editor.gutter, Qt.MouseButton.LeftButton, pos=QPoint(6, y))
    assert window.session.breakpoints == []
    with qtbot.waitSignal(window.session.sig_step_begin, timeout=60_000) as began:
        window.calls.sig_debug_to_call.emit(2)
    assert began.args[0].index == 2 and began.args[0].line == 5
    window.act_stop.trigger()
