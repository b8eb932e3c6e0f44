"""Memory over time with phase bands, call and event markers (pyqtgraph; plain data in, no torch).

On CPU: process RSS (left axis) and saved-tensor bytes (right axis, own scale: a few KB of
activations would be flat next to a 300 MB process). On CUDA: the allocator's ``allocated`` and
``reserved`` (left) with the cache between them shaded, and saved tensors on the right. Each axis
reads in KB, MB or GB (2**10, 2**20, 2**30 bytes, as PyTorch's memory summaries count) chosen by
the largest value shown, never with a "x1e-06" suffix.

Each y axis spans at least ``max(floor, 10 % of its largest value)``, the floor being 16 MB for
process RSS, 1 MB for CUDA allocated / reserved and 1 KB for saved tensors: a 4 KB wiggle on a
308 MB process then looks like the 0.01 % it is, not like the whole height of the plot. The span
is centred on what is visible and never reaches far below zero.

The peak is labelled with what made it: the op that had just run, or, when graphs a list keeps
alive (``kept_bytes``) hold at least half the saved bytes, the statement that keeps them
(``set_lessons``: "kept by losses.append(loss) · line 29"); a notebook's lines read as cell and line.

A finished run opens on its first call: from just before the end of the "starting" band (the
worker starting and importing torch, most of a short run) to the run's end. ``show_whole_run``
(the "Whole run" button, or a double-click) shows it all.

Time zooms and pans with the wheel and drag (pyqtgraph's own); ``fit_call`` shows one iteration,
``set_overlay`` draws every iteration from its own start, and ``set_reference`` puts a second
run (the leak beside its fix) on the same scale.
"""

from __future__ import annotations

import bisect
import html
import re

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QMargins, Qt, QTimer, Signal
from PySide6.QtGui import QPen
from PySide6.QtWidgets import QSizePolicy, QVBoxLayout, QWidget

from core.model.memory import byte_unit, format_bytes
from core.programs.notebook import where as line_where
from widgets.memory.items import (
    LINES as _LINES,
    PHASES,
    CallMarkersItem,
    EventMarksItem,
    PhaseBandsItem,
    PhaseSwatch,
    Series,
    get_field,
)
from widgets.memory.time_axis import TimeToolsMixin
from widgets.theme import Theme, get_theme

MB = float(1 << 20)
REFRESH_MS = 50  # live updates are drawn at most 20 times a second
DASH_PIXELS = 10_000  # longer dashed paths are drawn 1 px wide: Qt takes ~3 us per pixel of wide dashes
_AXIS_NAMES = {"cpu": "RSS", "cuda": "CUDA"}
KB = float(1 << 10)
SPAN_FLOOR = {("cpu", "left"): 16 * MB, ("cuda", "left"): MB, ("cpu", "right"): KB, ("cuda", "right"): KB}
"""The least span of each y axis, in bytes, by (mode, axis): small wiggles look small."""
_LINE = re.compile(r"\bline (\d+)\b")
SPAN_SHARE = 0.10  # ... or this share of the axis's largest value, if more
CUDA_TOOLTIP = (
    "<b>allocated</b>: bytes held by live tensors.<br><b>reserved</b>: bytes the caching allocator "
    "holds from the driver.<br>The shaded gap between them is the <b>cache</b>: freed blocks kept for "
    "reuse. <code>torch.cuda.empty_cache()</code> hands it back, which lowers reserved but not allocated."
)
CPU_TOOLTIP = (
    "<b>process RSS</b>: all memory of the worker process (Python, torch, the script's tensors).<br>"
    "<b>saved tensors</b>: bytes the autograd graphs hold for backward; forward builds them, backward "
    "frees them.<br>On CUDA the chart shows the allocator's allocated and reserved memory instead."
)


class MemoryChart(TimeToolsMixin, QWidget):
    """Memory over the run: lines per device, phase bands, call markers, hover values, click to select."""

    sig_call_selected = Signal(int)
    """The user clicked a time; the index of the backward call running then (or the last one started)."""
    sig_time_clicked = Signal(float)
    """The user clicked a time (seconds since the run started)."""

    def __init__(self, parent: QWidget | None = None, theme: str | None = None):
        super().__init__(parent)
        # The legend gets its own row above the plot, so it never hides data, markers or the readout.
        self.plot_widget = pg.GraphicsLayoutWidget(parent=self)
        QVBoxLayout(self, contentsMargins=QMargins(0, 0, 0, 0)).addWidget(self.plot_widget)
        self.legend = pg.LegendItem(colCount=9, verSpacing=-8, horSpacing=4, frame=False)
        self.legend.setSizePolicy(QSizePolicy.Maximum, QSizePolicy.Fixed)
        self.plot_widget.addItem(self.legend, row=0, col=0)
        self.plot_widget.ci.layout.setAlignment(self.legend, Qt.AlignLeft | Qt.AlignVCenter)
        self.plot_widget.ci.setContentsMargins(4, 2, 4, 4)
        self.plot = self.plot_widget.addPlot(row=1, col=0)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        # Time zooms with the wheel; each y axis fits what is visible. Saved tensors get their
        # own y scale in a second view that sits behind the main one and follows its x range.
        self.view = self.plot.getViewBox()
        self.view2 = pg.ViewBox(enableMenu=False)
        for view, mouse_x in ((self.view, True), (self.view2, False)):
            view.setMouseEnabled(x=mouse_x, y=False)
            view.setAutoVisible(y=True)
        self.view2.setZValue(-10)
        self.plot.scene().addItem(self.view2)
        self.view2.setXLink(self.view)
        self.plot.getAxis("right").linkToView(self.view2)
        self.view.sigResized.connect(self._sync_views)
        self.plot.setLabel("bottom", "time", units="s")
        self.plot.showGrid(y=True, alpha=0.12)
        for name in ("left", "right"):  # units are chosen here (KB/MB/GB), never as an "x1e-06" suffix
            self.plot.getAxis(name).enableAutoSIPrefix(False)
        self.bands, self.markers, self.events = PhaseBandsItem(), CallMarkersItem(), EventMarksItem()
        self.view2.addItem(self.bands, ignoreBounds=True)
        self.view.addItem(self.markers, ignoreBounds=True)
        self.view.addItem(self.events, ignoreBounds=True)
        self.peak_label = pg.TextItem(anchor=(0.5, 1.15))
        self.peak_dot = pg.ScatterPlotItem(size=7)
        self.overlay_item = pg.PlotDataItem(connect="finite")  # every iteration from its own start
        self.overlay_item.setZValue(10)
        self.view.addItem(self.overlay_item)
        self.overlay_item.hide()
        self.gap = None  # the shaded cache between allocated and reserved (CUDA)
        self.cursor = pg.InfiniteLine(angle=90, movable=False)
        self.readout = pg.TextItem(anchor=(0, 0))
        for z, item in ((30, self.cursor), (40, self.readout)):
            item.setZValue(z)
            item.hide()
            self.view.addItem(item, ignoreBounds=True)
        self._lines: dict[str, pg.PlotDataItem] = {}  # by sample field
        self._ref_lines: dict[str, pg.PlotDataItem] = {}  # the reference run's, by sample field
        self._ref: Series | None = None
        self._ref_label = ""
        self._overlay = False
        self.units = {"left": ("MB", 1 << 20), "right": ("MB", 1 << 20)}  # axis -> (name, bytes per unit)
        self._notes: list[pg.InfiniteLine] = []
        self._explicit_calls: list[tuple[float, int]] | None = None
        self._keepers: dict[str, str] = {}  # list name -> "kept by losses.append(loss) · line 29" (set_lessons)
        self._cells: list[dict] = []  # a notebook's cells: lines read "cell 3, line 2"
        self._mode: str | None = None  # "cpu" or "cuda": which lines are shown
        self._dense = False  # a long dashed path in view: drawn 1 px wide
        self._series = Series()
        self._timer = QTimer(self, singleShot=True, interval=REFRESH_MS, timeout=self.flush)
        self._hover_proxy = pg.SignalProxy(self.plot.scene().sigMouseMoved, rateLimit=60, slot=self._on_hover)
        self.plot.scene().sigMouseClicked.connect(self._on_click)
        self._theme = get_theme(theme or ("dark" if self.palette().window().color().lightness() < 128 else "light"))
        self._apply_theme()
        self._set_mode("cpu")
        for view in (self.view, self.view2):
            view.sigRangeChanged.connect(self._update_detail)

    # -- data ----------------------------------------------------------------------------------
    def set_samples(self, samples) -> None:
        """Show ``samples`` (MemorySample objects or their dicts), replacing what was shown."""
        self.clear()
        self.append_samples(samples)
        self.flush()
        self.show_opening()

    def append_samples(self, samples) -> None:
        """Add streamed samples; the chart redraws at most every ``REFRESH_MS``."""
        samples = list(samples)
        if not samples:
            return
        if self._series.n == 0:
            self._set_mode("cuda" if str(get_field(samples[-1], "device", "cpu")).startswith("cuda") else "cpu")
        self._series.append(samples)
        if not self._timer.isActive():
            self._timer.start()

    def set_calls(self, calls) -> None:
        """Backward call starts as ``{"index", "t"}``; without them, calls follow the phases."""
        self._explicit_calls = sorted((float(c["t"]), int(c["index"])) for c in calls)
        self.markers.set_calls(self._calls())

    def add_call(self, index: int, t: float) -> None:
        """One more call start, from a live ``call`` event."""
        self._explicit_calls = self._explicit_calls if self._explicit_calls is not None else []
        bisect.insort(self._explicit_calls, (float(t), int(index)))
        self.markers.set_calls(self._explicit_calls)

    def clear(self) -> None:
        """Forget all samples, calls and notes."""
        self._timer.stop()
        self._series = Series()
        self._explicit_calls = None
        self.clear_markers()
        self.flush()
        self.show_whole_run()  # a live run follows its new samples

    def flush(self) -> None:
        """Draw pending samples now."""
        self._timer.stop()
        s = self._series
        n = s.n
        self._choose_units()
        for key, item in self._lines.items():
            item.setData(s.t[:n], s.cols[key][:n] / self._unit_of(key)[1])
        ref = self._ref
        for key, item in self._ref_lines.items():
            item.setData(ref.t[:ref.n], ref.cols[key][:ref.n] / self._unit_of(key)[1])
        self.bands.set_runs(np.array(s.run_t0), np.array(s.run_t1), np.array(s.run_codes, dtype=np.int8))
        self.markers.set_calls(self._calls())
        self.events.set_events(s.events)
        self._draw_peak()
        if self._overlay:
            self._draw_overlay()
        self._apply_span_floors()
        self._update_detail()

    # -- units and peak ----------------------------------------------------------------------------
    def _axis_of(self, key: str) -> str:
        return next((axis for k, _, axis, _ in _LINES[self._mode] if k == key), "left")

    def _unit_of(self, key: str) -> tuple[str, int]:
        return self.units[self._axis_of(key)]

    def _choose_units(self) -> None:
        """Each axis reads in the unit of the largest value it shows (this run and the reference)."""
        for axis in ("left", "right"):
            keys = [k for k, _, a, _ in _LINES[self._mode] if a == axis]
            top = 0.0
            for series in (self._series, self._ref):
                if series is not None and series.n:
                    top = max([top] + [float(series.cols[k][:series.n].max()) for k in keys])
            unit = byte_unit(top)
            if unit != self.units[axis]:
                self.units[axis] = unit
                self._label_axes()

    def _axis_top(self, axis: str) -> float:
        """The largest value, in bytes, of the lines on ``axis`` (this run and the reference)."""
        keys = [k for k, _, a, _ in _LINES[self._mode] if a == axis]
        top = 0.0
        for series in (self._series, self._ref):
            if series is not None and series.n and keys:
                top = max([top] + [float(series.cols[k][:series.n].max()) for k in keys])
        return top

    def span_floor(self, axis: str) -> float:
        """The least span of ``axis`` ("left" or "right") in bytes: its floor or a share of its top value."""
        return max(SPAN_FLOOR[(self._mode, axis)], SPAN_SHARE * self._axis_top(axis))

    def _apply_span_floors(self) -> None:
        """Give each view its least span in its axis's unit (the overlay draws the measure in the left view)."""
        for view, axis in ((self.view, "left"), (self.view2, "right")):
            if view is self.view and self._overlay:
                axis = self._axis_of(self.measure_key())
            unit, top, floor = self.units[axis][1], self._axis_top(axis), SPAN_FLOOR[(self._mode, axis)]
            # Bytes are never negative: the bottom stays within 10 % of max(floor, top) below zero (the
            # most padding pyqtgraph adds), so a widened span of small values keeps zero near the bottom.
            view.setLimits(minYRange=max(floor, SPAN_SHARE * top) / unit, yMin=-0.10 * max(floor, top) / unit)

    def _label_axes(self) -> None:
        """Short axis titles ("RSS (MB)", "saved (KB)") that fit even a short plot; the legend names the lines."""
        pens = self._line_pens()
        left = "saved" if self._overlay and self._mode == "cpu" else _AXIS_NAMES.get(self._mode, "RSS")
        unit = self.units["right" if self._overlay and self._mode == "cpu" else "left"][0]
        color = pens["dashed" if self._overlay and self._mode == "cpu" else "solid"].color().name()
        self.plot.getAxis("left").setLabel(f"{left} ({unit})", color=color)
        self.plot.getAxis("right").setLabel(f"saved ({self.units['right'][0]})", color=pens["dashed"].color().name())

    def measure_key(self) -> str:
        """The line whose peak is annotated and whose iterations overlay: saved tensors on CPU, allocated on CUDA."""
        return "allocated" if self._mode == "cuda" else "saved_bytes"

    def peak(self) -> tuple[float, int, str] | None:
        """(t, bytes, what ran) at the highest sample of ``measure_key``, or None before any memory is held."""
        s, key = self._series, self.measure_key()
        if not s.n:
            return None
        i = int(np.argmax(s.cols[key][:s.n]))
        if s.cols[key][i] <= 0:
            return None
        return float(s.t[i]), int(s.cols[key][i]), self.blame(i)

    def set_lessons(self, keepers: dict[str, str], cells: list[dict] | None = None) -> None:
        """What the run's trace tells the chart: ``keepers`` names each list that keeps graphs alive
        by the statement that fills it ("kept by losses.append(loss) · line 29"); ``cells``, a
        notebook's, make script lines read "cell 3, line 2"."""
        self._keepers = dict(keepers)
        self._cells = list(cells or [])
        self._draw_peak()

    def blame(self, i: int) -> str:
        """What the memory at sample ``i`` is blamed on: the list keeping graphs alive when its graphs
        hold at least half the saved bytes, else the op that had just run."""
        keeper = self._series.kept_in(i)
        if keeper:
            return self._keepers.get(keeper, f"kept in {keeper}")
        return self.where_text(self._series.where_before(i))

    def where_text(self, where: str) -> str:
        """``where`` with each "line N" told as a notebook's "cell C, line M" (unchanged for a script)."""
        if not self._cells:
            return where
        return _LINE.sub(lambda m: line_where(self._cells, int(m.group(1))), where)

    def _draw_peak(self) -> None:
        found = None if self._overlay else self.peak()
        self.peak_label.setVisible(found is not None)
        self.peak_dot.setVisible(found is not None)
        if found is None:
            return
        t, nbytes, where = found
        key = self.measure_key()
        view = self.view2 if self._axis_of(key) == "right" else self.view
        if self.peak_label.getViewBox() is not view:
            for item in (self.peak_label, self.peak_dot):
                if item.getViewBox() is not None:
                    item.getViewBox().removeItem(item)
                item.setZValue(35)
                view.addItem(item, ignoreBounds=True)
        y = nbytes / self._unit_of(key)[1]
        self.peak_dot.setData([t], [y])
        self._anchor_peak(t)
        self.peak_label.setText(f"peak {format_bytes(nbytes)}" + (f" · {where}" if where else ""))
        self.peak_label.setPos(t, y)

    def _anchor_peak(self, t: float | None = None) -> None:
        """The peak's label reads away from the nearer edge of the time shown (the whole run while following)."""
        s = self._series
        if t is None:
            if not self.peak_dot.isVisible() or self.peak_dot.data.size == 0:
                return
            t = float(self.peak_dot.data["x"][0])
        if not s.n:
            return
        lo, hi = self.view.viewRange()[0] if not self.view.autoRangeEnabled()[0] else (s.t[0], s.t[s.n - 1])
        self.peak_label.setAnchor((1.02 if t > (lo + hi) / 2 else -0.02, -0.1))

    def _calls(self) -> list[tuple[float, int]]:
        return self._explicit_calls if self._explicit_calls is not None else self._series.calls

    # -- markers -------------------------------------------------------------------------------
    def add_marker(self, t: float, text: str, color: str | None = None, left: bool = False,
                   position: float = 0.85) -> pg.InfiniteLine:
        """A labelled vertical line at ``t`` (a note, apart from call markers); ``left`` puts the label
        before the line (a note near the run's end); ``position``: its height, 0 (bottom) to 1."""
        pen = pg.mkPen(color or self._theme.executed_mark, width=2, style=Qt.DotLine)
        opts = dict(position=position, color=self._theme.text, fill=self._theme.overlay_fill,
                    anchors=[(1 if left else 0, 0.5)] * 2)
        line = pg.InfiniteLine(pos=t, angle=90, movable=False, pen=pen, label=text, labelOpts=opts)
        line.setZValue(25)
        self.view.addItem(line, ignoreBounds=True)
        self._notes.append(line)
        return line

    def mark_freed(self, t: float, nbytes: int) -> pg.InfiniteLine:
        """Show that ``nbytes`` of saved tensors were released at ``t`` (stepping)."""
        return self.add_marker(t, f"−{nbytes / MB:.2f} MB" if nbytes >= MB / 10 else f"−{format_bytes(nbytes)}")

    def clear_markers(self) -> None:
        """Remove the notes added by ``add_marker``/``mark_freed``."""
        for line in self._notes:
            self.view.removeItem(line)
        self._notes = []

    # -- queries -------------------------------------------------------------------------------
    def call_at(self, t: float) -> int | None:
        """The backward call running at ``t``, or the last one started before it."""
        calls = self._calls()
        i = bisect.bisect_right(calls, (t, float("inf"))) - 1
        return calls[i][1] if i >= 0 else None

    def line_items(self) -> dict[str, pg.PlotDataItem]:
        """The lines shown, by sample field: allocated/reserved on CUDA, rss/saved_bytes on CPU."""
        return dict(self._lines)

    def band_items(self) -> list[tuple[str, float, float]]:
        """One (phase, start, end) per run of samples in the same phase, as the bands item draws them."""
        return [(PHASES[c], float(t0), float(t1)) for c, t0, t1 in zip(self.bands.codes, self.bands.t0, self.bands.t1)]

    def marker_items(self) -> list[tuple[int, float]]:
        """One (call index, t) per backward call marker."""
        return [(i, float(t)) for i, t in zip(self.markers.indices, self.markers.t0)]

    def note_items(self) -> list[pg.InfiniteLine]:
        return list(self._notes)

    # -- appearance ----------------------------------------------------------------------------
    def set_theme(self, name: str) -> None:
        """Switch to the light, dark or print theme."""
        self._theme = get_theme(name)
        self._apply_theme()
        mode, self._mode = self._mode, None
        self._set_mode(mode or "cpu")

    def theme(self) -> Theme:
        return self._theme

    def _apply_theme(self) -> None:
        t = self._theme
        for line in self._notes:
            line.label.setColor(t.text)
        self.plot_widget.setBackground(t.background)
        for axis in (self.plot.getAxis(name) for name in ("left", "bottom", "right")):
            axis.setPen(t.muted_text)
            axis.setTextPen(t.text)
        self.bands.set_theme(t)
        self.markers.set_theme(t)
        self.events.set_theme(t)
        self.peak_label.setColor(t.text)
        self.peak_label.fill, self.peak_label.border = pg.mkBrush(t.overlay_fill), pg.mkPen(t.overlay_border)
        self.peak_dot.setPen(pg.mkPen(t.text))
        self.peak_dot.setBrush(pg.mkBrush(t.highlight))
        self.overlay_item.setPen(pg.mkPen(t.custom_border if t.name != "print" else t.text, width=1.5))
        self.plot_widget.setToolTip(CUDA_TOOLTIP if self._mode == "cuda" else CPU_TOOLTIP)
        self.cursor.setPen(pg.mkPen(t.muted_text, width=1, style=Qt.DotLine))
        self.readout.fill, self.readout.border = pg.mkBrush(t.overlay_fill), pg.mkPen(t.overlay_border)
        self.readout.setColor(t.text)
        self.legend.setLabelTextColor(t.text)

    def _line_pens(self) -> dict[str, QPen]:
        """Pens by role: the main measure (solid), reserved (CUDA), saved tensors (dashed)."""
        t = self._theme
        solid = pg.mkPen(t.op_border, width=2)
        reserved = pg.mkPen(t.group_border if t.name != "print" else t.muted_text, width=2)
        # Qt strokes dashes wider than 1 px slowly (seconds for a dense zigzag): thin them when dense.
        dashed = pg.mkPen(t.custom_border if t.name != "print" else t.text, width=1 if self._dense else 2,
                          style=Qt.DashLine)
        return {"solid": solid, "reserved": reserved, "dashed": dashed}

    def _update_detail(self, *_) -> None:
        """Thin the dashed line while its visible path is long (a dense zigzag)."""
        key = "saved_bytes"
        item = self._lines.get(key)
        s = self._series
        view = item.getViewBox() if item is not None else None
        if view is None or s.n < 2:
            return
        (x0, x1), (y0, y1) = view.viewRange()
        lo, hi = np.searchsorted(s.t[:s.n], (x0, x1))
        unit = self._unit_of(key)[1]
        rise = np.abs(np.diff(s.cols[key][lo:hi + 1])).sum() / unit * view.height() / max(y1 - y0, 1e-9)
        dense = bool(rise + view.width() > DASH_PIXELS)
        if dense != self._dense:
            self._dense = dense
            item.setPen(self._line_pens()["dashed"])

    def _set_mode(self, mode: str) -> None:
        if mode == self._mode:
            return
        self._mode = mode
        self._drop_ref_lines()
        for item in self._lines.values():
            item.getViewBox().removeItem(item)
        if self.gap is not None:
            self.view.removeItem(self.gap)
            self.gap = None
        self._lines = {}
        self.legend.clear()
        pens = self._line_pens()
        for key, label, axis, role in _LINES[mode]:
            item = pg.PlotDataItem(pen=pens[role], name=label, clipToView=True, autoDownsample=True,
                                   downsampleMethod="peak")
            (self.view2 if axis == "right" else self.view).addItem(item)
            self._lines[key] = item
            self.legend.addItem(item, label)
        if mode == "cuda":
            # The caching allocator's cache: reserved but not allocated, shaded between the two lines.
            color = pens["reserved"].color()
            color.setAlpha(60)
            self.gap = pg.FillBetweenItem(self._lines["allocated"], self._lines["reserved"], brush=pg.mkBrush(color))
            self.gap.setZValue(-20)
            self.view.addItem(self.gap)
            self.legend.addItem(pg.BarGraphItem(x=[0], height=[1], width=1, brush=pg.mkBrush(color),
                                                pen=pg.mkPen(None)), "cache")
        self._add_ref_lines()
        for phase in PHASES:
            self.legend.addItem(PhaseSwatch(self.bands, phase), phase)
        self.plot.showAxis("right", not self._overlay)
        self.plot_widget.setToolTip(CUDA_TOOLTIP if mode == "cuda" else CPU_TOOLTIP)
        self._label_axes()
        self.flush()

    def _sync_views(self) -> None:
        self.view2.setGeometry(self.view.sceneBoundingRect())
        self.view2.linkedViewChanged(self.view, self.view2.XAxis)

    # -- mouse ---------------------------------------------------------------------------------
    def leaveEvent(self, event) -> None:
        self._on_hover((None,))
        super().leaveEvent(event)

    def _on_hover(self, args) -> None:
        pos, s = args[0], self._series
        if pos is None or not s.n or not self.view.sceneBoundingRect().contains(pos):
            self.cursor.hide()
            self.readout.hide()
            return
        p = self.view.mapSceneToView(pos)
        i = max(int(np.searchsorted(s.t[:s.n], p.x(), "right")) - 1, 0)  # the sample in effect then
        self.cursor.setPos(p.x())
        self.cursor.show()
        self.readout.setHtml(self.readout_html(i))
        vr = self.view.viewRect()
        right_half = p.x() > vr.center().x()
        self.readout.setAnchor((1.0 if right_half else 0.0, 0.0))
        gap = (-6 if right_half else 6) * vr.width() / max(self.view.width(), 1)  # 6 px from the cursor
        self.readout.setPos(p.x() + gap, vr.bottom())
        self.readout.show()

    def readout_html(self, i: int) -> str:
        """The hover text for sample ``i``: time, phase and call, then each line's value."""
        s = self._series
        phase = PHASES[s.codes[i]]
        call = self.call_at(float(s.t[i])) if phase == "backward" else None
        rows = [f"<b>{s.t[i]:.3f} s</b> · {phase}" + (f" #{call}" if call is not None else "")]
        pens = self._line_pens()
        for key, label, axis, role in _LINES[self._mode]:
            unit, size = self.units[axis]
            rows.append(f"<span style='color:{pens[role].color().name()}'>{'╍' if role == 'dashed' else '━'}"
                        f"</span> {label}: {s.cols[key][i] / size:,.1f} {unit}")
        if self._mode == "cuda":
            unit, size = self.units["left"]
            rows.append(f"cache (reserved − allocated): {(s.cols['reserved'][i] - s.cols['allocated'][i]) / size:,.1f} "
                        f"{unit}")
            if s.cols["max_allocated"][i]:
                rows.append(f"peak allocated: {s.cols['max_allocated'][i] / size:,.1f} {unit}")
            if s.cols["rss"][i]:
                rows.append(f"host RSS: {format_bytes(int(s.cols['rss'][i]))}")
        if mark := next((k for t, k in s.events if t == s.t[i]), None):
            rows.append(f"<b>{mark}</b>")
        if keeper := s.kept_in(i):
            rows.append(html.escape(self._keepers.get(keeper, f"kept in {keeper}")))
        if where := self.where_text(s.where_before(i)):
            rows.append(f"after {html.escape(where)}")
        return f"<div style='font-size:8pt'>{'<br>'.join(rows)}</div>"

    def _on_click(self, ev) -> None:
        pos = ev.scenePos()
        if ev.button() != Qt.MouseButton.LeftButton or not self.view.sceneBoundingRect().contains(pos):
            return
        if ev.double():  # back to the whole run, following new samples again
            self.show_whole_run()
            return
        t = float(self.view.mapSceneToView(pos).x())
        self.sig_time_clicked.emit(t)
        if (call := self.call_at(t)) is not None:
            self.sig_call_selected.emit(call)
