"""Gradient health beside the Calls list: a module × call heatmap of gradient norms on a log colour
scale, its colour bar, and the vanishing / exploding flags under it (``core.model.grad_health``).

Rows go from the input to the loss, columns are calls; a click on a column picks that call. A norm
that is not finite (inf or nan) has no place on the scale: its cell is grey and hatched. A call whose
``GradScaler.step`` was skipped (inf/NaN in the gradients) has an amber band above its column and a
line in the list under the flags.
"""

from __future__ import annotations

import math

from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFontMetrics, QLinearGradient, QMouseEvent, QPainter, QPen
from PySide6.QtWidgets import (QLabel, QListWidget, QListWidgetItem, QSizePolicy, QStackedWidget, QToolTip,
                               QVBoxLayout, QWidget)

from core.model.grad_health import Flag, GradHealth, ScalerStep, grad_health
from core.model.trace import Trace

# viridis, sampled: dark violet for the smallest norm, yellow for the largest
STOPS = [QColor("#440154"), QColor("#3b528b"), QColor("#21918c"), QColor("#5ec962"), QColor("#fde725")]
NAN_COLOR = QColor("#9e9e9e")  # a norm that is inf or nan has no place on the scale: grey, hatched
SKIP_COLOR = QColor("#f0a000")  # amber: the GradScaler step after this call was skipped
SKIP_BAND = 6  # its band above the column, under the call numbers
FLAG_COLORS = {"exploding": QColor("#ff3b30"), "vanishing": QColor("#00c8ff")}
EMPTY_TEXT = "No gradient norms in this trace"


def skip_text_color(dark: bool) -> QColor:
    """The amber of a skipped step's words, dark enough to read on the theme (the Calls list's too)."""
    return QColor("#e3b341" if dark else "#9a5b00")


def shade_color(shade: float) -> QColor:
    """The colour of a place on the scale, 0 (smallest norm) to 1 (largest)."""
    x = min(1.0, max(0.0, shade)) * (len(STOPS) - 1)
    i = min(int(x), len(STOPS) - 2)
    t = x - i
    a, b = STOPS[i], STOPS[i + 1]
    return QColor(round(a.red() + (b.red() - a.red()) * t), round(a.green() + (b.green() - a.green()) * t),
                  round(a.blue() + (b.blue() - a.blue()) * t))


def norm_text(value: float | None) -> str:
    if value is None:
        return "not reached"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.3g}"


def flagged_cells(flag: Flag, calls: list[int]) -> list[int]:
    """The columns a flag outlines: an exploding rise over its calls, a vanishing norm where it starts."""
    start = calls.index(flag.call)
    return list(range(start, min(len(calls), start + flag.calls))) if flag.kind == "exploding" else [start]


class GradHeatmap(QWidget):
    """The painted cells, module names on the left, call numbers above, the colour bar below."""

    sig_column_clicked = Signal(int)
    """A column was clicked: the index of its call."""

    ROW_MAX = 22
    HEAD = 16  # call numbers above the cells
    BAR = 44  # colour bar, its range and a line of what it shows, below

    def __init__(self, parent=None):
        super().__init__(parent)
        self.health: GradHealth | None = None
        self.current: int | None = None  # the column of the call shown
        self.skips: dict[int, ScalerStep] = {}  # column -> the skipped GradScaler step after its call
        self.setMouseTracking(True)
        self.setMinimumHeight(90)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)

    def set_health(self, health: GradHealth | None) -> None:
        self.health = health
        self.current = None
        calls = health.matrix.calls if health else []
        self.skips = {calls.index(s.call): s for s in (health.skipped if health else []) if s.call in calls}
        self.updateGeometry()
        self.update()

    def mark_call(self, index: int | None) -> None:
        """Frame the column of the call shown (none when that call has no norms)."""
        calls = self.health.matrix.calls if self.health else []
        self.current = calls.index(index) if index in calls else None
        self.update()

    def sizeHint(self) -> QSize:
        rows = len(self.health.matrix.modules) if self.health else 3
        return QSize(220, min(600, self._head() + self._bar_height() + 8 + rows * self.ROW_MAX))

    def _head(self) -> int:
        return self.HEAD + (SKIP_BAND if self.skips else 0)

    # geometry
    def _names_width(self) -> int:
        fm = self.fontMetrics()
        names = self.health.matrix.modules if self.health else []
        return min(self.width() // 3, max((fm.horizontalAdvance(n) for n in names), default=0) + 6)

    def grid_rect(self) -> QRectF:
        m = self.health.matrix
        left = self._names_width()
        head = self._head()
        height = self.height() - head - self._bar_height() - 4
        row = min(self.ROW_MAX, height / max(1, len(m.modules)))
        return QRectF(left, head, self.width() - left - 4, row * len(m.modules))

    def cell_rect(self, row: int, col: int) -> QRectF:
        g = self.grid_rect()
        m = self.health.matrix
        w, h = g.width() / len(m.calls), g.height() / len(m.modules)
        return QRectF(g.left() + col * w, g.top() + row * h, w, h)

    def cell_at(self, pos: QPointF) -> tuple[int, int] | None:
        """(row, column) under a point, or None off the cells; a column alone when above or below them."""
        if self.health is None or not self.health.matrix.calls:
            return None
        g = self.grid_rect()
        m = self.health.matrix
        if not (g.left() <= pos.x() < g.right()):
            return None
        col = int((pos.x() - g.left()) / (g.width() / len(m.calls)))
        row = int((pos.y() - g.top()) / (g.height() / len(m.modules))) if g.top() <= pos.y() < g.bottom() else -1
        return row, min(col, len(m.calls) - 1)

    def cell_color(self, row: int, col: int) -> QColor | None:
        """A cell's colour; None for a module the call did not reach."""
        m = self.health.matrix
        value = m.values[row][col]
        if value is None:
            return None
        shade = m.shade(value)
        return NAN_COLOR if shade is None or math.isinf(value) else shade_color(shade)

    def cell_tip(self, row: int, col: int) -> str:
        m = self.health.matrix
        module, call = m.modules[row], m.calls[col]
        lines = [f"{module} · call #{call}: ‖grad‖ {norm_text(m.values[row][col])}"]
        lines += [f.text for f in self.health.flags if f.module == module and col in flagged_cells(f, m.calls)]
        if col in self.skips:
            lines.append(f"GradScaler {self.skips[col].note}")
        return "\n".join(lines)

    def skip_tip(self, col: int) -> str:
        """Above a column: the skipped step after its call, if there was one."""
        step = self.skips.get(col)
        return f"call #{self.health.matrix.calls[col]}: GradScaler {step.note}" if step else ""

    # drawing and events
    def paintEvent(self, event) -> None:
        if self.health is None or not self.health.matrix.calls:
            return
        m = self.health.matrix
        p = QPainter(self)
        fm = self.fontMetrics()
        text = self.palette().windowText().color()
        g = self.grid_rect()
        # module names in a smaller font when rows are thin; none under 7 px
        row_h = g.height() / len(m.modules)
        names_font = self.font()
        if row_h < fm.height() - 2:
            names_font.setPixelSize(max(1, int(row_h)))
        names_fm = QFontMetrics(names_font)
        for i, module in enumerate(m.modules):
            for j in range(len(m.calls)):
                color = self.cell_color(i, j)
                if color is not None:
                    p.fillRect(self.cell_rect(i, j), color)
                if color == NAN_COLOR:
                    p.fillRect(self.cell_rect(i, j), QBrush(QColor("#303030"), Qt.BrushStyle.BDiagPattern))
            r = self.cell_rect(i, 0)
            if row_h >= 7:
                p.setPen(text)
                p.setFont(names_font)
                name = names_fm.elidedText(module, Qt.TextElideMode.ElideLeft, int(g.left()) - 4)
                p.drawText(QRectF(0, r.top(), g.left() - 4, r.height()),
                           Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, name)
        # call numbers above, as many as fit
        p.setFont(self.font())
        p.setPen(text)
        width = g.width() / len(m.calls)
        step = max(1, math.ceil((fm.horizontalAdvance("#000") + 4) / width))
        for j in range(0, len(m.calls), step):
            if g.left() + j * width + fm.horizontalAdvance(f"#{m.calls[j]}") > self.width():
                break
            p.drawText(QRectF(g.left() + j * width, 0, max(width, 30), self.HEAD),
                       Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, f"#{m.calls[j]}")
        for col in self.skips:
            r = self.cell_rect(0, col)
            p.fillRect(QRectF(r.left() + 1, g.top() - SKIP_BAND, r.width() - 2, SKIP_BAND - 2), SKIP_COLOR)
        for flag in self.health.flags:
            cols = flagged_cells(flag, m.calls)
            row = m.modules.index(flag.module)
            box = self.cell_rect(row, cols[0]).united(self.cell_rect(row, cols[-1])).adjusted(1, 1, -1, -1)
            p.setPen(QPen(FLAG_COLORS[flag.kind], 2))
            p.setBrush(Qt.BrushStyle.NoBrush)
            p.drawRect(box)
        if self.current is not None:
            p.setPen(QPen(text, 1))
            p.setBrush(Qt.BrushStyle.NoBrush)
            col = self.cell_rect(0, self.current)
            p.drawRect(QRectF(col.left(), g.top() - 2, col.width(), g.height() + 4))
        self._paint_bar(p, QRectF(g.left(), g.bottom() + 6, g.width(), 10))
        p.end()

    def _paint_bar(self, p: QPainter, rect: QRectF) -> None:
        span = self.health.matrix.log_range
        if span is None:
            return
        gradient = QLinearGradient(rect.topLeft(), rect.topRight())
        for k, color in enumerate(STOPS):
            gradient.setColorAt(k / (len(STOPS) - 1), color)
        p.fillRect(rect, gradient)
        p.setPen(self.palette().windowText().color())
        below = QRectF(rect.left(), rect.bottom() + 1, rect.width(), self.fontMetrics().height())
        lo, hi = self.bar_labels()
        p.drawText(below, Qt.AlignmentFlag.AlignLeft, lo)
        p.drawText(below, Qt.AlignmentFlag.AlignRight, hi)
        for line in self.caption_lines():
            below = QRectF(0, below.top() + self.fontMetrics().height(), self.width(), below.height())
            p.drawText(below, Qt.AlignmentFlag.AlignHCenter, line)

    def caption_lines(self) -> list[str]:
        """The caption cut at its " · " into lines as wide as the widget (a narrow dock takes two or three)."""
        fm, room = self.fontMetrics(), max(1, self.width() - 4)
        lines: list[str] = []
        for part in self.bar_caption().split(" · "):
            if lines and fm.horizontalAdvance(f"{lines[-1]} · {part}") <= room:
                lines[-1] = f"{lines[-1]} · {part}"
            else:
                lines.append(part)
        return lines

    def _bar_height(self) -> int:
        """The colour bar, its range and its caption's lines, below the cells."""
        lines = len(self.caption_lines()) if self.health is not None and self.health.matrix.calls else 1
        return self.BAR + (lines - 1) * self.fontMetrics().height()

    def bar_caption(self) -> str:
        """What the colour bar shows, and what grey and amber mean where the trace has them."""
        values = [v for r in self.health.matrix.values for v in r if v is not None]
        grey = [w for w, has in (("inf", any(math.isinf(v) for v in values)),
                                 ("nan", any(math.isnan(v) for v in values))) if has]
        return "‖grad‖, log scale" + (f" · grey: {', '.join(grey)}" if grey else "") + \
            (" · amber: step skipped" if self.skips else "")

    def bar_labels(self) -> tuple[str, str]:
        """The smallest and the largest norm the colour bar spans."""
        lo, hi = self.health.matrix.log_range
        return norm_text(10 ** lo), norm_text(10 ** hi)

    def event(self, e) -> bool:
        if e.type() == QEvent.Type.ToolTip:
            cell = self.cell_at(QPointF(e.pos()))
            tip = "" if cell is None else self.cell_tip(*cell) if cell[0] >= 0 else self.skip_tip(cell[1])
            if tip:
                QToolTip.showText(e.globalPos(), tip, self)
            else:
                QToolTip.hideText()
                e.ignore()
            return True
        return super().event(e)

    def mousePressEvent(self, e: QMouseEvent) -> None:
        cell = self.cell_at(e.position())
        if cell is not None and e.button() == Qt.MouseButton.LeftButton:
            self.sig_column_clicked.emit(self.health.matrix.calls[cell[1]])
        super().mousePressEvent(e)


class GradHealthPanel(QWidget):
    """The heatmap, a line naming its size, and the flags; an empty state when nothing was recorded."""

    sig_call_selected = Signal(int)
    """A call was picked in the heatmap: its index."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.health: GradHealth | None = None
        self.flag_calls: list[int | None] = []  # the call each line of the list picks
        self.stack = QStackedWidget(self)
        self.empty = QLabel(EMPTY_TEXT, self)
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty.setWordWrap(True)
        self.empty.setEnabled(False)
        body = QWidget(self)
        self.summary = QLabel(body)
        self.heatmap = GradHeatmap(body)
        self.flags = QListWidget(body)
        self.flags.setWordWrap(True)
        self.flags.setToolTip("Click a flag to show the call where it starts")
        self.flags.itemClicked.connect(self._flag_clicked)
        lay = QVBoxLayout(body)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addWidget(self.summary)
        lay.addWidget(self.heatmap)
        lay.addWidget(self.flags, 1)
        self.body = body
        self.stack.addWidget(self.empty)
        self.stack.addWidget(body)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(self.stack)
        self.heatmap.sig_column_clicked.connect(self.sig_call_selected)

    def set_trace(self, trace: Trace | None) -> None:
        health = grad_health(trace) if trace is not None else None
        if health is None or not health.matrix.calls:
            self.health = None
            self.heatmap.set_health(None)
            self.flags.clear()
            self.stack.setCurrentWidget(self.empty)
            return
        self.health = health
        m = health.matrix
        self.summary.setText(f"‖grad‖ per module: {len(m.modules)} module{'s' if len(m.modules) != 1 else ''} × "
                             f"{len(m.calls)} call{'s' if len(m.calls) != 1 else ''}")
        self.heatmap.set_health(health)
        self.flags.clear()
        self.flag_calls = [flag.call for flag in health.flags]
        for flag in health.flags:
            self.flags.addItem(flag.text)
        if not health.flags:
            self.flags.addItem("no vanishing or exploding gradients")
            self.flag_calls.append(None)
        for step in health.skipped:
            item = QListWidgetItem(f"call #{step.call}: GradScaler {step.note}" if step.call is not None
                                   else f"GradScaler {step.note}")
            dark = self.palette().base().color().lightness() < 128
            item.setForeground(skip_text_color(dark))
            self.flags.addItem(item)
            self.flag_calls.append(step.call)
        self.stack.setCurrentWidget(self.body)

    def _flag_clicked(self, item) -> None:
        row = self.flags.row(item)
        if self.health is not None and row < len(self.flag_calls) and self.flag_calls[row] is not None:
            self.sig_call_selected.emit(self.flag_calls[row])

    def mark_call(self, index: int | None) -> None:
        """The call shown elsewhere (the Calls list, the graph): its column is framed."""
        self.heatmap.mark_call(index)

    def flag_texts(self) -> list[str]:
        return [self.flags.item(i).text() for i in range(self.flags.count())]
