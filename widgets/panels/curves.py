"""The curves of a training loop beside the Calls list: the loss, each small leaf's value and grad,
and ‖param‖ / ‖grad‖ of the big ones, over the backward calls (``core.model.loop_curves``).

A list of the series with checkboxes (the loss and the leaves' values ticked at first) beside one
plot per kind of series, stacked on one call axis: loss, values, gradients, norms. Each plot has
its legend; the loss and norms can take a log y axis; hovering reads every ticked series at the
nearest call. ``export_curves`` writes the plots as PNG or SVG in the print theme, the way the
memory chart is exported (``widgets.memory.export``): the scene as Qt paints it, into a
``QSvgGenerator`` or a high-density image, so the file shows what the screen shows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyqtgraph as pg
import shiboken6
from PySide6.QtCore import QMargins, QRectF, Qt, Signal
from PySide6.QtGui import QAction, QColor, QIcon, QPixmap
from PySide6.QtWidgets import (QApplication, QCheckBox, QFileDialog, QHBoxLayout, QLabel, QListWidget,
                               QListWidgetItem, QMessageBox, QSizePolicy, QSplitter, QStackedWidget, QToolButton, QVBoxLayout,
                               QWidget)

from core.model.loop_curves import GROUP_TITLES, GROUPS, LOG_GROUPS, LoopCurves, Series, loop_curves, value_text
from core.model.trace import Trace
from widgets.export.graph_export import ensure_app
from widgets.export.scene_file import write_scene
from widgets.theme import Theme, get_theme

# Okabe-Ito, colour-blind safe, readable on white paper and on the dark theme (its yellow left out).
PALETTE = ["#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#8c564b", "#7f7f7f"]
EMPTY_TEXT = "No loss or small leaves recorded in this trace"
FORMATS = ("png", "svg")
MARKER_POINTS = 60  # series with at most this many points draw a dot at each call


class CurvesExportError(ValueError):
    """A curves export that cannot be made; the message says why."""


def _base(series: Series) -> str:
    """What a series' colour follows: ``w[1]`` and ``w.grad[1]`` share one, ``‖fc.weight‖`` and its grad too."""
    return series.key.strip("‖").replace(".grad", "")


def _plot_ys(series: Series, log: bool) -> np.ndarray:
    """The values as drawn: a gap where a value is not finite (the readout still says nan / inf) and,
    on a log axis, where it is not positive."""
    ys = np.array(series.ys, dtype=float)
    bad = ~np.isfinite(ys)
    if log:
        bad |= ys <= 0
    ys[bad] = np.nan
    return ys


class CurvesChart(QWidget):
    """The stacked plots of the ticked series."""

    def __init__(self, parent: QWidget | None = None, theme: str | None = None):
        super().__init__(parent)
        self.plot_widget = pg.GraphicsLayoutWidget(parent=self)
        QVBoxLayout(self, contentsMargins=QMargins(0, 0, 0, 0)).addWidget(self.plot_widget)
        self.plot_widget.ci.setContentsMargins(4, 4, 8, 4)
        self.curves = LoopCurves(series=[], calls=[])
        self.shown: set[str] = set()
        self.log_y = False
        self.current: int | None = None  # the call the window shows, marked in every plot
        self.plots: dict[str, pg.PlotItem] = {}
        self.items: dict[str, pg.PlotDataItem] = {}  # the ticked series' lines, by key
        self.colors: dict[str, str] = {}
        self._cursors: list[pg.InfiniteLine] = []  # follow the hover
        self._marks: list[pg.InfiniteLine] = []  # the call shown
        self._readout: pg.TextItem | None = None
        self._syncing = False
        self._hover = pg.SignalProxy(self.plot_widget.scene().sigMouseMoved, rateLimit=60, slot=self._on_hover)
        self._theme = get_theme(theme or ("dark" if self.palette().window().color().lightness() < 128 else "light"))

    def theme(self) -> Theme:
        return self._theme

    def set_theme(self, name: str) -> None:
        self._theme = get_theme(name)
        self.rebuild()

    def set_curves(self, curves: LoopCurves) -> None:
        self.curves = curves
        self.shown = {s.key for s in curves.series if s.shown}
        bases = list(dict.fromkeys(_base(s) for s in curves.series if s.leaf is not None))
        self.colors = {b: PALETTE[i % len(PALETTE)] for i, b in enumerate(bases)}
        self.rebuild()

    def set_shown(self, key: str, shown: bool) -> None:
        (self.shown.add if shown else self.shown.discard)(key)
        self.rebuild()

    def set_log_y(self, on: bool) -> None:
        self.log_y = on
        self.rebuild()

    def mark_call(self, index: int | None) -> None:
        """Mark the call the window shows in every plot (no mark when it recorded nothing)."""
        self.current = index
        for mark in self._marks:
            mark.setPos(index if index is not None else 0)
            mark.setVisible(index is not None and index in self.curves.calls)

    def color_of(self, series: Series) -> str:
        return self._theme.text if series.leaf is None else self.colors.get(_base(series), PALETTE[0])

    def rebuild(self) -> None:
        """Draw the ticked series again: one plot per kind that has one, linked on the call axis."""
        t = self._theme
        self.plot_widget.clear()
        self.plot_widget.setBackground(t.background)
        self.plots, self.items, self._cursors, self._marks, self._readout = {}, {}, [], [], None
        groups = [g for g in GROUPS if any(s.key in self.shown for s in self.curves.in_group(g))]
        for row, group in enumerate(groups):
            # Each plot's legend is a row of its own above it: it never hides a curve.
            legend = pg.LegendItem(colCount=4, verSpacing=-6, horSpacing=6, frame=False, labelTextColor=t.text)
            legend.setSizePolicy(QSizePolicy.Policy.Maximum, QSizePolicy.Policy.Fixed)
            self.plot_widget.addItem(legend, row=2 * row, col=0)
            self.plot_widget.ci.layout.setAlignment(legend, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
            plot = self.plot_widget.addPlot(row=2 * row + 1, col=0)
            plot.vb.setDefaultPadding(0.02)
            plot.setMenuEnabled(False)
            plot.hideButtons()
            plot.showGrid(x=True, y=True, alpha=0.15)
            for side in ("left", "bottom"):
                axis = plot.getAxis(side)
                axis.setPen(t.muted_text)
                axis.setTextPen(t.text)
            plot.getAxis("left").setWidth(66)
            plot.getAxis("left").enableAutoSIPrefix(False)  # "loss (x1e+12)" on a log axis says nothing
            plot.setLabel("left", GROUP_TITLES[group], color=t.text)
            log = self.log_y and group in LOG_GROUPS
            plot.setLogMode(y=log)
            for s in self.curves.in_group(group):
                if s.key not in self.shown:
                    continue
                color = self.color_of(s)
                dashed = group == "norm" and s.key.endswith(".grad‖")
                pen = pg.mkPen(color, width=2, style=Qt.PenStyle.DashLine if dashed else Qt.PenStyle.SolidLine)
                dots = dict(symbol="o", symbolSize=4, symbolPen=None, symbolBrush=color) \
                    if len(s.xs) <= MARKER_POINTS else {}
                self.items[s.key] = item = plot.plot(s.xs, _plot_ys(s, log), pen=pen, connect="finite", antialias=True,
                                                     **dots)
                legend.addItem(item, s.key)
            # One call range for every plot, kept in step by hand: pyqtgraph's setXLink maps ranges
            # through the views' screen geometry, which is stale until the layout has run.
            plot.vb.setMouseEnabled(x=True, y=False)
            plot.vb.setAutoVisible(y=True)
            if self.curves.calls:
                plot.setXRange(self.curves.calls[0], self.curves.calls[-1], padding=0.02)
            plot.vb.sigXRangeChanged.connect(self._sync_x)
            cursor = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen(t.muted_text, width=1, style=Qt.DotLine))
            cursor.hide()
            plot.addItem(cursor, ignoreBounds=True)
            self._cursors.append(cursor)
            mark = pg.InfiniteLine(0, angle=90, movable=False, pen=pg.mkPen(t.highlight, width=1.5))
            plot.addItem(mark, ignoreBounds=True)
            self._marks.append(mark)
            self.plots[group] = plot
        if groups:
            last = self.plots[groups[-1]]
            last.setLabel("bottom", "backward call", color=t.text)
            for g in groups[:-1]:
                self.plots[g].getAxis("bottom").setStyle(showValues=False)
        self.mark_call(self.current)
        # Emptying the layout shrank it to its size hint: give it the view's rectangle back.
        self.plot_widget.ci.setGeometry(self.plot_widget.range)

    def _sync_x(self, view, x_range) -> None:
        """A plot's call range moved (zoom, pan): the others follow."""
        if self._syncing:
            return
        self._syncing = True
        try:
            for plot in self.plots.values():
                if plot.vb is not view:
                    plot.vb.setXRange(*x_range, padding=0)
        finally:
            self._syncing = False

    # -- hover -------------------------------------------------------------------------------
    def readout(self, group: str, x: float) -> tuple[int, str] | None:
        """The nearest call to ``x`` and what the ticked series of plot ``group`` read there."""
        shown = [s for s in self.curves.in_group(group) if s.key in self.shown and s.xs]
        if not shown:
            return None
        call = min({c for s in shown for c in s.xs}, key=lambda c: abs(c - x))
        lines = [f"call #{call}"]
        for s in shown:
            if call in s.xs:
                lines.append(f"{s.key} = {value_text(s.ys[s.xs.index(call)])}")
        return call, "\n".join(lines)

    def _on_hover(self, event) -> None:
        pos = event[0]
        for group, plot in self.plots.items():
            if plot.sceneBoundingRect().contains(pos):
                found = self.readout(group, plot.vb.mapSceneToView(pos).x())
                if found is not None:
                    self._show_readout(plot, *found)
                return
        self._hide_readout()

    def _show_readout(self, plot: pg.PlotItem, call: int, text: str) -> None:
        for cursor in self._cursors:
            cursor.setPos(call)
            cursor.show()
        if self._readout is not None and self._readout.getViewBox() is not plot.vb:
            self._readout.getViewBox().removeItem(self._readout)
            self._readout = None
        if self._readout is None:
            t = self._theme
            self._readout = pg.TextItem(color=t.text, fill=pg.mkBrush(t.overlay_fill), border=pg.mkPen(t.overlay_border))
            self._readout.setZValue(60)
            plot.addItem(self._readout, ignoreBounds=True)
        (x0, x1), (y0, y1) = plot.vb.viewRange()
        right = call > (x0 + x1) / 2  # the text sits on the side with room
        self._readout.setAnchor((1.05, 0) if right else (-0.05, 0))
        self._readout.setText(text)
        self._readout.setPos(call, y1)
        self._readout.show()

    def _hide_readout(self) -> None:
        for cursor in self._cursors:
            cursor.hide()
        if self._readout is not None:
            self._readout.hide()


class CurvesPanel(QWidget):
    """The Curves tab: the series to tick, the plots, a log-y toggle and "Export Curves…"."""

    sig_exported = Signal(str)
    """The curves were written to this file."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.curves = LoopCurves(series=[], calls=[])
        self.stem = "curves"
        self.summary = QLabel("")
        self.log_box = QCheckBox("log y")
        self.log_box.setToolTip("A log scale for the loss and the norms")
        self.log_box.toggled.connect(lambda on: self.chart.set_log_y(on))
        self.export_action = QAction("Export Curves…", self)
        self.export_action.setToolTip("Write the curves as PNG or SVG, in the print theme")
        self.export_action.triggered.connect(self.export_dialog)
        export_button = QToolButton(self)
        export_button.setDefaultAction(self.export_action)
        # The summary wraps on its own row: the tab shares a narrow dock with the Calls list.
        self.summary.setWordWrap(True)
        bar = QHBoxLayout()
        bar.setContentsMargins(4, 2, 4, 0)
        bar.addWidget(self.summary, 1)
        bar.addWidget(self.log_box, 0, Qt.AlignmentFlag.AlignTop)
        bar.addWidget(export_button, 0, Qt.AlignmentFlag.AlignTop)
        self.series_list = QListWidget(self)
        self.series_list.itemChanged.connect(self._on_item_changed)
        self.chart = CurvesChart(self)
        # Plots above, the series under them: the panel shares a narrow dock with the Calls list.
        split = QSplitter(Qt.Orientation.Vertical, self)
        split.addWidget(self.chart)
        split.addWidget(self.series_list)
        split.setStretchFactor(0, 1)
        split.setSizes([400, 110])
        self.empty = QLabel(EMPTY_TEXT, alignment=Qt.AlignmentFlag.AlignCenter)
        self.empty.setWordWrap(True)
        self.stack = QStackedWidget(self)
        self.stack.addWidget(self.empty)
        self.stack.addWidget(split)
        layout = QVBoxLayout(self, contentsMargins=QMargins(0, 0, 0, 0), spacing=0)
        layout.addLayout(bar)
        layout.addWidget(self.stack, 1)
        self.export_action.setEnabled(False)

    def set_trace(self, trace: Trace | None) -> None:
        self.stem = Path(trace.script).stem if trace is not None and trace.script else "curves"
        self.set_curves(loop_curves(trace) if trace is not None else LoopCurves(series=[], calls=[]))

    def set_curves(self, curves: LoopCurves) -> None:
        self.curves = curves
        self.chart.set_curves(curves)
        self.series_list.blockSignals(True)
        self.series_list.clear()
        for s in curves.series:
            item = QListWidgetItem(s.key)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Checked if s.key in self.chart.shown else Qt.CheckState.Unchecked)
            item.setData(Qt.ItemDataRole.UserRole, s.key)
            item.setToolTip(f"{GROUP_TITLES[s.group]}: {len(s.xs)} calls")
            swatch = QPixmap(10, 10)
            swatch.fill(QColor(self.chart.color_of(s)))
            item.setIcon(QIcon(swatch))
            self.series_list.addItem(item)
        self.series_list.blockSignals(False)
        self.stack.setCurrentIndex(1 if curves.series else 0)
        self.export_action.setEnabled(bool(curves.series))
        self.summary.setText(summary_text(curves))

    def mark_call(self, index: int | None) -> None:
        self.chart.mark_call(index)

    def set_shown(self, key: str, shown: bool) -> None:
        """Tick or untick a series, as its checkbox does."""
        for i in range(self.series_list.count()):
            item = self.series_list.item(i)
            if item.data(Qt.ItemDataRole.UserRole) == key:
                item.setCheckState(Qt.CheckState.Checked if shown else Qt.CheckState.Unchecked)

    def _on_item_changed(self, item: QListWidgetItem) -> None:
        self.chart.set_shown(item.data(Qt.ItemDataRole.UserRole), item.checkState() == Qt.CheckState.Checked)

    def export(self, path, theme: str = "print") -> Path:
        """Write the ticked curves to ``path`` (.png or .svg), in the print theme by default."""
        return export_curves(self.chart, path, theme=theme)

    def export_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export Curves", f"{self.stem}-curves.png",
                                              "PNG (*.png);;SVG (*.svg)")
        if not path:
            return
        try:
            self.export(path)
        except (OSError, ValueError) as exc:
            QMessageBox.warning(self, "Export failed", str(exc))
            return
        self.sig_exported.emit(str(path))


def summary_text(curves: LoopCurves) -> str:
    """``loss 2.378 → 0.01049 over 200 calls`` (or the number of calls and series)."""
    loss = curves.get("loss")
    if loss is not None and loss.ys:
        return f"loss {value_text(loss.ys[0])} → {value_text(loss.ys[-1])} over {len(curves.calls)} calls"
    if curves.series:
        return f"{len(curves.series)} series over {len(curves.calls)} calls"
    return ""


def export_size(chart: CurvesChart, width: int = 900) -> tuple[int, int]:
    """A height that gives each plot shown room for its legend and ticks."""
    return width, 70 + 210 * max(1, len(chart.plots))


def export_curves(chart: CurvesChart, path, *, theme: str | None = "print", size: tuple[int, int] | None = None,
                  scale: float = 2.0) -> Path:
    """Write ``chart`` to ``path`` (.png or .svg) at ``size`` logical pixels; restores its theme and geometry."""
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise CurvesExportError(f"{path}: unknown curves export format {fmt or '(none)'!r}; use .png or .svg")
    if not chart.items:
        raise CurvesExportError(f"{path}: no curve is shown")
    old_theme, current = chart.theme().name, chart.current
    layout = chart.plot_widget.ci
    old_geometry = layout.geometry()
    try:
        if theme:
            chart.set_theme(theme)
        chart.mark_call(None)  # the call the window shows is the screen's business, not the page's
        size = size or export_size(chart)
        # Laid out at the export's size whether the chart is on screen or not (a hidden view gets
        # no resize events): the scene is rendered from that rectangle.
        source = QRectF(0, 0, *size)
        layout.setGeometry(source)
        layout.layout.activate()
        QApplication.processEvents()
        path.parent.mkdir(parents=True, exist_ok=True)
        background = QColor(chart.theme().background)
        scene = chart.plot_widget.scene()
        if not write_scene(scene, path, fmt, size, source, background, scale=scale, title="curves of the loop",
                           description="loss and leaves per backward call, exported by Backprop Studio"):
            raise CurvesExportError(f"{path}: could not write the image")
    finally:
        if theme:
            chart.set_theme(old_theme)
        chart.mark_call(current)
        chart.plot_widget.ci.setGeometry(old_geometry)
    return path


def export_trace_curves(trace: Trace, path, *, theme: str = "print", keys: list[str] | None = None) -> Path:
    """Headless: the curves of ``trace`` (the default series, or ``keys``) written to ``path``."""
    curves = loop_curves(trace)
    if not curves.series:
        raise CurvesExportError(f"{path}: the run recorded no loss and no small leaf to draw")
    ensure_app()
    chart = CurvesChart(theme=theme)
    try:
        chart.set_curves(curves)
        if keys is not None:
            unknown = [k for k in keys if curves.get(k) is None]
            if unknown:
                raise CurvesExportError(f"no series {', '.join(unknown)}; the run has "
                                        f"{', '.join(s.key for s in curves.series)}")
            chart.shown = set(keys)
            chart.rebuild()
        return export_curves(chart, path, theme=theme)
    finally:
        # Destroyed now, not at interpreter exit after the QApplication (which can crash).
        shiboken6.delete(chart)

