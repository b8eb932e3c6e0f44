"""The pieces the memory chart draws: phase bands, call and event markers, and the sample columns.

Each marker kind is one item that draws only the visible pixel columns, so a loop of ten
thousand calls still pans smoothly, with labels only where they fit.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pyqtgraph as pg
from pyqtgraph.graphicsItems.LegendItem import ItemSample
from PySide6.QtCore import QLineF, QPointF, QRectF, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetricsF, QImage, QPen

from widgets.theme import Theme, get_theme

PHASES = ("starting", "forward", "backward", "between")
BACKWARD = PHASES.index("backward")
FIELDS = ("allocated", "reserved", "rss", "saved_bytes", "max_allocated", "kept_bytes")
# Lines per device: (sample field, legend name, axis, pen role).
LINES = {
    "cuda": (("allocated", "allocated", "left", "solid"), ("reserved", "reserved", "left", "reserved"),
             ("saved_bytes", "saved tensors", "right", "dashed")),
    "cpu": (("rss", "process RSS", "left", "solid"), ("saved_bytes", "saved tensors", "right", "dashed")),
}


def get_field(sample, key, default=0):
    return sample.get(key, default) if isinstance(sample, dict) else getattr(sample, key, default)


@lru_cache(maxsize=8)
def phase_brushes(theme: Theme) -> dict[str, QBrush]:
    """Band fills: distinct hues, and distinct grey levels once printed; the print theme has greys only."""
    if theme.name == "print":
        return {"starting": QBrush(QColor(0, 0, 0, 8)), "forward": QBrush(QColor(0, 0, 0, 22)),
                "backward": QBrush(QColor(0, 0, 0, 58)), "between": QBrush(QColor(0, 0, 0, 0))}
    alpha = 56 if theme.name == "dark" else 46
    colors = {"starting": (theme.no_grad_border, alpha // 2), "forward": (theme.leaf_border, alpha),
              "backward": (theme.current, alpha), "between": (theme.other_border, alpha // 2)}
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

    def _labels(self, sl) -> list[str]:
        return [f"#{i}" for i in self.indices[sl][:2000]]

    def _label_y(self, px, fm) -> float:
        return px.top() + fm.ascent() + 2

    def _pen(self) -> QPen:
        return QPen(QColor(self.theme.muted_text), 0, Qt.DashLine)  # 0: one pixel, cosmetic

    def paint(self, p, *args):
        if (view := self._begin(p)) is None:
            return
        sl, a, b, px, fm = view
        xs = np.rint(a * self.t0[sl] + b) + 0.5
        labels, right = [], -1e9
        for x, text in zip(xs[:2000], self._labels(sl)):
            if x + 3 > right:  # skip labels that would overlap the previous one
                labels.append((x, text))
                right = x + 9 + fm.horizontalAdvance(text)
        lines = np.unique(xs)
        if len(lines) * 4 > px.width():  # a line every few pixels would hide the data: labelled ones only
            lines = [x for x, _ in labels]
        p.setPen(self._pen())
        p.drawLines([QLineF(x, px.top(), x, px.bottom()) for x in lines])
        p.setPen(QColor(self.theme.text))
        y = self._label_y(px, fm)
        for x, text in labels:
            width = fm.horizontalAdvance(text)
            # A label that would run past the plot's right edge is drawn to the left of its line.
            p.drawText(QPointF(x + 3 if x + 3 + width <= px.right() else x - 3 - width, y), text)


EVENT_LABELS = {"zero_grad": "zero_grad", "optimizer.step": "step", "empty_cache": "empty_cache"}


class EventMarksItem(CallMarkersItem):
    """A dotted line where the script called ``zero_grad``, ``optimizer.step`` or ``empty_cache``,
    labelled low in the plot (call labels sit at the top) where labels fit."""

    def __init__(self):
        super().__init__()
        self.kinds: list[str] = []

    def set_events(self, events: list[tuple[float, str]]) -> None:
        self.t0 = self.t1 = np.array([t for t, _ in events], dtype=float)
        self.kinds = [k for _, k in events]
        self.changed()

    def _labels(self, sl) -> list[str]:
        return [EVENT_LABELS.get(k, k) for k in self.kinds[sl][:2000]]

    def _label_y(self, px, fm) -> float:
        return px.bottom() - fm.descent() - 18  # above the phase names

    def _pen(self) -> QPen:
        return QPen(QColor(self.theme.executed_mark), 0, Qt.DotLine)


class PhaseSwatch(ItemSample):
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


class Series:
    """Growable numpy columns of the samples, and the phase runs derived from them."""

    def __init__(self):
        self.n, self.t, self.codes = 0, np.zeros(256), np.zeros(256, dtype=np.int8)
        self.cols = {f: np.zeros(256) for f in FIELDS}
        self.run_t0: list[float] = []  # each run of samples in one phase: start, end, phase code
        self.run_t1: list[float] = []
        self.run_codes: list[int] = []
        # Call starts: the samples marking them (``call``), or, for samples without, each run entering "backward".
        self.calls: list[tuple[float, int]] = []
        self._marked_calls = False
        self.events: list[tuple[float, str]] = []  # (t, mark) of marked samples: zero_grad, optimizer.step, ...
        self.wheres: dict[int, str] = {}  # sample index -> the op that had just run (names peaks)
        self.keepers: dict[int, str] = {}  # sample index -> the list keeping most of its kept_bytes

    def append(self, samples) -> None:
        m = len(samples)
        if self.n + m > len(self.t):
            cap = max(2 * len(self.t), self.n + m)
            self.t, self.codes = np.resize(self.t, cap), np.resize(self.codes, cap)
            self.cols = {f: np.resize(c, cap) for f, c in self.cols.items()}
        sl = slice(self.n, self.n + m)
        self.t[sl] = [float(get_field(s, "t")) for s in samples]
        for f in FIELDS:
            self.cols[f][sl] = [get_field(s, f) for s in samples]
        for i, s in enumerate(samples):
            if (call := get_field(s, "call", None)) is not None:
                if not self._marked_calls:  # the samples name their calls: nested ones too, by index
                    self._marked_calls, self.calls = True, []
                self.calls.append((float(self.t[self.n + i]), int(call)))
            if mark := get_field(s, "mark", ""):
                self.events.append((float(self.t[self.n + i]), mark))
            elif where := get_field(s, "where", ""):  # an op; a marker's line names no peak
                self.wheres[self.n + i] = where
            if keeper := get_field(s, "kept_in", ""):
                self.keepers[self.n + i] = keeper
        codes = [PHASES.index(ph) if (ph := get_field(s, "phase", "forward")) in PHASES else len(PHASES) - 1
                 for s in samples]
        self.codes[sl] = codes
        for t, code in zip(self.t[sl].tolist(), codes):
            if self.run_codes:
                self.run_t1[-1] = t  # a run ends where the next begins, so bands tile the time axis
                if self.run_codes[-1] == code:
                    continue
            self.run_t0.append(t)
            self.run_t1.append(t)
            self.run_codes.append(code)
            if code == BACKWARD and not self._marked_calls:
                self.calls.append((t, len(self.calls)))
        self.n += m



    def iterations(self) -> list[tuple[float, float]]:
        """(start, end) of each iteration: from a forward pass to the next one (or the last sample)."""
        forward = PHASES.index("forward")
        starts = [t0 for t0, code in zip(self.run_t0, self.run_codes) if code == forward]
        if not starts or not self.n:
            return []
        ends = starts[1:] + [float(self.t[self.n - 1])]
        return list(zip(starts, ends))

    def kept_in(self, i: int) -> str:
        """The list that keeps most of sample ``i``'s saved bytes, when it keeps at least half of them."""
        keeper = self.keepers.get(i, "")
        if keeper and 2 * self.cols["kept_bytes"][i] >= self.cols["saved_bytes"][i] > 0:
            return keeper
        return ""

    def where_before(self, i: int) -> str:
        """What had just run at sample ``i``: the nearest op named at or before it."""
        best = max((j for j in self.wheres if j <= i), default=None)
        return self.wheres[best] if best is not None else ""
