"""The gradient-norm heatmap: cells on a log colour scale, tooltips, flags, a click picking a call."""

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QColor, QHelpEvent
from PySide6.QtWidgets import QApplication, QToolTip

from core.model.trace import CallInfo, Trace
from widgets.panels.grad_health import EMPTY_TEXT, GradHealthPanel

EXPLODING = "exploding: fc1 from call #1: norm 0.5 → 50 over 3 calls"
VANISHING = "vanishing: fc2 from call #3: norm 0.001, 0.0002 of the largest (5); in 1 call"


def _call(index, modules, api="Tensor.backward"):
    """A call whose params are reached last layer first, as backward reaches them."""
    params = {f"{m}.weight": {"module": m, "grad": n, "param": 1.0, "ratio": n} for m, n in reversed((modules or {}).items())}
    return CallInfo(id=f"c{index}", index=index, api=api, line=10, roots=[], nodes=[], tensors=[],
                    grad_norms={"params": params, "modules": dict(modules)} if modules else None)


def _trace():
    """fc1 rises 0.5 -> 5 -> 50 from call 1; fc2 falls to 1e-3 of call 3's 5.0 and is not reached in call 4.
    Call 2 is an autograd.grad call, which leaves no norms: four columns, for calls 0, 1, 3, 4."""
    rows = {0: {"fc1": 1.0, "fc2": 1.0}, 1: {"fc1": 0.5, "fc2": 1.0}, 2: None,
            3: {"fc1": 5.0, "fc2": 1e-3}, 4: {"fc1": 50.0, "fc2": None}}
    calls = [_call(i, r, "autograd.grad" if r is None else "Tensor.backward") for i, r in rows.items()]
    return Trace(calls=calls, call_count=5)


@pytest.fixture
def panel(qtbot):
    p = GradHealthPanel()
    qtbot.addWidget(p)
    p.resize(360, 320)
    p.set_trace(_trace())
    p.show()
    qtbot.waitExposed(p)
    return p


def test_cells_hold_each_module_and_call_and_colour_on_a_log_scale(panel):
    heat = panel.heatmap
    m = panel.health.matrix
    assert (m.modules, m.calls) == (["fc1", "fc2"], [0, 1, 3, 4])
    assert m.values == [[1.0, 0.5, 5.0, 50.0], [1.0, 1.0, 1e-3, None]]
    assert panel.summary.text() == "‖grad‖ per module: 2 modules × 4 calls"
    colors = [[c.name() if c is not None else None for c in (heat.cell_color(i, j) for j in range(4))] for i in range(2)]
    # the scale spans 1e-3 (violet) .. 50 (yellow); 1.0 sits at 3 / 4.699 = 0.638 of it, between
    # viridis' #21918c and #5ec962
    assert colors == [["#43b075", "#33a280", "#76cd59", "#fde725"], ["#43b075", "#43b075", "#440154", None]]
    # brighter is larger: fc1's calls in order of their norm, 0.5 < 1 < 5 < 50
    order = sorted(range(4), key=lambda j: QColor(colors[0][j]).lightnessF() + QColor(colors[0][j]).greenF())
    assert [m.values[0][j] for j in order] == [0.5, 1.0, 5.0, 50.0]
    assert heat.bar_labels() == ("0.001", "50")
    # what is painted: the cell's colour at its centre, the window behind a module a call did not reach
    image = heat.grab().toImage()
    at = lambda i, j: image.pixelColor(heat.cell_rect(i, j).center().toPoint()).name()  # noqa: E731
    assert (at(0, 0), at(0, 3), at(1, 2)) == ("#43b075", "#fde725", "#440154")
    assert at(1, 3) == heat.palette().window().color().name()


def test_flags_are_listed_and_their_cells_outlined(panel, qtbot):
    assert panel.flag_texts() == [EXPLODING, VANISHING]
    heat = panel.heatmap
    image = heat.grab().toImage()

    def edge(i, j):
        r = heat.cell_rect(i, j)
        return image.pixelColor(QPoint(int(r.left()) + 1, int(r.center().y()))).name()

    # fc1's rise is outlined from its first call (column 1), fc2's vanishing at call 3 (column 2)
    assert edge(0, 1) == "#ff3b30" and edge(1, 2) == "#00c8ff"
    assert edge(0, 0) == "#43b075"  # call 0 is not part of the rise
    # a click on a flag picks the call where it starts
    with qtbot.waitSignal(panel.sig_call_selected) as blocker:
        rect = panel.flags.visualItemRect(panel.flags.item(1))
        qtbot.mouseClick(panel.flags.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert blocker.args == [3]


@pytest.mark.qt_log_ignore("This plugin does not support raise")  # the tooltip window, offscreen
def test_a_cell_tip_names_module_call_and_norm(panel, qtbot):
    heat = panel.heatmap
    assert heat.cell_tip(1, 0) == "fc2 · call #0: ‖grad‖ 1"
    assert heat.cell_tip(0, 1) == "fc1 · call #1: ‖grad‖ 0.5\n" + EXPLODING
    assert heat.cell_tip(1, 3) == "fc2 · call #4: ‖grad‖ not reached"
    pos = heat.cell_rect(1, 0).center().toPoint()
    QApplication.sendEvent(heat, QHelpEvent(QHelpEvent.Type.ToolTip, pos, heat.mapToGlobal(pos)))
    qtbot.waitUntil(lambda: QToolTip.text() == "fc2 · call #0: ‖grad‖ 1")


def test_a_click_on_a_column_picks_its_call(panel, qtbot):
    heat = panel.heatmap
    with qtbot.waitSignal(panel.sig_call_selected) as blocker:
        qtbot.mouseClick(heat, Qt.MouseButton.LeftButton, pos=heat.cell_rect(1, 2).center().toPoint())
    assert blocker.args == [3]  # the third column is call #3: call 2 left no norms
    # above the cells, on the call numbers, the column is picked too
    above = QPoint(int(heat.cell_rect(0, 3).center().x()), 4)
    with qtbot.waitSignal(panel.sig_call_selected) as blocker:
        qtbot.mouseClick(heat, Qt.MouseButton.LeftButton, pos=above)
    assert blocker.args == [4]
    # the call shown is framed; a call without norms frames none
    panel.mark_call(3)
    assert heat.current == 2
    image = heat.grab().toImage()
    top = heat.cell_rect(0, 2)
    assert image.pixelColor(QPoint(int(top.left()), int(top.top()) - 2)).name() == heat.palette().windowText().color().name()
    panel.mark_call(2)
    assert heat.current is None


def test_a_trace_without_norms_says_so(panel):
    panel.set_trace(Trace(calls=[_call(0, None, "autograd.grad")], call_count=1))
    assert panel.stack.currentWidget() is panel.empty and panel.empty.text() == EMPTY_TEXT
    assert panel.flag_texts() == [] and panel.heatmap.health is None
    panel.set_trace(_trace())
    assert panel.stack.currentWidget() is panel.body


@pytest.fixture(scope="module")
def exploding_trace():
    pytest.importorskip("torch")
    from pathlib import Path

    from core.worker.capture.recorder import capture_script

    return capture_script(str(Path(__file__).parents[2] / "resources/examples/35_exploding_and_clipping.py"))


def test_the_exploding_example_is_flagged_at_call_3(qtbot, exploding_trace):
    p = GradHealthPanel()
    qtbot.addWidget(p)
    p.set_trace(exploding_trace)
    m = p.health.matrix
    assert (m.modules, m.calls) == (["fc1", "fc2", "fc3"], list(range(16)))
    assert p.flag_texts() == ["exploding: fc1 from call #3: norm 0.752 → 886 over 3 calls",
                              "exploding: fc2 from call #3: norm 1.45 → 894 over 3 calls",
                              "exploding: fc3 from call #3: norm 1.23 → 838 over 3 calls"]
    assert p.heatmap.cell_tip(0, 3) == "fc1 · call #3: ‖grad‖ 0.752\n" + p.flag_texts()[0]


def test_the_window_shows_the_heatmap_beside_the_calls_and_a_click_selects_the_call(qtbot, tmp_path, monkeypatch,
                                                                                    exploding_trace):
    monkeypatch.setenv("BACKPROP_STUDIO_SETTINGS", str(tmp_path / "settings.ini"))
    from app.session.worker_handle import WorkerHandle
    from app.window.window import MainWindow

    w = MainWindow(handle=WorkerHandle(prestart=False), timeout=60)
    qtbot.addWidget(w)
    w.resize(1200, 800)
    w.show()
    try:
        w.show_trace(exploding_trace)
        qtbot.waitUntil(lambda: w.call is not None)
        tabs = [w.left_tabs.tabText(i) for i in range(w.left_tabs.count())]
        assert tabs == ["Calls", "Tensors", "Gradients", "Curves"]
        assert w.grad_health.health.matrix.calls == list(range(16))
        w.left_tabs.setCurrentWidget(w.grad_health)
        heat = w.grad_health.heatmap
        qtbot.waitExposed(heat)
        qtbot.mouseClick(heat, Qt.MouseButton.LeftButton, pos=heat.cell_rect(0, 14).center().toPoint())
        qtbot.waitUntil(lambda: w.calls.current_call() == "c14")
        assert heat.current == 14
        w.calls.select_call("c2")  # picked in the Calls list: the heatmap frames it
        w.show_call("c2")
        assert heat.current == 2
    finally:
        w.handle.close()


@pytest.mark.qt_log_ignore("This plugin does not support raise")  # the tooltip window, offscreen
def test_a_skipped_gradscaler_step_is_marked_above_its_column_and_listed(qtbot):
    # call 1's gradients hold inf: its norms are inf and the GradScaler skipped the step after it
    calls = [_call(i, {"fc1": n, "fc2": 2 * n}) for i, n in enumerate([1.0, float("inf"), 0.5])]
    steps = [{"kind": "scaler.step", "after_call": i, "line": 20, "optimizer": "SGD", "scale": s, "skipped": i == 1,
              "scale_after": a} for i, (s, a) in enumerate([(65536.0, 65536.0), (65536.0, 32768.0), (32768.0, 32768.0)])]
    p = GradHealthPanel()
    qtbot.addWidget(p)
    p.resize(360, 320)
    p.set_trace(Trace(calls=calls, call_count=3, grad_events=steps))
    p.show()
    qtbot.waitExposed(p)
    heat = p.heatmap
    assert heat.skips == {1: p.health.skipped[0]}
    skipped = "call #1: GradScaler step skipped: inf/NaN in gradients, scale 65536 → 32768"
    assert p.flag_texts() == ["no vanishing or exploding gradients", skipped]
    # inf has no place on the log scale: grey like nan, and the bar says so
    assert heat.cell_color(0, 1).name() == "#9e9e9e" and heat.cell_color(0, 0).name() != "#9e9e9e"
    assert heat.bar_caption() == "‖grad‖, log scale · grey: inf · amber: step skipped"
    # in a narrow dock the caption takes two lines, each whole; a wide one keeps it on one
    for width, count in ((200, 2), (800, 1)):
        heat.resize(width, heat.height())
        lines = heat.caption_lines()
        assert len(lines) == count and " · ".join(lines) == heat.bar_caption()
        assert all(heat.fontMetrics().horizontalAdvance(line) <= width - 4 for line in lines)
    heat.resize(360, heat.height())
    assert heat.cell_tip(0, 1) == ("fc1 · call #1: ‖grad‖ inf\n"
                                   "GradScaler step skipped: inf/NaN in gradients, scale 65536 → 32768")
    assert heat.skip_tip(1) == skipped and heat.skip_tip(0) == ""
    # the amber band is painted above column 1 only, under the call numbers
    image = heat.grab().toImage()

    def band(col):
        r = heat.cell_rect(0, col)
        return image.pixelColor(QPoint(int(r.center().x()), int(r.top()) - 3)).name()

    assert band(1) == "#f0a000" and band(0) == band(2) == heat.palette().window().color().name()
    # its line in the list picks the call
    with qtbot.waitSignal(p.sig_call_selected) as blocker:
        rect = p.flags.visualItemRect(p.flags.item(1))
        qtbot.mouseClick(p.flags.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert blocker.args == [1]
    # the list's first line picks nothing
    with qtbot.assertNotEmitted(p.sig_call_selected):
        rect = p.flags.visualItemRect(p.flags.item(0))
        qtbot.mouseClick(p.flags.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
