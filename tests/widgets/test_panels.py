"""The side panels built straight from hand-made traces: inspector, source, calls, problems, output."""

from __future__ import annotations

from dataclasses import replace

import pytest
from PySide6.QtCore import QPoint, Qt, QUrl
from PySide6.QtGui import QColor, QPalette, QTextCursor

from core.model.trace import (
    CallInfo, Edge, ErrorInfo, GradInfo, NodeInfo, Saved, Stale, StorageInfo, TensorInfo, Trace, Values,
)
from widgets.panels.calls import CallsPanel
from widgets.panels.inspector import InspectorPanel, format_number, format_tensor, format_values
from widgets.panels.output import OutputPanel
from widgets.panels.problems import ProblemsPanel
from widgets.panels.source import SourcePanel

SCRIPT = """\
import torch

# c = a * b, then backward: a.grad = b, b.grad = a
a = torch.tensor([2.0], requires_grad=True)
b = torch.tensor([3.0], requires_grad=True)
c = a * b
c.backward()

w = torch.arange(8.0).reshape(2, 4).t()  # a view with stride (1, 4)
x = torch.ones(3, requires_grad=True)
y = x.sigmoid()
y.mul_(2)
y.sum().backward()  # fails: sigmoid saved y, then y changed in place
"""


def tensor(tid, name, shape, data, *, stride, leaf=True, requires_grad=True, grad=None, grad_fn=None,
           grad_fn_name=None, storage=None, version=0, base=None, is_view=False, offset=0, dtype="float32"):
    """A TensorInfo with the sizes worked out from shape and dtype."""
    numel = len(data)
    return TensorInfo(
        id=tid, name=name, shape=shape, dtype=dtype, device="cpu", requires_grad=requires_grad,
        is_leaf=leaf, retains_grad=False, stride=stride, storage_offset=offset, storage=storage,
        version=version, values=Values(numel=numel, data=data),
        grad=GradInfo(shape=shape, values=Values(numel=numel, data=grad)) if grad is not None else None,
        base=base, is_view=is_view, grad_fn=grad_fn, grad_fn_name=grad_fn_name, element_size=4, nbytes=4 * numel,
    )


def mul_call() -> CallInfo:
    """c = a * b with a = 2, b = 3, after c.backward(): a.grad = 3.0, b.grad = 2.0."""
    tensors = [
        tensor("t0", "c", [1], [6.0], stride=[1], leaf=False, grad_fn="n0", grad_fn_name="MulBackward0",
               storage="s0"),
        tensor("t1", "a", [1], [2.0], stride=[1], grad=[3.0], storage="s1"),
        tensor("t2", "b", [1], [3.0], stride=[1], grad=[2.0], storage="s2"),
        tensor("t3", "w", [4, 2], [0.0, 4.0, 1.0, 5.0, 2.0, 6.0, 3.0, 7.0], stride=[1, 4], requires_grad=False,
               storage="s3", is_view=True, base="t4"),
        tensor("t4", None, [2, 4], [float(i) for i in range(8)], stride=[4, 1], requires_grad=False, storage="s3"),
        TensorInfo(id="t5", name="big", shape=[512, 1024], dtype="float32", device="cpu", requires_grad=True,
                   is_leaf=True, retains_grad=False, stride=[1024, 1], storage_offset=0, storage="s5", version=0,
                   values=Values(numel=524288, sample=[0.0123, -1.5, 0.25, 3.0], min=-4.2, max=4.7, mean=0.0031),
                   nbytes=2097152),
    ]
    nodes = [
        NodeInfo(id="n0", name="MulBackward0", kind="backward", next=[Edge("n1", 0), Edge("n2", 0)],
                 saved=[Saved("_saved_self", tensor="t1"), Saved("_saved_other", tensor="t2")],
                 tensor="t0", label="c", line=6),
        NodeInfo(id="n1", name="AccumulateGrad", kind="accumulate_grad", next=[], variable="t1", label="a"),
        NodeInfo(id="n2", name="AccumulateGrad", kind="accumulate_grad", next=[], variable="t2", label="b"),
    ]
    storages = [StorageInfo("s3", 32, "cpu", ["t3", "t4"])]
    return CallInfo(id="c0", index=0, api="Tensor.backward", line=7, roots=["n0"], nodes=nodes,
                    tensors=tensors, storages=storages, node_count=3, edge_count=2, duration_s=0.0004)


BACKWARD_ERROR = ErrorInfo(
    type="RuntimeError",
    message="one of the variables needed for gradient computation has been modified by an inplace "
            "operation: [torch.FloatTensor [3]], which is output 0 of SigmoidBackward0, is at version 1; "
            "expected version 0 instead.",
    line=13,
    traceback='Traceback (most recent call last):\n  File "demo.py", line 13, in <module>\n'
              "    y.sum().backward()\nRuntimeError: one of the variables needed for gradient computation "
              "has been modified by an inplace operation",
    file="demo.py",
)


def stale_call() -> CallInfo:
    """y = x.sigmoid(); y.mul_(2); y.sum().backward(): the saved result is stale."""
    tensors = [
        tensor("t10", "x", [3], [1.0, 1.0, 1.0], stride=[1]),
        tensor("t11", "y", [3], [1.4621, 1.4621, 1.4621], stride=[1], leaf=False, grad_fn="n11",
               grad_fn_name="MulBackward0", version=1),
    ]
    nodes = [
        NodeInfo(id="n10", name="SumBackward0", kind="backward", next=[Edge("n11", 0)],
                 saved=[Saved("_saved_self_sym_sizes", value=[3])], line=13),
        NodeInfo(id="n11", name="MulBackward0", kind="backward", next=[Edge("n12", 0), None],
                 saved=[Saved("_saved_other", value=2)], tensor="t11", label="y", line=12),
        NodeInfo(id="n12", name="SigmoidBackward0", kind="backward", next=[Edge("n13", 0)],
                 saved=[Saved("_saved_result", tensor="t11")], line=11,
                 stale=Stale(saved="result", saved_version=0, version=1, op_line=12)),
        NodeInfo(id="n13", name="AccumulateGrad", kind="accumulate_grad", next=[], variable="t10", label="x"),
    ]
    return CallInfo(id="c1", index=1, api="Tensor.backward", line=13, roots=["n10"], nodes=nodes,
                    tensors=tensors, error=BACKWARD_ERROR, node_count=4, edge_count=3)


def sample_trace() -> Trace:
    """Two real calls, a graph never backwarded, loop repeats kept as summaries, 50 calls counted."""
    unreached = CallInfo(id="c2", index=2, api="unreached", line=10, roots=["n20"],
                         nodes=[NodeInfo(id="n20", name="SumBackward0", kind="backward", next=[])],
                         tensors=[], node_count=1)
    repeats = [CallInfo(id=f"c{i}", index=i, api="Tensor.backward", line=7, roots=[], nodes=[], tensors=[],
                        snapshot="summary", same_as="c0", node_count=3) for i in (3, 4)]
    return Trace(calls=[mul_call(), stale_call(), unreached, *repeats], error=BACKWARD_ERROR, script="demo.py",
                 source=SCRIPT, call_count=50, output="tensor([6.], grad_fn=<MulBackward0>)\n")


def dark_palette() -> QPalette:
    pal = QPalette()
    for role, colour in ((QPalette.ColorRole.Window, "#1e1f22"), (QPalette.ColorRole.Base, "#1b1c1f"),
                         (QPalette.ColorRole.Text, "#dcdfe4"), (QPalette.ColorRole.WindowText, "#dcdfe4"),
                         (QPalette.ColorRole.Link, "#6cb6ff"), (QPalette.ColorRole.Highlight, "#3d6fb4"),
                         (QPalette.ColorRole.PlaceholderText, "#7d828a"), (QPalette.ColorRole.Button, "#2b2d31"),
                         (QPalette.ColorRole.ButtonText, "#dcdfe4"), (QPalette.ColorRole.AlternateBase, "#232428")):
        pal.setColor(role, QColor(colour))
    return pal


# -- value formatting ----------------------------------------------------------------------


def test_numbers_read_like_torch():
    assert format_number(3.0) == "3.0"
    assert format_number(0.30000001192092896) == "0.3"
    assert format_number(-1.5e-07) == "-1.5e-07"
    assert format_number(7, "int64") == "7"
    assert format_number(True, "bool") == "True"
    assert format_number(float("nan")) == "nan"


def test_values_nest_by_shape():
    assert format_tensor([1.0, 2.0, 3.0, 4.0], [2, 2]) == "[[1.0, 2.0],\n [3.0, 4.0]]"
    assert format_tensor([3.0], []) == "3.0"
    assert format_tensor([1, 2, 3, 4], [2, 1, 2], "int64") == "[[[1, 2]],\n\n [[3, 4]]]"
    wide = format_tensor([float(i) for i in range(40)], [40])
    assert all(len(line) <= 72 for line in wide.splitlines()) and wide.count("\n") >= 2


def test_big_values_show_sample_and_stats():
    text = format_values(Values(numel=524288, sample=[0.5, 1.0], min=-4.2, max=4.7, mean=0.0031), [512, 1024])
    assert "first 2 of 524,288: [0.5, 1.0, …]" in text
    assert "min -4.2" in text and "max 4.7" in text and "mean 0.0031" in text



def test_approximate_stats_are_marked(qtbot):
    exact = Values(numel=3_000_000, sample=[0.5], min=-4.2, max=4.7, mean=0.0031)
    approx = Values(numel=3_000_000, sample=[0.5], min=-4.2, max=4.7, mean=0.0031, approx=True)
    assert "\u2248" not in format_values(exact, [3_000_000])
    text = format_values(approx, [3_000_000])
    assert "min \u2248 -4.2" in text and "max \u2248 4.7" in text and "mean \u2248 0.0031" in text
    call = mul_call()
    t5 = call.tensor("t5")
    big = replace(t5, values=approx)
    panel = InspectorPanel()
    qtbot.addWidget(panel)
    panel.show_tensor({**call.tensor_map(), "t5": big}, "t5")
    assert "max \u2248 4.7" in panel.text() and "from a sample" in panel.text()

# -- inspector -----------------------------------------------------------------------------


def test_inspector_node_lists_links_and_saved(qtbot):
    panel = InspectorPanel()
    qtbot.addWidget(panel)
    call = mul_call()
    panel.show_node(call, "n0")
    text = panel.text()
    assert "MulBackward0" in text and "line 6" in text
    assert "AccumulateGrad (a)" in text and "AccumulateGrad (b)" in text
    assert "_saved_self" in text and "_saved_other" in text
    html = panel.browser.toHtml()
    assert 'href="node:n1"' in html and 'href="tensor:t1"' in html and 'href="tensor:t0"' in html
    with qtbot.waitSignal(panel.sig_node_selected) as blocker:
        panel.browser.anchorClicked.emit(QUrl("node:n1"))
    assert blocker.args == ["n1"]
    with qtbot.waitSignal(panel.sig_tensor_selected) as blocker:
        panel.browser.anchorClicked.emit(QUrl("tensor:t2"))
    assert blocker.args == ["t2"]


def test_inspector_accumulate_grad_links_variable(qtbot):
    panel = InspectorPanel()
    qtbot.addWidget(panel)
    panel.show_node(mul_call(), "n1")
    text = panel.text()
    assert "Variable" in text and "a shape 1 float32" in text
    assert "Gradient comes from" in text and "MulBackward0 (c)" in text
    assert "none: the gradient stops here" in text


def test_inspector_tensor_shows_stride_and_grad(qtbot):
    panel = InspectorPanel()
    qtbot.addWidget(panel)
    call = mul_call()
    panel.show_tensor(call, "t3")
    text = panel.text()
    assert "(1, 4)" in text
    assert "yes, a view of" in text
    assert "[[0.0, 4.0],\n [1.0, 5.0],\n [2.0, 6.0],\n [3.0, 7.0]]" in text
    assert "shared with" in text

    panel.show_tensor(call.tensor_map(), "t1")
    text = panel.text()
    assert "(1,)" in text and "3.0" in text.split(".grad")[-1]

    with qtbot.waitSignal(panel.sig_node_selected) as blocker:
        panel.show_tensor(call, "t0")
        panel.browser.anchorClicked.emit(QUrl("node:n0"))
    assert blocker.args == ["n0"]
    assert "not a leaf: autograd keeps .grad only for leaves" in panel.text()


def test_inspector_grad_hints_and_big_tensor(qtbot):
    panel = InspectorPanel()
    qtbot.addWidget(panel)
    panel.show_tensor(mul_call(), "t5")
    text = panel.text()
    assert "not on the path to the loss: backward never reaches it" in text
    assert "first 4 of 524,288" in text and "2.0 MB" in text


def test_inspector_reports_stale_saved_tensor(qtbot):
    panel = InspectorPanel()
    qtbot.addWidget(panel)
    panel.show_node(stale_call(), "n12")
    text = panel.text()
    assert "saved result at version 0, now at version 1: backward will fail here" in text
    assert "line 12" in text
    with qtbot.waitSignal(panel.sig_line_selected) as blocker:
        panel.browser.anchorClicked.emit(QUrl("line:12"))
    assert blocker.args == [12]
    panel.show_node(stale_call(), "n11")
    assert "None: this input needs no gradient" in panel.text()
    assert "2" in panel.text().split("_saved_other")[-1]


def test_inspector_follows_palette_and_clears(qtbot):
    panel = InspectorPanel()
    qtbot.addWidget(panel)
    panel.show_node(mul_call(), "n0")
    panel.setPalette(dark_palette())
    assert "#dcdfe4" in panel.browser.document().defaultStyleSheet()
    assert "MulBackward0" in panel.text()
    panel.clear()
    assert "Select a node" in panel.text()
    panel.show_node(mul_call(), "missing")
    assert "not in call #0" in panel.text()


# -- source --------------------------------------------------------------------------------


def test_source_highlights_and_reports_clicks(qtbot):
    panel = SourcePanel()
    qtbot.addWidget(panel)
    panel.resize(600, 300)
    panel.show()  # resize events, which lay out the viewport, wait for show
    qtbot.waitExposed(panel)
    panel.set_source(SCRIPT, "/tmp/demo.py")
    assert panel.path_label.text() == "demo.py"
    panel.highlight_lines([6, 99])
    selections = panel.editor.extraSelections()
    assert [s.cursor.blockNumber() + 1 for s in selections] == [6]
    assert panel.highlighted_lines() == [6]
    first = panel.editor.firstVisibleBlock().blockNumber()
    assert first <= 5 < first + 10

    block = panel.editor.document().findBlockByNumber(12)
    where = panel.editor.cursorRect(QTextCursor(block)).center() + QPoint(20, 0)
    with qtbot.waitSignal(panel.sig_line_clicked) as blocker:
        qtbot.mouseClick(panel.editor.viewport(), Qt.MouseButton.LeftButton, pos=where)
    assert blocker.args == [13]
    panel.clear_highlight()
    assert panel.editor.extraSelections() == []


def test_source_colours_python(qtbot):
    panel = SourcePanel()
    qtbot.addWidget(panel)
    panel.set_source('import torch  # "not a string"\nx = "a # b" + 1.5\n', None)
    doc = panel.editor.document()

    def colour_at(line: int, column: int) -> str:
        for fmt in doc.findBlockByNumber(line).layout().formats():
            if fmt.start <= column < fmt.start + fmt.length:
                return fmt.format.foreground().color().name()
        return ""

    colours = panel.highlighter._formats
    assert colour_at(0, 0) == colours["keyword"].foreground().color().name()
    assert colour_at(0, 16) == colours["comment"].foreground().color().name()
    assert colour_at(1, 7) == colours["string"].foreground().color().name()  # the '#' inside the string
    assert colour_at(1, 14) == colours["number"].foreground().color().name()

    panel.set_source('s = """one\nfor two\n"""  # done\ndef f(self): pass\n', None)
    assert colour_at(1, 0) == colours["string"].foreground().color().name()  # 'for' inside the string
    assert colour_at(2, 6) == colours["comment"].foreground().color().name()
    assert colour_at(3, 4) == colours["def"].foreground().color().name()
    assert colour_at(3, 6) == colours["self"].foreground().color().name()


# -- calls ---------------------------------------------------------------------------------


def test_calls_rows_match_calls(qtbot):
    panel = CallsPanel()
    qtbot.addWidget(panel)
    panel.set_trace(sample_trace())
    rows = [panel.list.item(r).text() for r in range(panel.list.count())]
    assert rows == [
        "#0 Tensor.backward · line 7 · 3 nodes",
        "#1 Tensor.backward · line 13 · 4 nodes · RuntimeError",
        "#2 (never backwarded) · line 10 · 1 node",
        "#3 Tensor.backward · line 7 · same graph as #0",
        "#4 Tensor.backward · line 7 · same graph as #0",
        "50 calls in total, 5 kept",
    ]
    assert panel.call_ids() == ["c0", "c1", "c2", "c3", "c4"]
    assert not panel.list.item(5).flags() & Qt.ItemFlag.ItemIsSelectable

    with qtbot.assertNotEmitted(panel.sig_call_selected):
        panel.select_call("c1")
    assert panel.current_call() == "c1"
    with qtbot.waitSignal(panel.sig_call_selected) as blocker:
        panel.list.setCurrentRow(2)
    assert blocker.args == ["c2"]
    panel.list.setFocus()
    with qtbot.waitSignal(panel.sig_call_selected) as blocker:
        qtbot.keyClick(panel.list, Qt.Key.Key_Down)
    assert blocker.args == ["c3"]


# -- problems ------------------------------------------------------------------------------


def test_problems_list_errors_and_stale_tensors(qtbot):
    panel = ProblemsPanel()
    qtbot.addWidget(panel)
    panel.set_trace(sample_trace())
    assert panel.count() == 2
    error, stale = panel.problems()
    assert error.line == 13 and error.call == "c1"
    assert stale.call == "c1" and stale.node == "n12" and stale.line == 12
    first = panel.tree.topLevelItem(0)
    assert first.text(0).startswith("RuntimeError: one of the variables")
    assert first.text(1) == "line 13 · call #1"
    assert "y.sum().backward()" in panel.details.toPlainText()

    with qtbot.waitSignal(panel.sig_line_activated) as lines, qtbot.waitSignal(panel.sig_call_selected) as calls:
        panel.tree.itemActivated.emit(first, 0)
    assert lines.args == [13] and calls.args == ["c1"]
    with qtbot.waitSignal(panel.sig_node_selected) as nodes:
        panel.tree.itemActivated.emit(panel.tree.topLevelItem(1), 0)
    assert nodes.args == ["n12"]


def test_problems_show_error_with_fault(qtbot):
    panel = ProblemsPanel()
    qtbot.addWidget(panel)
    crash = ErrorInfo(type="WorkerDied", message="the worker exited with signal 11 (SIGSEGV)", kind="crash",
                      fault="Fatal Python error: Segmentation fault\n\nCurrent thread 0x7f (most recent call "
                            "first):\n  File \"demo.py\", line 9 in <module>")
    panel.show_error(crash, title="Backprop Studio lost the worker")
    assert panel.count() == 1
    text = panel.details.toPlainText()
    assert "Backprop Studio lost the worker" in text and "Segmentation fault" in text
    with qtbot.assertNotEmitted(panel.sig_line_activated):
        panel.tree.itemActivated.emit(panel.tree.topLevelItem(0), 0)
    panel.clear()
    assert panel.count() == 0


# -- output --------------------------------------------------------------------------------


def test_output_appends_and_stays_bounded(qtbot):
    panel = OutputPanel(max_chars=1000)
    qtbot.addWidget(panel)
    panel.append("loss 0.5\n")
    panel.append("loss 0.4")
    panel.append("\n")
    assert panel.text() == "loss 0.5\nloss 0.4\n"
    for i in range(2000):
        panel.append(f"step {i}\n")
    text = panel.text()
    assert text.endswith("step 1999\n") and len(text) <= 2000
    assert panel.view.toPlainText().startswith("… earlier output trimmed …")
    panel.clear()
    assert panel.text() == ""


@pytest.mark.parametrize("dark", [False, True])
def test_panels_render_something(qtbot, dark):
    """Every panel filled with the sample paints a non-blank image in both themes."""
    trace = sample_trace()
    panels = [InspectorPanel(), SourcePanel(), CallsPanel(), ProblemsPanel(), OutputPanel()]
    panels[0].show_tensor(trace.calls[0], "t3")
    panels[1].set_source(trace.source, trace.script)
    panels[1].highlight_lines([6])
    panels[2].set_trace(trace)
    panels[3].set_trace(trace)
    panels[4].append(trace.output)
    for panel in panels:
        qtbot.addWidget(panel)
        if dark:
            panel.setPalette(dark_palette())
        panel.resize(420, 300)
        image = panel.grab().toImage()
        assert len({image.pixel(x, y) for x in range(0, 420, 7) for y in range(0, 300, 7)}) > 3
