"""The Curves panel: the series of a loop with checkboxes, one plot per kind with its legend, log y,
the hover readout, and the export to PNG and SVG in the print theme."""

import math
import xml.etree.ElementTree as ET

import pytest
from PySide6.QtCore import QPointF, Qt
from PySide6.QtGui import QColor, QImage

from core.model.trace import CallInfo, Trace
from widgets.panels.curves import EMPTY_TEXT, CurvesExportError, CurvesPanel, export_trace_curves


def _call(index, scalars, grad_norms=None):
    return CallInfo(id=f"c{index}", index=index, api="Tensor.backward", line=3, roots=[], nodes=[], tensors=[],
                    scalars=scalars, grad_norms=grad_norms)


def _trace():
    norms = lambda g: {"params": {"fc.weight": {"module": "fc", "grad": g, "param": 2.0, "ratio": g / 2}},  # noqa: E731
                       "modules": {"fc": g}}
    return Trace(script="/x/loop.py", calls=[
        _call(0, {"loss": 4.0, "values": {"w": [0.0, 1.0]}, "grads": {"w": [-2.0, 0.5]}}, norms(8.0)),
        _call(1, {"loss": 1.0, "values": {"w": [1.0, "-inf"]}, "grads": {"w": [-1.0, "nan"]}}, norms(4.0)),
        _call(2, {"loss": 0.25, "values": {"w": [1.5, 0.5]}, "grads": {"w": [-0.5, 0.25]}}, norms(2.0)),
    ])


@pytest.fixture
def panel(qtbot):
    p = CurvesPanel()
    qtbot.addWidget(p)
    p.resize(600, 560)
    p.set_trace(_trace())
    p.show()
    qtbot.waitExposed(p)
    return p


def _checked(panel):
    items = [panel.series_list.item(i) for i in range(panel.series_list.count())]
    return {i.text(): i.checkState() == Qt.CheckState.Checked for i in items}


def _legend(plot_legend):
    return [label.text for _, label in plot_legend.items]


def test_the_series_are_listed_and_the_loss_and_values_are_drawn(panel):
    assert _checked(panel) == {"loss": True, "w[0]": True, "w[1]": True, "w.grad[0]": False, "w.grad[1]": False,
                               "‖fc.weight‖": False, "‖fc.weight.grad‖": False}
    chart = panel.chart
    assert list(chart.plots) == ["loss", "value"] and sorted(chart.items) == ["loss", "w[0]", "w[1]"]
    x, y = chart.items["w[1]"].getData()
    assert list(x) == [0, 1, 2] and y[0] == 1.0 and math.isnan(y[1]) and y[2] == 0.5  # -inf: a gap
    assert list(chart.items["loss"].getData()[1]) == [4.0, 1.0, 0.25]
    assert panel.summary.text() == "loss 4 → 0.25 over 3 calls"
    legends = [item for item in chart.plot_widget.ci.items if type(item).__name__ == "LegendItem"]
    assert [_legend(lg) for lg in legends] == [["loss"], ["w[0]", "w[1]"]]


def test_a_checkbox_hides_a_series_and_ticking_grads_and_norms_adds_their_plots(panel):
    panel.series_list.item(2).setCheckState(Qt.CheckState.Unchecked)  # w[1]
    assert sorted(panel.chart.items) == ["loss", "w[0]"]
    panel.set_shown("w.grad[0]", True)
    panel.set_shown("‖fc.weight.grad‖", True)
    assert list(panel.chart.plots) == ["loss", "value", "grad", "norm"]
    assert list(panel.chart.items["‖fc.weight.grad‖"].getData()[1]) == [8.0, 4.0, 2.0]
    panel.set_shown("loss", False)
    assert list(panel.chart.plots) == ["value", "grad", "norm"] and "loss" not in panel.chart.items


def test_log_y_applies_to_the_loss_and_norms_only(panel):
    panel.set_shown("‖fc.weight‖", True)
    panel.log_box.setChecked(True)
    plots = panel.chart.plots
    assert plots["loss"].ctrl.logYCheck.isChecked() and plots["norm"].ctrl.logYCheck.isChecked()
    assert not plots["value"].ctrl.logYCheck.isChecked()
    assert list(panel.chart.items["loss"].getData()[1]) == pytest.approx([math.log10(4.0), 0.0, math.log10(0.25)])


def test_hovering_reads_every_series_of_that_plot_at_the_nearest_call(panel, qtbot):
    chart = panel.chart
    assert chart.readout("value", 1.3) == (1, "call #1\nw[0] = 1\nw[1] = -inf")
    plot = chart.plots["loss"]
    qtbot.waitUntil(lambda: plot.vb.width() > 100)
    chart._on_hover((plot.vb.mapViewToScene(QPointF(1.8, 1.0)),))
    assert chart._readout.isVisible() and chart._readout.textItem.toPlainText() == "call #2\nloss = 0.25"
    assert all(c.isVisible() and c.value() == 2 for c in chart._cursors)


def test_the_call_shown_is_marked_in_every_plot(panel):
    panel.mark_call(1)
    assert [(m.isVisible(), m.value()) for m in panel.chart._marks] == [(True, 1), (True, 1)]
    panel.set_shown("w.grad[0]", True)  # drawn again: the mark stays
    assert [(m.isVisible(), m.value()) for m in panel.chart._marks] == [(True, 1)] * 3
    panel.mark_call(7)  # a call that recorded nothing
    assert not any(m.isVisible() for m in panel.chart._marks)


def test_export_writes_png_and_svg_in_the_print_theme(panel, tmp_path):
    panel.chart.set_theme("dark")
    panel.mark_call(2)
    png = panel.export(tmp_path / "curves.png")
    image = QImage(str(png))
    assert (image.width(), image.height()) == (1800, 2 * (70 + 210 * 2))
    assert image.pixelColor(4, 4) == QColor("#ffffff")  # print: white paper
    colours = {image.pixelColor(x, y).name() for x in range(0, 1800, 5) for y in range(0, image.height(), 5)}
    assert "#0072b2" in colours and "#000000" in colours  # w[0]'s line, the loss and the axes' text
    svg = panel.export(tmp_path / "curves.svg")
    root = ET.parse(svg).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    text = svg.read_text()
    assert "w[0]" in text and "w[1]" in text and "loss" in text and "backward call" in text
    assert "w.grad[0]" not in text  # not ticked, not drawn
    assert panel.chart.theme().name == "dark"  # the screen keeps its theme, and its mark
    assert all(m.isVisible() and m.value() == 2 for m in panel.chart._marks)
    with pytest.raises(CurvesExportError, match="unknown curves export format"):
        panel.export(tmp_path / "curves.pdf")


def test_headless_export_and_an_empty_trace(qtbot, tmp_path):
    out = export_trace_curves(_trace(), tmp_path / "c.svg", keys=["‖fc.weight‖"])
    assert "‖fc.weight‖" in out.read_text() and ">loss<" not in out.read_text()
    with pytest.raises(CurvesExportError, match="no series v; the run has loss, w\\[0\\]"):
        export_trace_curves(_trace(), tmp_path / "c.png", keys=["v"])
    with pytest.raises(CurvesExportError, match="no loss and no small leaf"):
        export_trace_curves(Trace(calls=[]), tmp_path / "e.png")
    p = CurvesPanel()
    qtbot.addWidget(p)
    p.set_trace(Trace(calls=[_call(0, None)]))
    assert p.stack.currentWidget() is p.empty and p.empty.text() == EMPTY_TEXT
    assert not p.export_action.isEnabled()


def test_the_window_has_a_curves_tab_after_gradients_fed_with_the_trace_and_the_call_shown(qtbot, tmp_path,
                                                                                         monkeypatch):
    monkeypatch.setenv("BACKPROP_STUDIO_SETTINGS", str(tmp_path / "settings.ini"))
    from app.cli.window_options import PANELS
    from app.session.worker_handle import WorkerHandle
    from app.window.window import MainWindow

    assert "curves" in PANELS  # --show curves brings it to the front for a screenshot
    w = MainWindow(handle=WorkerHandle(prestart=False), timeout=60)
    qtbot.addWidget(w)
    w.resize(1200, 800)
    w.show()
    try:
        w.show_trace(_trace())
        tabs = [w.left_tabs.tabText(i) for i in range(w.left_tabs.count())]
        assert tabs[tabs.index("Gradients") + 1] == "Curves"
        assert w.left_tabs.widget(tabs.index("Curves")) is w.curves
        assert sorted(w.curves.chart.items) == ["loss", "w[0]", "w[1]"]
        w.show_call("c2")
        assert all(m.isVisible() and m.value() == 2 for m in w.curves.chart._marks)
    finally:
        w.handle.close()
