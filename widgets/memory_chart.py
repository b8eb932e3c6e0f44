"""Memory over time with phase bands and backward-call markers (pyqtgraph; plain data in, no torch).

On CPU: process RSS (left axis) and saved-tensor bytes (right axis, own scale: a few MB of
activations would be flat next to a 300 MB process); on CUDA: the allocator's ``allocated`` and
``reserved``. MB means 2**20 bytes, as in PyTorch's memory summaries. Bands show the phase and a
dashed line marks each backward call start; each is one item that draws only the visible pixel
columns, so a loop of ten thousand calls still pans smoothly, with labels only where they fit.
"""

from __future__ import annotations

import bisect
from functools import lru_cache

import numpy as np
import pyqtgraph as pg
from pyqtgraph.graphicsItems.LegendItem import ItemSample
from PySide6.QtCore import QLineF, QMargins, QPointF, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetricsF, QImage, QPen
from PySide6.QtWidgets import QSizePolicy, QVBoxLayout, QWidget

from widgets.theme import Theme, get_theme

MB = float(1 << 20)
PHASES = ("forward", "backward", "between")
REFRESH_MS = 50  # live updates are drawn at most 20 times a second
DASH_PIXELS = 10_000  # longer dashed paths are drawn 1 px wide: Qt takes ~3 us per pixel of wide dashes
_FIELDS = ("allocated", "reserved", "rss", "saved_bytes", "max_allocated")
_LINES = {
    "cuda": (("allocated", "allocated"), ("reserved", "reserved")),
    "cpu": (("rss", "process RSS"), ("saved_bytes", "saved tensors")),
}


def _get(sample, key, default=0):
    return sample.get(key, default) if isinstance(sample, dict) else getattr(sample, key, default)


@lru_cache(maxsize=8)
def phase_brushes(theme: Theme) -> dict[str, QBrush]:
    """Band fills: distinct hues, and distinct grey levels once printed; the print theme has greys only."""
    if theme.name == "print":
        return {"forward": QBrush(QColor(0, 0, 0, 18)), "backward": QBrush(QColor(0, 0, 0, 58)),
                "between": QBrush(QColor(0, 0, 0, 0))}
    alpha = 56 if theme.name == "dark" else 46
    colors = {"forward": (theme.leaf_border, alpha), "backward": (theme.current, alpha),
              "between": (theme.other_border, alpha // 2)}
    return {phase: QBrush(QColor(*QColor(c).getRgb()[:3], a)) for phase, (c, a) in colors.items()}


class _ViewSpanItem(pg.GraphicsObject):
    """Spans the visible height of its view and paints in device pixels, only what is visible."""

    def __init__(self, z: float):
        super().__init__()
        self.theme = get_theme("light")
        self.t0 = self.t1 = np.zeros(0)
        self.setZValue(z)

    def boundingRect(self) -> QRectF:
        vr = self.viewRect()
        return QRectF(vr) if vr is not None and len(self.t0) else QRectF()

    def viewTransformChanged(self):
        super().viewTransformChanged()
        self.changed()

    def changed(self):
        self.prepareGeometryChange()
        self.update()

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.update()

    def _begin(self, painter):
        """Switch ``painter`` to pixels; returns the visible slice, the x mapping and the pixel top/bottom."""
        vr = self.viewRect()
        if vr is None or not len(self.t0):
            return None
        tr = painter.transform()
        lo = int(np.searchsorted(self.t1, vr.left(), "left"))
        hi = int(np.searchsorted(self.t0, vr.right(), "right"))
        top, bottom = sorted((tr.map(QPointF(0, vr.bottom())).y(), tr.map(QPointF(0, vr.top())).y()))
        left, right = sorted((tr.map(QPointF(vr.left(), 0)).x(), tr.map(QPointF(vr.right(), 0)).x()))
        painter.resetTransform()
        font = QFont(self.theme.font_family)
        font.setPixelSize(self.theme.small_font_px + 1)
        painter.setFont(font)
        return slice(lo, hi), tr.m11(), tr.dx(), QRectF(left, top, right - left, bottom - top), QFontMetricsF(font)


class PhaseBandsItem(_ViewSpanItem):
    """One band per run of samples in the same phase, labelled where the band is wide enough."""

    def __init__(self):
        super().__init__(z=-100)
        self.codes = np.zeros(0, dtype=np.int8)
        self.hidden: set[str] = set()

    def set_runs(self, t0: np.ndarray, t1: np.ndarray, codes: np.ndarray) -> None:
        self.t0, self.t1, self.codes = t0, t1, codes
        self.changed()

    def paint(self, p, *args):
        if (view := self._begin(p)) is None:
            return
        sl, a, b, px, fm = view
        # Each pixel column takes the phase at its centre, drawn as a one-row image stretched to
        # the plot's height: thin tall rectangles cost a blend per row, this costs one per column.
        first = np.floor(px.left())
        width = int(np.ceil(px.right()) - first)
        if width > 0:
            centres = (first + np.arange(width) + 0.5 - b) / a
            run = np.clip(np.searchsorted(self.t0, centres, "right") - 1, 0, len(self.t0) - 1)
            inside = (centres >= self.t0[run]) & (centres <= self.t1[run])
            brushes = phase_brushes(self.theme)  # ARGB per phase code, then "no band"
            lut = np.array([0 if ph in self.hidden else brushes[ph].color().rgba() for ph in PHASES] + [0], np.uint32)
            row = np.ascontiguousarray(lut[np.where(inside, self.codes[run], len(PHASES))])
            strip = QImage(row.data, width, 1, QImage.Format_ARGB32)
            p.drawImage(QRectF(first, px.top(), width, px.height()), strip)
        x0 = np.maximum(np.rint(a * self.t0[sl] + b), px.left())  # label the visible part of a band
        x1 = np.minimum(np.rint(a * self.t1[sl] + b), px.right())
        codes = self.codes[sl]
        p.setPen(QColor(self.theme.muted_text))
        room = np.array([fm.horizontalAdvance(ph) + 8 for ph in PHASES])
        for i in np.nonzero((x1 - x0) >= room[codes])[0][:200]:
            if PHASES[codes[i]] not in self.hidden:
                p.drawText(QPointF(x0[i] + 4, px.bottom() - 5), PHASES[codes[i]])


class CallMarkersItem(_ViewSpanItem):
    """A dashed vertical line at each backward call start, labelled "#k" where labels fit."""

    def __init__(self):
        super().__init__(z=-5)  # under the lines
        self.indices: list[int] = []

    def set_calls(self, calls: list[tuple[float, int]]) -> None:
        self.t0 = self.t1 = np.array([t for t, _ in calls], dtype=float)
        self.indices = [i for _, i in calls]
        self.changed()

    def paint(self, p, *args):
        if (view := self._begin(p)) is None:
            return
        sl, a, b, px, fm = view
        xs = np.rint(a * self.t0[sl] + b) + 0.5
        labels, right = [], -1e9
        for x, index in zip(xs[:2000], self.indices[sl][:2000]):
            if x + 3 > right:  # skip labels that would overlap the previous one
                labels.append((x, f"#{index}"))
                right = x + 9 + fm.horizontalAdvance(labels[-1][1])
        lines = np.unique(xs)
        if len(lines) * 4 > px.width():  # a line every few pixels would hide the data: labelled ones only
            lines = [x for x, _ in labels]
        p.setPen(QPen(QColor(self.theme.muted_text), 0, Qt.DashLine))  # 0: one pixel, cosmetic
        p.drawLines([QLineF(x, px.top(), x, px.bottom()) for x in lines])
        p.setPen(QColor(self.theme.text))
        for x, text in labels:
            p.drawText(QPointF(x + 3, px.top() + fm.ascent() + 2), text)


class _PhaseSwatch(ItemSample):
    """A legend swatch for one phase; clicking it hides or shows that phase's bands."""

    def __init__(self, bands: PhaseBandsItem, phase: str):
        super().__init__(bands)
        self.bands, self.phase = bands, phase

    def paint(self, p, *args):
        p.setPen(QPen(QColor(self.bands.theme.muted_text), 0))
        hidden = self.phase in self.bands.hidden
        p.setBrush(Qt.NoBrush if hidden else phase_brushes(self.bands.theme)[self.phase])
        p.drawRect(QRectF(3, 5, 14, 12))

    def mouseClickEvent(self, event):
        if event.button() == Qt.MouseButton.LeftButton:
            self.bands.hidden ^= {self.phase}
            self.bands.update()
            self.update()
        event.accept()


class _Series:
    """Growable numpy columns of the samples, and the phase runs derived from them."""

    def __init__(self):
        self.n, self.t, self.codes = 0, np.zeros(256), np.zeros(256, dtype=np.int8)
        self.cols = {f: np.zeros(256) for f in _FIELDS}
        self.run_t0: list[float] = []  # each run of samples in one phase: start, end, phase code
        self.run_t1: list[float] = []
        self.run_codes: list[int] = []
        self.calls: list[tuple[float, int]] = []  # derived from runs entering "backward"

    def append(self, samples) -> None:
        m = len(samples)
        if self.n + m > len(self.t):
            cap = max(2 * len(self.t), self.n + m)
            self.t, self.codes = np.resize(self.t, cap), np.resize(self.codes, cap)
            self.cols = {f: np.resize(c, cap) for f, c in self.cols.items()}
        sl = slice(self.n, self.n + m)
        self.t[sl] = [float(_get(s, "t")) for s in samples]
        for f in _FIELDS:
            self.cols[f][sl] = [_get(s, f) for s in samples]
        codes = [PHASES.index(ph) if (ph := _get(s, "phase", "forward")) in PHASES else 2 for s in samples]
        self.codes[sl] = codes
        for t, code in zip(self.t[sl].tolist(), codes):
            if self.run_codes:
                self.run_t1[-1] = t  # a run ends where the next begins, so bands tile the time axis
                if self.run_codes[-1] == code:
                    continue
            self.run_t0.append(t)
            self.run_t1.append(t)
            self.run_codes.append(code)
            if code == 1:
                self.calls.append((t, len(self.calls)))
        self.n += m


class MemoryChart(QWidget):
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
        self.legend = pg.LegendItem(colCount=5, verSpacing=-8, horSpacing=4, frame=False)
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
        self.bands, self.markers = PhaseBandsItem(), CallMarkersItem()
        self.view2.addItem(self.bands, ignoreBounds=True)
        self.view.addItem(self.markers, ignoreBounds=True)
        self.cursor = pg.InfiniteLine(angle=90, movable=False)
        self.readout = pg.TextItem(anchor=(0, 0))
        for z, item in ((30, self.cursor), (40, self.readout)):
            item.setZValue(z)
            item.hide()
            self.view.addItem(item, ignoreBounds=True)
        self._lines: dict[str, pg.PlotDataItem] = {}  # by sample field
        self._notes: list[pg.InfiniteLine] = []
        self._explicit_calls: list[tuple[float, int]] | None = None
        self._mode: str | None = None  # "cpu" or "cuda": which lines are shown
        self._dense = False  # a long dashed path in view: drawn 1 px wide
        self._series = _Series()
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

    def append_samples(self, samples) -> None:
        """Add streamed samples; the chart redraws at most every ``REFRESH_MS``."""
        samples = list(samples)
        if not samples:
            return
        if self._series.n == 0:
            self._set_mode("cuda" if str(_get(samples[-1], "device", "cpu")).startswith("cuda") else "cpu")
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
        self._series = _Series()
        self._explicit_calls = None
        self.clear_markers()
        self.flush()

    def flush(self) -> None:
        """Draw pending samples now."""
        self._timer.stop()
        s = self._series
        n = s.n
        for key, item in self._lines.items():
            item.setData(s.t[:n], s.cols[key][:n] / MB)
        self.bands.set_runs(np.array(s.run_t0), np.array(s.run_t1), np.array(s.run_codes, dtype=np.int8))
        self.markers.set_calls(self._calls())
        self._update_detail()

    def _calls(self) -> list[tuple[float, int]]:
        return self._explicit_calls if self._explicit_calls is not None else self._series.calls

    # -- markers -------------------------------------------------------------------------------
    def add_marker(self, t: float, text: str, color: str | None = None) -> pg.InfiniteLine:
        """A labelled vertical line at ``t`` (a note, apart from call markers)."""
        pen = pg.mkPen(color or self._theme.executed_mark, width=2, style=Qt.DotLine)
        opts = dict(position=0.85, color=self._theme.text, fill=self._theme.overlay_fill, anchors=[(0, 0.5)] * 2)
        line = pg.InfiniteLine(pos=t, angle=90, movable=False, pen=pen, label=text, labelOpts=opts)
        line.setZValue(25)
        self.view.addItem(line, ignoreBounds=True)
        self._notes.append(line)
        return line

    def mark_freed(self, t: float, nbytes: int) -> pg.InfiniteLine:
        """Show that ``nbytes`` of saved tensors were released at ``t`` (stepping)."""
        return self.add_marker(t, f"−{nbytes / MB:.2f} MB")

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
        self.cursor.setPen(pg.mkPen(t.muted_text, width=1, style=Qt.DotLine))
        self.readout.fill, self.readout.border = pg.mkBrush(t.overlay_fill), pg.mkPen(t.overlay_border)
        self.readout.setColor(t.text)
        self.legend.setLabelTextColor(t.text)

    def _line_pens(self) -> tuple[QPen, QPen]:
        t = self._theme
        solid = pg.mkPen(t.op_border, width=2)
        # Qt strokes dashes wider than 1 px slowly (seconds for a dense zigzag): thin them when dense.
        dashed = pg.mkPen(t.custom_border if t.name != "print" else t.text, width=1 if self._dense else 2,
                          style=Qt.DashLine)
        return solid, dashed

    def _update_detail(self, *_) -> None:
        """Thin the dashed line while its visible path is long (a dense zigzag)."""
        key, item = list(self._lines.items())[1]
        s, view = self._series, item.getViewBox()
        if view is None or s.n < 2:
            return
        (x0, x1), (y0, y1) = view.viewRange()
        lo, hi = np.searchsorted(s.t[:s.n], (x0, x1))
        rise = np.abs(np.diff(s.cols[key][lo:hi + 1])).sum() / MB * view.height() / max(y1 - y0, 1e-9)
        dense = bool(rise + view.width() > DASH_PIXELS)
        if dense != self._dense:
            self._dense = dense
            for item, pen in zip(self._lines.values(), self._line_pens()):
                item.setPen(pen)

    def _set_mode(self, mode: str) -> None:
        if mode == self._mode:
            return
        self._mode = mode
        for item in self._lines.values():
            item.getViewBox().removeItem(item)
        self._lines = {}
        self.legend.clear()
        pens = self._line_pens()
        for (key, label), pen, view in zip(_LINES[mode], pens, (self.view, self.view2 if mode == "cpu" else self.view)):
            item = pg.PlotDataItem(pen=pen, name=label, clipToView=True, autoDownsample=True,
                                   downsampleMethod="peak")
            view.addItem(item)
            self._lines[key] = item
            self.legend.addItem(item, label)
        for phase in PHASES:
            self.legend.addItem(_PhaseSwatch(self.bands, phase), phase)
        cpu = mode == "cpu"
        self.plot.getAxis("left").setLabel("process RSS (MB)" if cpu else "CUDA memory (MB)",
                                           color=pens[0].color().name() if cpu else self._theme.text)
        self.plot.getAxis("right").setLabel("saved tensors (MB)", color=pens[1].color().name())
        self.plot.showAxis("right", cpu)
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
        for (key, label), pen in zip(_LINES[self._mode], self._line_pens()):
            rows.append(f"<span style='color:{pen.color().name()}'>{'━' if key in ('rss', 'allocated') else '╍'}"
                        f"</span> {label}: {s.cols[key][i] / MB:,.1f} MB")
        if self._mode == "cuda" and s.cols["max_allocated"][i]:
            rows.append(f"peak allocated: {s.cols['max_allocated'][i] / MB:,.1f} MB")
        return f"<div style='font-size:8pt'>{'<br>'.join(rows)}</div>"

    def _on_click(self, ev) -> None:
        pos = ev.scenePos()
        if ev.button() != Qt.MouseButton.LeftButton or not self.view.sceneBoundingRect().contains(pos):
            return
        if ev.double():  # back to the whole run, following new samples again
            self.view.enableAutoRange()
            return
        t = float(self.view.mapSceneToView(pos).x())
        self.sig_time_clicked.emit(t)
        if (call := self.call_at(t)) is not None:
            self.sig_call_selected.emit(call)
