"""The memory chart: lines, bands and call markers, clicks and hover, axis units, time tools,
reference runs and export."""

import numpy as np
import pytest
from PySide6.QtCore import QPointF, Qt
from PySide6.QtGui import QColor

from core.model.trace import MemorySample
from widgets.memory.chart import MemoryChart


# -- the chart ------------------------------------------------------------------------------------


def _series() -> list[MemorySample]:
    """3 phases, 2 backward calls: forward 0-0.9 s, #0 at 1.0 s, between, #1 at 2.0 s, between."""
    phases = ["forward"] * 10 + ["backward"] * 5 + ["between"] * 5 + ["backward"] * 5 + ["between"] * 5
    return [MemorySample(t=i / 10, device="cpu", rss=(300 + i) << 20, saved_bytes=(i % 7) << 20, phase=p)
            for i, p in enumerate(phases)]


def _points(item) -> int:
    return 0 if item.xData is None else len(item.xData)


def _click(qtbot, chart, t):
    scene = chart.view.mapViewToScene(QPointF(t, chart.view.viewRect().center().y()))
    pos = chart.plot_widget.mapFromScene(scene)
    qtbot.mouseClick(chart.plot_widget.viewport(), Qt.MouseButton.LeftButton, pos=pos)


def test_chart_draws_lines_bands_and_call_markers(qtbot):
    chart = MemoryChart(theme="light")
    qtbot.addWidget(chart)
    chart.set_samples(_series())
    lines = chart.line_items()
    assert set(lines) == {"rss", "saved_bytes"}
    assert all(len(item.xData) == 30 for item in lines.values())
    assert lines["rss"].yData[0] == 300 and lines["saved_bytes"].yData[3] == 3
    bands = chart.band_items()
    assert [b[0] for b in bands] == ["forward", "backward", "between", "backward", "between"]
    assert bands[1][1:] == (1.0, 1.5) and bands[-1][2] == 2.9
    assert chart.marker_items() == [(0, 1.0), (1, 2.0)]
    chart.set_calls([{"index": 7, "t": 1.0}, {"index": 8, "t": 2.0}])  # the capture's own indices
    assert [m[0] for m in chart.marker_items()] == [7, 8]


def test_clicking_a_time_selects_the_call_running_then(qtbot):
    chart = MemoryChart()
    qtbot.addWidget(chart)
    chart.resize(800, 300)
    chart.set_samples(_series())
    chart.show()
    qtbot.waitExposed(chart)
    chart.view.setXRange(0, 3, padding=0)
    clicked: list[float] = []
    chart.sig_time_clicked.connect(clicked.append)
    with qtbot.waitSignal(chart.sig_call_selected, timeout=2000) as blocker:
        _click(qtbot, chart, 2.2)  # inside call #1's band
    assert blocker.args == [1]
    assert clicked == [pytest.approx(2.2, abs=0.02)]
    with qtbot.waitSignal(chart.sig_call_selected, timeout=2000) as blocker:
        _click(qtbot, chart, 1.7)  # between: the last call started
    assert blocker.args == [0]
    with qtbot.assertNotEmitted(chart.sig_call_selected, wait=50):
        _click(qtbot, chart, 0.5)  # forward, before any call


def test_hover_readout_and_freed_markers(qtbot):
    chart = MemoryChart()
    qtbot.addWidget(chart)
    chart.set_samples(_series())
    html = chart.readout_html(12)
    assert "1.200 s" in html and "backward #0" in html and "312.0 MB" in html and "5.0 MB" in html
    chart.mark_freed(1.3, 3 << 20)
    chart.add_marker(2.5, "note")
    assert len(chart.note_items()) == 2 and "3.00 MB" in chart.note_items()[0].label.toPlainText()
    chart.clear_markers()
    assert chart.note_items() == []


def test_streamed_samples_match_a_full_set(qtbot):
    chart = MemoryChart()
    qtbot.addWidget(chart)
    series = _series()
    for i in range(0, 30, 4):
        chart.append_samples([vars(s) for s in series[i:i + 4]])  # dicts, as in memory messages
    assert _points(chart.line_items()["rss"]) < 30  # drawn by the refresh timer, not per batch
    qtbot.waitUntil(lambda: _points(chart.line_items()["rss"]) == 30, timeout=2000)
    assert len(chart.band_items()) == 5 and len(chart.marker_items()) == 2
    chart.clear()
    assert chart.band_items() == [] and _points(chart.line_items()["rss"]) == 0


@pytest.mark.parametrize("theme", ["light", "dark", "print"])
def test_chart_renders_something(qtbot, theme):
    chart = MemoryChart(theme=theme)
    qtbot.addWidget(chart)
    chart.resize(700, 260)
    chart.set_samples(_series())
    chart.show()
    qtbot.waitExposed(chart)
    image = chart.grab().toImage()
    background = QColor(chart.theme().background).rgb()
    pixels = [image.pixel(x, y) for x in range(0, image.width(), 3) for y in range(0, image.height(), 3)]
    assert sum(p != background for p in pixels) > len(pixels) // 10
    assert len(set(pixels)) > 20


# -- units, time tools, reference runs, export ---------------------------------------------------


@pytest.mark.parametrize("nbytes, unit", [(1 << 10, "KB"), (50 << 20, "MB"), (3 << 30, "GB"), (300, "KB")])
def test_axis_units_follow_the_magnitude(qtbot, nbytes, unit):
    from core.model.memory import byte_unit

    assert byte_unit(nbytes)[0] == unit
    chart = MemoryChart(theme="light")
    qtbot.addWidget(chart)
    chart.set_samples([MemorySample(t=i, device="cpu", rss=nbytes * i // 2, saved_bytes=nbytes * i // 2)
                       for i in range(3)])
    size = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}[unit]
    assert chart.units == {"left": (unit, size), "right": (unit, size)}
    assert chart.line_items()["saved_bytes"].yData[2] == pytest.approx(nbytes / size)
    for side in ("left", "right"):
        axis = chart.plot.getAxis(side)
        assert f"({unit})" in axis.labelString() and "x1" not in axis.labelString()
        assert axis.autoSIPrefixScale == 1.0


def _loop(offset=0.0, saved=4 << 10) -> list[MemorySample]:
    """Three iterations of forward (saved rises), backward (falls), between; starting before."""
    out = [MemorySample(t=offset, device="cpu", rss=100 << 20, phase="starting")]
    for k in range(3):
        t0 = offset + 1 + k
        out += [MemorySample(t=t0 + 0.1 * j, device="cpu", rss=100 << 20, saved_bytes=saved * j // 4,
                             phase="forward", where=f"op{j}") for j in range(5)]
        out += [MemorySample(t=t0 + 0.5, device="cpu", rss=100 << 20, saved_bytes=saved, phase="backward"),
                MemorySample(t=t0 + 0.7, device="cpu", rss=100 << 20, phase="between", mark="optimizer.step")]
    return out


def test_fit_call_zooms_to_one_iteration_and_overlay_aligns_them(qtbot):
    chart = MemoryChart(theme="light")
    qtbot.addWidget(chart)
    chart.resize(800, 300)
    chart.set_samples(_loop())
    assert [b[0] for b in chart.band_items()][:3] == ["starting", "forward", "backward"]
    assert chart.iterations() == [(1.0, 2.0), (2.0, 3.0), (3.0, 3.7)]
    assert chart.fit_call(1) == (2.0, 3.0)
    x0, x1 = chart.view.viewRange()[0]
    assert 1.9 < x0 < 2.0 and 3.0 < x1 < 3.1
    assert chart.fit_call(9) is None
    assert chart.events.kinds == ["optimizer.step"] * 3 and list(chart.events.t0) == [1.7, 2.7, 3.7]
    t, nbytes, where = chart.peak()
    assert (t, nbytes, where) == (1.4, 4 << 10, "op4")
    assert chart.peak_label.toPlainText() == "peak 4.0 KB · op4"
    chart.set_overlay(True)
    assert chart.overlay_count() == 3 and not chart.line_items()["rss"].isVisible()
    xs = chart.overlay_item.xData
    starts = [0] + [i + 1 for i in np.nonzero(np.isnan(xs))[0][:-1]]
    assert [xs[i] for i in starts] == [0.0, 0.0, 0.0]  # each iteration from its own start
    assert np.nanmax(chart.overlay_item.yData) == 4.0  # KB
    assert chart.plot.getAxis("left").labelString().count("saved (KB)") == 1
    chart.set_overlay(False)
    assert chart.line_items()["rss"].isVisible() and not chart.overlay_item.isVisible()


def test_a_reference_run_shares_the_scale(qtbot):
    chart = MemoryChart(theme="light")
    qtbot.addWidget(chart)
    chart.resize(800, 300)
    chart.set_samples(_loop(saved=1 << 20))  # the fix: 1 MB at most
    chart.set_reference(_loop(saved=10 << 20), "leak")  # the leak: 10 MB
    chart.show()
    qtbot.waitExposed(chart)
    ours, ref = chart.line_items()["saved_bytes"], chart._ref_lines["saved_bytes"]
    assert ours.getViewBox() is ref.getViewBox() is chart.view2  # one y scale for both
    assert chart.units["right"] == ("MB", 1 << 20)
    qtbot.waitUntil(lambda: chart.view2.viewRange()[1][1] >= 10)
    y0, y1 = chart.view2.viewRange()[1]
    assert y0 <= 0 and 10 <= y1 < 11 and max(ours.yData) == 1.0 and max(ref.yData) == 10.0
    chart.set_theme("print")  # switching theme keeps the reference
    assert set(chart._ref_lines) == {"rss", "saved_bytes"} and chart.reference_label() == "leak"
    chart.clear_reference()
    assert chart._ref_lines == {} and ref.getViewBox() is None


def test_memory_export_writes_a_valid_svg_and_a_png(qtbot, tmp_path):
    import xml.etree.ElementTree as ET

    from PySide6.QtGui import QImage

    from widgets.memory.export import MemoryExportError, export_samples

    svg = export_samples(_loop(), tmp_path / "m.svg", reference=_loop(saved=8 << 10), reference_label="leak")
    root = ET.parse(svg).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg" and root.get("viewBox") == "0 0 1000 380"
    text = svg.read_text()
    assert "leak: saved" in text and "saved (KB)" in text and "optimizer.step" not in text
    shapes = [e for e in root.iter() if e.tag.rsplit("}", 1)[-1] in ("path", "polyline", "line")]
    assert len(shapes) > 10  # lines, axes, ticks, markers: drawn as vectors
    png = export_samples(_loop(), tmp_path / "m.png", fit_call=0)
    image = QImage(str(png))
    assert (image.width(), image.height()) == (2000, 760)
    assert len({image.pixel(x, y) for x in range(0, 2000, 7) for y in range(0, 760, 7)}) > 8
    with pytest.raises(MemoryExportError, match="unknown memory export format"):
        export_samples(_loop(), tmp_path / "m.pdf")
    with pytest.raises(MemoryExportError, match="no memory samples"):
        export_samples([], tmp_path / "e.svg")


def test_memory_panel_keeps_a_reference_run_fits_a_call_and_exports(qtbot, tmp_path):
    from widgets.memory.panel import CPU_NOTE, CUDA_NOTE, MemoryPanel

    panel = MemoryPanel()
    qtbot.addWidget(panel)
    panel.resize(900, 320)
    panel.set_run(_loop(saved=1 << 20), "/x/31_graph_leak_fixed.py", call_count=3)
    assert panel.note.text() == CPU_NOTE and panel.call_box.maximum() == 2
    panel.pin_reference()
    assert panel.unpin_button.isEnabled() and "31_graph_leak_fixed" in panel.pin_button.text()
    panel.set_run(_loop(saved=10 << 20), "/x/30_graph_leak.py", call_count=3)
    assert panel.chart.reference_label() == "31_graph_leak_fixed"
    assert max(panel.chart._ref_lines["saved_bytes"].yData) == 1.0  # MB, on the leak's scale
    panel.call_box.setValue(1)
    panel.fit_button.click()
    assert 1.9 < panel.chart.view.viewRange()[0][0] < 2.0
    panel.overlay_box.setChecked(True)
    assert panel.chart.overlay_count() == 3
    out = panel.export(tmp_path / "panel.svg")
    assert "31_graph_leak_fixed: saved" in out.read_text()
    panel.drop_reference()
    assert panel.chart.reference_label() == "" and not panel.unpin_button.isEnabled()
    cuda = [MemorySample(t=i, device="cuda:0", allocated=i << 20, reserved=2 * i << 20) for i in range(3)]
    panel.set_run(cuda, "c.py", call_count=0)
    assert panel.note.text() == CUDA_NOTE and panel.chart.gap is not None


def test_axis_labels_fit_a_short_chart(qtbot):
    chart = MemoryChart(theme="light")
    qtbot.addWidget(chart)
    chart.resize(600, 170)  # the memory panel's smallest plot
    chart.set_samples([MemorySample(t=i, device="cpu", rss=(300 + i) << 20, saved_bytes=i << 10) for i in range(5)])
    chart.show()
    qtbot.waitExposed(chart)
    visible = chart.plot_widget.mapToScene(chart.plot_widget.viewport().rect()).boundingRect()
    for side in ("left", "right", "bottom"):
        label = chart.plot.getAxis(side).label
        rect = label.mapRectToScene(label.boundingRect())
        assert visible.contains(rect), (side, rect, visible)
    assert "RSS (MB)" in chart.plot.getAxis("left").labelString()
    assert "saved (KB)" in chart.plot.getAxis("right").labelString()
