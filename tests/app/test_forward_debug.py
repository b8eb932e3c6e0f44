"""A debug run paused in forward: the live graph, its new nodes, the live variables and the keys.

The worker is faked: the test sends the window the worker's messages (``forward_paused``,
``step_begin``) and reads the commands the session sends back.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QToolBar

from app.session.forward_pause import read_pause
from app.session.session import SessionState
from app.window.help_dialogs import shortcut_rows
from core.model.trace import Saved
from core.model.trace_json import call_to_dict
from core.protocol import messages as protocol
from tests.fixtures_graphs import call, leaf, node, tensor

SCRIPT = """import torch; a = torch.tensor([1., 2.], requires_grad=True)
b = a * 2
c = b + 1
c.sum().backward()
"""


def _live(with_c: bool):
    """The live graph of SCRIPT before line 3 (a, b) or before line 4 (a, b, c), as the worker captures it."""
    tensors = [replace(tensor("t_a", "a", [2]), version=0),
               replace(tensor("t_b", "b", [2], is_leaf=False, grad_fn="n1"), grad_fn_name="MulBackward0")]
    nodes = [node("n1", "MulBackward0", ["n2", None], saved=[Saved("self", None)], label="b", tensor_id="t_b",
                  line=2),
             leaf("n2", "t_a", "a")]
    roots = ["n1"]
    if with_c:
        tensors.append(replace(tensor("t_c", "c", [2], is_leaf=False, grad_fn="n0"), grad_fn_name="AddBackward0",
                               version=1))
        nodes.insert(0, node("n0", "AddBackward0", ["n1"], label="c", tensor_id="t_c", line=3))
        roots = ["n0"]
    live = call(nodes, tensors, roots, api="live")
    return replace(live, id="live")


def _pause(n: int, line: int, new: list[str], with_c: bool, reason: str = "breakpoint", file: str = ""):
    return protocol.ForwardPaused(pause=n, line=line, file=file, function="<module>",
                                  stack=[{"function": "<module>", "line": line, "file": file, "module": None}],
                                  reason=reason, graph=call_to_dict(_live(with_c)), new=new)


@pytest.fixture
def debugging(window, monkeypatch, tmp_path):
    """The window debugging SCRIPT with a breakpoint on line 3; the handle's commands are recorded."""
    script = tmp_path / "four_lines.py"
    script.write_text(SCRIPT)
    window.open_script(str(script), run=False)
    window.source.toggle_breakpoint(3)
    sent = []
    monkeypatch.setattr(window.handle, "control", lambda cmd, **args: sent.append((cmd, args)) or True)
    monkeypatch.setattr(window.handle, "cancel", lambda: sent.append(("cancel", {})))
    runs = []
    monkeypatch.setattr(window.handle, "run", lambda path, **kw: runs.append((path, kw)) or 41)
    window.act_debug.trigger()
    window.handle.current_run = 41
    assert window.session.state is SessionState.DEBUGGING
    return window, sent, runs


def _glowing(window) -> list[str]:
    return window.forward_debug.marks.boxes()


def test_a_forward_pause_shows_the_live_graph_its_new_nodes_and_variables(qtbot, debugging):
    window, sent, runs = debugging
    assert runs[0][1]["debug"] == {"lines": [3], "pause_all": False, "skip_to": None, "pause_on_errors": False,
                                   "to_nan": False}
    window.handle.sig_forward_paused.emit(_pause(1, 3, ["n1", "n2"], with_c=False, file=window.script_path))
    s = window.session
    assert s.state is SessionState.FORWARD and s.paused_line == 3
    assert window.graph.wait_ready()
    assert sorted(window.graph.node_items) == ["n1", "n2"]
    assert [window.call.node(n).name for n in sorted(window.graph.node_items)] == ["MulBackward0",
                                                                                   "torch::autograd::AccumulateGrad"]
    assert _glowing(window) == ["n1", "n2"]
    assert window.source.editor.paused_line == 3
    strip = window.forward_debug.strip
    assert strip.isVisible()
    assert strip.text() == "Paused in forward: <module> line 3  2 nodes added since the run started"
    assert window.state_label.text() == ("Paused in forward before line 3 of four_lines.py (at a breakpoint): "
                                         "2 nodes in the graph, 2 nodes added since the run started. "
                                         "F10 steps over, F11 into, Ctrl+F11 out, F5 continues.")
    # The Tensors tab lists the live variables with their anatomy.
    assert window.left_tabs.currentWidget() is window.tensors
    t = window.tensors.tree
    cols = [t.headerItem().text(c) for c in range(t.columnCount())]
    rows = {t.topLevelItem(i).text(0): dict(zip(cols, (t.topLevelItem(i).text(c) for c in range(len(cols)))))
            for i in range(t.topLevelItemCount())}
    assert {k: (v["shape"], v["grad_fn"], v["version"], v["requires_grad"]) for k, v in rows.items()} == {
        "a": ("[2]", "None", "0", "True"), "b": ("[2]", "MulBackward0", "0", "True")}
    assert window.act_step.text() == "Step &Over" and window.act_step.iconText() == "Step Over"
    assert window.act_step_into.isEnabled() and window.act_step_out.isEnabled()

    assert window.windowTitle() == "debugging four_lines.py — Backprop Studio"
    # F10 runs one line: a forward step over, not a backward step.
    window.act_step.trigger()
    assert sent == [("forward_step", {"kind": "over"})]
    assert s.state is SessionState.DEBUGGING
    assert window.windowTitle() == "debugging four_lines.py — Backprop Studio"  # the graph shown is the run's
    window.handle.sig_forward_paused.emit(_pause(2, 4, ["n0"], with_c=True, reason="step"))
    assert window.graph.wait_ready()
    assert sorted(window.graph.node_items) == ["n0", "n1", "n2"]
    assert _glowing(window) == ["n0"]  # only the AddBackward0 c = b + 1 made
    assert window.call.node("n0").name == "AddBackward0"
    assert "1 node added since the last pause" in strip.text()
    assert window.source.editor.paused_line == 4
    qtbot.waitUntil(lambda: strip.elided_where() == "Paused in forward: <module> line 4")  # room enough: not cut
    assert window.tensors.tensor_ids() == ["t_a", "t_b", "t_c"]
    # A variable picked in the Tensors tab is the selection: the inspector and the graph follow.
    window.tensors.tree.setCurrentItem(window.tensors.tree.topLevelItem(2))
    assert s.selection.tensor == "t_c" and s.selection.node == "n0"
    assert window.storage.tensor_id() == "t_c"  # its storage, as for a finished call's tensor
    assert "AddBackward0" in window.inspector.text() and "c" in window.inspector.text()

    window.act_step_into.trigger()
    window.handle.sig_forward_paused.emit(_pause(3, 4, [], with_c=True, reason="step"))
    window.act_step_out.trigger()
    assert sent[1:] == [("forward_step", {"kind": "into"}), ("forward_step", {"kind": "out"})]


def test_f5_continues_from_forward_and_backward_stepping_takes_over(qtbot, debugging):
    window, sent, _runs = debugging
    window.handle.sig_forward_paused.emit(_pause(1, 3, ["n1", "n2"], with_c=False))
    window.act_continue.trigger()
    assert sent == [("continue", {})]
    assert window.session.state is SessionState.DEBUGGING
    # The run reaches c.sum().backward(): the backward pause is the usual stepping view.
    graph = _live(True)
    graph = replace(graph, id="c0", api="Tensor.backward", line=4)
    window.handle.sig_step_begin.emit(protocol.StepBegin(call=0, api="Tensor.backward", line=4,
                                                         graph=call_to_dict(graph), debug=True))
    window.handle.sig_step_paused.emit(protocol.StepPaused(call=0, pending={"node": "n0", "grad_outputs": []}))
    assert window.session.state is SessionState.PAUSED
    assert window.session.forward is None
    assert not window.forward_debug.strip.isVisible() and _glowing(window) == []
    assert window.act_step.text() == "&Step" and window.act_step.iconText() == "Step"
    assert not window.act_step_into.isEnabled()
    window.act_step.trigger()
    assert sent[1:] == [("step", {"count": 1})]


def test_stop_while_paused_in_forward_sends_stop_and_goes_idle(qtbot, debugging):
    window, sent, _runs = debugging
    window.handle.sig_forward_paused.emit(_pause(1, 3, ["n1", "n2"], with_c=False))
    assert window.graph.wait_ready()
    window.act_stop.trigger()
    assert sent == [("stop_step", {}), ("cancel", {})]
    assert window.session.state is SessionState.IDLE
    assert window.source.editor.paused_line is None
    assert not window.forward_debug.strip.isVisible() and _glowing(window) == []


def test_pause_on_errors_and_run_to_first_nan(qtbot, debugging):
    window, sent, runs = debugging
    window.act_pause_errors.setChecked(True)  # while the run goes: sent with the breakpoints
    assert sent == [("breakpoints", {"lines": [3], "pause_all": False, "pause_on_errors": True})]
    window.act_stop.trigger()
    window.act_to_nan.trigger()
    path, args = runs[-1]
    assert Path(path).name == "four_lines.py"
    assert args["nan_check"] is True
    assert args["debug"] == {"lines": [3], "pause_all": False, "skip_to": None, "pause_on_errors": True,
                             "to_nan": True}
    window.handle.current_run = 41
    note = "b * 2 made the first non-finite values: 1 nan of 2"
    window.handle.sig_forward_paused.emit(protocol.ForwardPaused(
        pause=1, line=3, reason="nan", graph=call_to_dict(_live(False)), new=["n1", "n2"], note=note,
        stack=[{"function": "<module>", "line": 3, "file": "", "module": None}]))
    assert window.state_label.text().startswith(f"Paused in forward before line 3 of the script (at the first "
                                                f"NaN/Inf): {note}. 2 nodes in the graph")
    assert window.forward_debug.strip.where == "Paused at the first NaN/Inf: <module> line 3"
    problems = window.problems.tree
    assert [problems.topLevelItem(0).text(c) for c in (0, 1)] == [f"NaN/Inf: {note}", "line 3"]


def test_step_into_and_out_are_on_the_toolbar_only_while_paused_in_forward(qtbot, debugging):
    window, sent, _runs = debugging
    bar = window.findChild(QToolBar, "toolbar_main")
    step = bar.actions().index(window.act_step)
    assert [a.text() for a in bar.actions()[step + 1:step + 4]] == ["Step Into", "Step Out", "&Continue"]
    into, out = bar.actions()[step + 1:step + 3]
    assert not into.isVisible() and not out.isVisible()  # running, not paused
    window.handle.sig_forward_paused.emit(_pause(1, 3, ["n1", "n2"], with_c=False, file=window.script_path))
    assert into.isVisible() and out.isVisible()
    assert into.toolTip() == "Paused in forward: go into the script's own function this line calls (F11)"
    assert not into.icon().isNull() and not out.icon().isNull()
    into.trigger()
    assert sent == [("forward_step", {"kind": "into"})]
    window.handle.sig_forward_paused.emit(_pause(2, 4, ["n0"], with_c=True, reason="step"))
    out.trigger()
    assert sent[1:] == [("forward_step", {"kind": "out"})]
    window.handle.sig_forward_paused.emit(_pause(3, 4, [], with_c=True, reason="step"))
    window.act_stop.trigger()
    assert not into.isVisible() and not out.isVisible()


def test_step_out_has_its_own_key_listed_with_the_others(qtbot, window):
    rows = dict(shortcut_rows(window))
    assert rows["Step"] == "F10"
    assert rows["Step Into"] == "F11"
    assert rows["Step Out"] == "Ctrl+F11"
    assert rows["Run to Next Call"] == "Shift+F11"
    keys = [k for _, k in shortcut_rows(window)]
    assert len(keys) == len(set(keys)), "two actions share a key"


def test_the_breadcrumb_names_each_frame_and_its_module():
    live = replace(_live(False), options={"module_classes": {"": "MLP", "fc1": "Linear"}})
    pause = read_pause(protocol.ForwardPaused(
        pause=2, line=18, function="forward", module="", graph=call_to_dict(live), new=["n1", "zz"],
        stack=[{"function": "<module>", "line": 31, "file": "x.py", "module": None},
               {"function": "forward", "line": 18, "file": "x.py", "module": ""}]))
    assert pause.breadcrumb() == "<module> line 31 \u203a model (MLP).forward line 18"
    assert pause.new == {"n1"}  # an id the graph does not have is not marked
    assert pause.new_text() == "1 node added since the last pause"
    assert [t.name for t in pause.variables] == ["a", "b"]


def test_a_press_made_while_the_script_runs_waits_for_the_forward_pause(qtbot, debugging):
    window, sent, _runs = debugging
    window.act_step.trigger()  # before the first pause: kept
    assert sent == []
    window.handle.sig_forward_paused.emit(_pause(1, 3, ["n1", "n2"], with_c=False))
    assert sent == [("forward_step", {"kind": "over"})]
    assert window.session.state is SessionState.DEBUGGING
    assert window.session.queued_steps() == 0


def test_keys_are_real_shortcuts(qtbot, debugging):
    window, sent, _runs = debugging
    window.handle.sig_forward_paused.emit(_pause(1, 3, ["n1", "n2"], with_c=False))
    qtbot.keyClick(window, Qt.Key.Key_F11)
    assert sent == [("forward_step", {"kind": "into"})]


# -- with the worker ---------------------------------------------------------------------------------------


def _script_workers(folder: Path) -> list[int]:
    """This process's children running in ``folder``: a worker runs a script in the script's folder."""
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if Path(child.cwd()) == folder and child.status() != psutil.STATUS_ZOMBIE:
                out.append(child.pid)
        except psutil.Error:
            pass  # it ended meanwhile
    return out


@pytest.mark.slow
def test_a_real_run_pauses_before_line_3_steps_a_line_and_reaches_backward(qtbot, window, tmp_path):
    script = tmp_path / "four_lines.py"
    script.write_text(SCRIPT)
    window.open_script(str(script), run=False)
    window.source.toggle_breakpoint(3)
    window.source.toggle_breakpoint(4)  # the backward call's line: F5 pauses at the call, not in forward
    s = window.session
    with qtbot.waitSignal(s.sig_forward_paused, timeout=60_000):
        window.act_debug.trigger()
    assert window.graph.wait_ready()
    assert s.state is SessionState.FORWARD and s.paused_line == 3
    names = {n.id: n.name for n in window.call.nodes}
    assert sorted(names.values()) == ["AccumulateGrad", "MulBackward0"]
    assert sorted(window.graph.node_items) == sorted(names)
    assert {t.name: (t.shape, t.grad_fn_name) for t in s.forward.variables} == {
        "a": ([2], None), "b": ([2], "MulBackward0")}
    assert _script_workers(tmp_path), "the run's worker runs in the script's folder"

    with qtbot.waitSignal(s.sig_forward_paused, timeout=30_000):
        window.act_step.trigger()  # F10: c = b + 1 runs
    assert window.graph.wait_ready()
    assert s.paused_line == 4 and s.forward.event.reason == "step"
    names = {n.id: n.name for n in window.call.nodes}
    assert sorted(names.values()) == ["AccumulateGrad", "AddBackward0", "MulBackward0"]
    assert [names[b] for b in _glowing(window)] == ["AddBackward0"]
    assert "1 node added since the last pause" in window.forward_debug.strip.text()
    assert window.tensors.tensor_ids() == [t.id for t in s.forward.variables]

    with qtbot.waitSignal(s.sig_paused, timeout=30_000):
        window.act_continue.trigger()  # F5: on to c.sum().backward()
    assert s.state is SessionState.PAUSED and s.forward is None
    assert [n.name for n in s.step_call.nodes][:2] == ["SumBackward0", "AddBackward0"]
    assert _glowing(window) == [] and not window.forward_debug.strip.isVisible()

    window.act_stop.trigger()
    assert s.state is SessionState.IDLE
    qtbot.waitUntil(lambda: not _script_workers(tmp_path), timeout=30_000)


def test_a_pause_in_a_file_the_script_imports_shows_that_file_then_the_script_again(qtbot, debugging, tmp_path):
    window, _sent, _runs = debugging
    helper = tmp_path / "blocks.py"
    helper.write_text("def double(x):\n    y = x * 2\n    return y\n")
    pause = _pause(1, 2, ["n1", "n2"], with_c=False, file=str(helper))
    pause = replace(pause, function="double", stack=[
        {"function": "<module>", "line": 2, "file": window.script_path, "module": None},
        {"function": "double", "line": 2, "file": str(helper), "module": None}])
    window.handle.sig_forward_paused.emit(pause)
    source = window.source
    assert source.path_label.text() == "blocks.py"
    assert source.editor.toPlainText().startswith("def double(x):")
    assert source.editor.paused_line == 2
    assert "<module> line 2 \u203a double line 2" in window.forward_debug.strip.text()
    source.toggle_breakpoint(3)  # breakpoints are the script's: none in the helper
    assert source.breakpoints() == [] and window.session.breakpoints == [3]
    window.act_step_out.trigger()
    window.handle.sig_forward_paused.emit(_pause(2, 3, ["n0"], with_c=True, reason="step", file=window.script_path))
    assert source.path_label.text() == "four_lines.py"
    assert source.editor.toPlainText() == SCRIPT
    assert source.breakpoints() == [3] and source.editor.paused_line == 3


def test_a_leaf_seen_at_the_pause_before_is_not_new_though_torch_made_its_node_again():
    first = read_pause(_pause(1, 3, ["n1", "n2"], with_c=False))
    # At the next pause a's AccumulateGrad has another id (n2 -> n9), and the worker calls it new.
    live = _live(True)
    live = replace(live, nodes=[replace(n, id="n9") if n.id == "n2" else
                                replace(n, next=[type(e)("n9", e.input_nr) if e is not None and e.node == "n2" else e
                                                 for e in n.next]) for n in live.nodes])
    event = replace(_pause(2, 4, ["n0", "n9"], with_c=True), graph=call_to_dict(live))
    assert read_pause(event, first).new == {"n0"}
    assert read_pause(event).new == {"n0", "n9"}  # the first pause of a run: as the worker says


@pytest.mark.slow
def test_a_real_run_pauses_before_the_in_place_op_that_breaks_backward(qtbot, window, tmp_path):
    script = tmp_path / "in_place.py"
    script.write_text("import torch\na = torch.tensor([1., 2.], requires_grad=True)\nb = a.sigmoid()\n"
                      "b.mul_(2)\nb.sum().backward()\n")
    window.open_script(str(script), run=False)
    window.act_pause_errors.setChecked(True)
    s = window.session
    with qtbot.waitSignal(s.sig_forward_paused, timeout=60_000):
        window.act_debug.trigger()
    assert s.paused_line == 4 and s.forward.event.reason == "inplace"
    assert sorted(n.name for n in s.call.nodes) == ["AccumulateGrad", "SigmoidBackward0"]
    note = s.forward.event.note
    assert "SigmoidBackward0" in note and "mul_" in note
    assert window.problems.tree.topLevelItem(0).text(0) == f"In-place op: {note}"
    window.act_stop.trigger()
    qtbot.waitUntil(lambda: not _script_workers(tmp_path), timeout=30_000)
