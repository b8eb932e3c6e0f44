"""The storage view's strip of cells: a tensor's storage drawn a cell per element (or per block of
elements for big storages), the cells it covers shaded and numbered in the order the tensor
walks them, with hop arcs between consecutive elements and a tooltip for each cell.
``widgets.storage.view.StorageView`` puts it beside the layout facts and the tensors sharing
the storage.
"""

from __future__ import annotations

import math

from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt
from PySide6.QtGui import (
    QColor, QFont, QFontMetricsF, QHelpEvent, QPainter, QPainterPath, QPalette, QPen, QPolygonF,
)
from PySide6.QtWidgets import QApplication, QScrollArea, QToolTip, QWidget

from core.model.storage_map import StorageGrid, StoragePicture, cell_description, hops_shown, index_text
from widgets.display_text import cut_line
from widgets.panels.inspector import format_number

HOP_LABELS = 6  # distinct hop sizes labelled on their first arc
AlignFlag = Qt.AlignmentFlag


def blend(a: QColor, b: QColor, t: float) -> QColor:
    """The colour ``t`` of the way from ``a`` to ``b``."""
    return QColor.fromRgbF(a.redF() * (1 - t) + b.redF() * t, a.greenF() * (1 - t) + b.greenF() * t,
                           a.blueF() * (1 - t) + b.blueF() * t)


class StorageCanvas(QWidget):
    """Paints the storage cells in rows that fit the width, with hops between covered cells."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.pic = StoragePicture()
        self.grid = StorageGrid()

    def set_picture(self, pic: StoragePicture) -> None:
        self.pic = pic
        self._relayout()
        self.update()

    # geometry

    def _relayout(self) -> None:
        last = max(0, (self.pic.count - 1) * self.pic.block)
        left = QFontMetricsF(self._small_font()).horizontalAdvance(f"{last:,}") + 22
        top = self._legend()[-1][2].y() + 30
        # Wrap to the width, and shrink the cells (down to the smallest that still shows values) until
        # every row fits the height the view has: a 3x4 tensor is seen whole, without scrolling.
        room = self.parentWidget().height() if self.parentWidget() is not None else 0
        for cell in (None, 56.0, 48.0, 42.0):
            self.grid = StorageGrid.for_picture(self.pic, self.width(), left, top, cell)
            if self.grid.height() <= room or self.pic.block > 1 or self.pic.count > 64:
                break
        height = int(self.grid.height())
        if height > room and self.pic.count and self.grid.cell(self.pic.count - 1)[1] + self.grid.size + 4 <= room:
            height = room  # only the margin under the last row is cut: no scroll bar for it
        if height != self.minimumHeight():
            self.setMinimumHeight(height)
            area = self.parentWidget().parentWidget() if self.parentWidget() is not None else None
            if isinstance(area, QScrollArea):  # it resizes its widget on its own layout request only
                QApplication.postEvent(area, QEvent(QEvent.Type.LayoutRequest))

    def resizeEvent(self, event) -> None:
        self._relayout()
        super().resizeEvent(event)

    def minimumSizeHint(self) -> QSize:
        return QSize(int(self.grid.left + 8 + 4 * (self.grid.size + self.grid.gap)), 80)

    def cell_rect(self, index: int) -> QRectF:
        return QRectF(*self.grid.cell(index))

    # fonts and colours

    def _small_font(self) -> QFont:
        f = QFont(self.font())
        f.setPixelSize(9 if self.grid.size < 60 else 10)
        return f

    def _colors(self) -> dict[str, QColor]:
        pal = self.palette()
        base, text = pal.color(QPalette.ColorRole.Base), pal.color(QPalette.ColorRole.Text)
        accent = pal.color(QPalette.ColorRole.Highlight)
        return {
            "base": base, "text": text, "muted": blend(text, base, 0.5), "accent": accent,
            "accent_text": pal.color(QPalette.ColorRole.HighlightedText),
            "cell": blend(base, text, 0.04), "cell_border": blend(base, text, 0.35),
            "covered": blend(base, accent, 0.36), "covered_border": blend(accent, text, 0.25),
            "arrow": blend(accent, text, 0.2),
        }

    # painting

    def paintEvent(self, event) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        c = self._colors()
        p.fillRect(self.rect(), c["base"])
        pic = self.pic
        if pic.count == 0:
            p.setPen(c["muted"])
            p.drawText(self.rect(), AlignFlag.AlignCenter, "No storage to show.")
            p.end()
            return
        self._paint_legend(p, c)
        visible, g = QRectF(event.rect()), self.grid
        for row in range(g.rows):
            top = g.top + row * g.pitch
            if top > visible.bottom() or top + g.pitch < visible.top():
                continue
            self._paint_row_label(p, c, row)
            for index in range(row * g.cols, min(pic.count, (row + 1) * g.cols)):
                self._paint_cell(p, c, index)
        if g.bracket:
            self._paint_offset(p, c)
        if hops_shown(pic):
            self._paint_hops(p, c)
        p.end()

    def _paint_offset(self, p: QPainter, c: dict) -> None:
        """A bracket under the cells before the first element, labelled with the storage offset."""
        end = min(self.pic.count, self.pic.storage_offset)
        p.setFont(self._small_font())
        for row_start in range(0, end, self.grid.cols):
            first, last = self.cell_rect(row_start), self.cell_rect(min(end, row_start + self.grid.cols) - 1)
            y = first.bottom() + self.grid.arc * 0.8
            p.setPen(QPen(c["muted"], 1.2, Qt.PenStyle.DashLine))
            p.drawLine(QPointF(first.left(), y), QPointF(last.right(), y))
            p.setPen(QPen(c["muted"], 1.2))
            for x in (first.left(), last.right()):
                p.drawLine(QPointF(x, y - 5), QPointF(x, y + 5))
            if row_start == 0:
                label = f"storage_offset {self.pic.storage_offset:,}: skipped"
                if p.fontMetrics().horizontalAdvance(label) > last.right() - first.left():
                    label = f"offset {self.pic.storage_offset:,}"
                w = p.fontMetrics().horizontalAdvance(label) + 8
                mid = (first.left() + last.right()) / 2
                p.fillRect(QRectF(mid - w / 2, y - 7, w, 14), c["base"])
                p.drawText(QRectF(mid - w / 2, y - 7, w, 14), AlignFlag.AlignCenter, label)

    def _legend(self) -> list[tuple[str, str, QPointF]]:
        """Legend entries (kind, text, top-left), wrapped into lines that fit the width."""
        pic, fm = self.pic, QFontMetricsF(self.font())
        items = [("covered", f"covered by {cut_line(pic.name)}"), ("cell", f"rest of storage {pic.storage}")]
        if pic.block > 1:
            touched = sum(1 for f in pic.coverage if f > 0)
            items.append(("note", f"each cell is {pic.block:,} elements, filled by the fraction covered "
                                  f"({touched:,} of {pic.count:,} cells touched)"))
        elif pic.first_step:
            items.append(("badge", "order of the row-major walk"))
        out, x, y, room = [], 8.0, 8.0, max(120.0, self.width() - 16.0)
        for kind, label in items:
            width = (0 if kind == "note" else 22) + fm.horizontalAdvance(label)
            if x > 8 and x + width > room:
                x, y = 8.0, y + 22
            out.append((kind, fm.elidedText(label, Qt.TextElideMode.ElideRight, room - x), QPointF(x, y)))
            x += width + 22
        return out

    def _paint_legend(self, p: QPainter, c: dict) -> None:
        h = 16.0
        for kind, label, at in self._legend():
            rect = QRectF(at.x(), at.y(), h, h)
            if kind in ("covered", "cell"):
                covered = kind == "covered"
                p.setPen(QPen(c["covered_border"], 2.2) if covered else QPen(c["cell_border"], 1))
                p.setBrush(c["covered"] if covered else c["cell"])
                p.drawRoundedRect(rect, 3, 3)
            elif kind == "badge":
                rect = self._paint_badge(p, c, rect.center(), "0")
            else:
                rect = QRectF(at.x() - 6, at.y(), 0, h)
            p.setFont(self.font())
            p.setPen(c["text"])
            p.drawText(QRectF(rect.right() + 6, at.y() - 2, self.width(), h + 4), AlignFlag.AlignVCenter, label)

    def _paint_row_label(self, p: QPainter, c: dict, row: int) -> None:
        rect = self.cell_rect(row * self.grid.cols)
        p.setFont(self._small_font())
        p.setPen(c["muted"])
        p.drawText(QRectF(2, rect.top(), self.grid.left - 8, rect.height()),
                   AlignFlag.AlignVCenter | AlignFlag.AlignRight, f"{row * self.grid.cols * self.pic.block:,}")

    def _paint_badge(self, p: QPainter, c: dict, center: QPointF, text: str) -> QRectF:
        f = QFont(self.font())
        f.setBold(True)
        f.setPixelSize(11 if self.grid.size >= 40 else 9)
        p.setFont(f)
        h = 18.0 if self.grid.size >= 40 else 13.0
        w = max(h, p.fontMetrics().horizontalAdvance(text) + 8)
        rect = QRectF(center.x() - w / 2, center.y() - h / 2, w, h)
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(c["accent"])
        p.drawRoundedRect(rect, h / 2, h / 2)
        p.setPen(c["accent_text"])
        p.drawText(rect, AlignFlag.AlignCenter, text)
        return rect

    def _paint_cell(self, p: QPainter, c: dict, index: int) -> None:
        pic, rect, s = self.pic, self.cell_rect(index), self.grid.size
        frac = pic.coverage[index] if index < len(pic.coverage) else 0.0
        covered = frac > 0
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(c["cell"])
        p.drawRoundedRect(rect, 4, 4)
        if covered:
            fill = QRectF(rect)
            if pic.block > 1:
                fill.setTop(rect.bottom() - max(2.0, rect.height() * frac))
            p.setBrush(c["covered"])
            p.drawRoundedRect(fill, 4, 4)
        p.setBrush(Qt.BrushStyle.NoBrush)
        p.setPen(QPen(c["covered_border"], 2.6) if covered else QPen(c["cell_border"], 1))
        p.drawRoundedRect(rect.adjusted(0.5, 0.5, -0.5, -0.5), 4, 4)
        if pic.block > 1:
            return
        if s >= 40:
            p.setFont(self._small_font())
            p.setPen(c["muted"])
            p.drawText(rect.adjusted(4, 2, -4, -2), AlignFlag.AlignLeft | AlignFlag.AlignTop, str(index))
        value = pic.values[index] if pic.values is not None and index < len(pic.values) else None
        if value is not None and s >= 40:
            self._paint_value(p, c["text"] if covered else c["muted"], rect, format_number(value, pic.dtype))
        step = pic.first_step.get(index)
        if step is not None and (s >= 40 or step < 1000):
            text = f"{step}+" if pic.visits.get(index, 1) > 1 else str(step)
            corner = QPointF(rect.right() - 11, rect.top() + 11) if s >= 40 else rect.center()
            self._paint_badge(p, c, corner, text)
            if s >= 60 and pic.shape:
                p.setFont(self._small_font())
                p.setPen(c["text"])
                p.drawText(rect.adjusted(2, 0, -2, -3), AlignFlag.AlignHCenter | AlignFlag.AlignBottom,
                           index_text(step, pic.shape))

    def _paint_value(self, p: QPainter, color: QColor, rect: QRectF, text: str) -> None:
        f = QFont(self.font())
        f.setPixelSize(15 if self.grid.size >= 60 else 10)
        p.setFont(f)
        room = rect.width() - 6
        while p.fontMetrics().horizontalAdvance(text) > room and f.pixelSize() > 7:
            f.setPixelSize(f.pixelSize() - 1)
            p.setFont(f)
        p.setPen(color)
        p.drawText(rect, AlignFlag.AlignCenter, p.fontMetrics().elidedText(text, Qt.TextElideMode.ElideRight,
                                                                            int(room)))

    def _hop_path(self, a: int, b: int, lane: int) -> tuple[QPainterPath, QPointF, QPointF]:
        """The hop from cell a to cell b as a path, with the point its arrowhead points from."""
        kind, pts = self.grid.hop(a, b, lane)
        q = [QPointF(x, y) for x, y in pts]
        path = QPainterPath(q[0])
        if kind == "arc":
            path.cubicTo(q[1], q[2], q[3])
            return path, q[2], q[3]
        for k in range(1, len(q) - 1):  # rounded corners
            here, d_in, d_out = q[k], q[k] - q[k - 1], q[k + 1] - q[k]
            l_in, l_out = math.hypot(d_in.x(), d_in.y()), math.hypot(d_out.x(), d_out.y())
            r = min(6.0, l_in / 2, l_out / 2)
            path.lineTo(here - d_in * (r / l_in))
            path.quadTo(here, here + d_out * (r / l_out))
        path.lineTo(q[-1])
        return path, q[-2], q[-1]

    def _paint_hops(self, p: QPainter, c: dict) -> None:
        offs, labelled = self.pic.offsets or [], {}
        pen = QPen(c["arrow"], 1.6)
        pen.setCapStyle(Qt.PenCapStyle.RoundCap)
        for lane, (a, b) in enumerate(zip(offs, offs[1:])):
            if a == b or not (0 <= a < self.pic.count and 0 <= b < self.pic.count):
                continue
            path, towards, tip = self._hop_path(a, b, lane)
            p.setPen(pen)
            p.setBrush(Qt.BrushStyle.NoBrush)
            p.drawPath(path)
            self._arrow_head(p, c["arrow"], towards, tip)
            if b - a not in labelled and len(labelled) < HOP_LABELS:
                same_row = a // self.grid.cols == b // self.grid.cols
                labelled[b - a] = path.pointAtPercent(0.5 if same_row else 0.2)
        f = QFont(self.font())
        f.setBold(True)
        f.setPixelSize(11)
        p.setFont(f)
        for hop, at in labelled.items():
            text = f"{hop:+d}"
            w = p.fontMetrics().horizontalAdvance(text) + 8
            rect = QRectF(at.x() - w / 2, at.y() - 8, w, 16)
            p.setPen(QPen(c["arrow"], 1))
            p.setBrush(c["base"])
            p.drawRoundedRect(rect, 4, 4)
            p.setPen(c["text"])
            p.drawText(rect, AlignFlag.AlignCenter, text)

    @staticmethod
    def _arrow_head(p: QPainter, color: QColor, towards: QPointF, tip: QPointF) -> None:
        dx, dy = tip.x() - towards.x(), tip.y() - towards.y()
        length = math.hypot(dx, dy) or 1.0
        ux, uy, size = dx / length, dy / length, 7.0
        back = QPointF(tip.x() - ux * size, tip.y() - uy * size)
        left = QPointF(back.x() - uy * size * 0.55, back.y() + ux * size * 0.55)
        right = QPointF(back.x() + uy * size * 0.55, back.y() - ux * size * 0.55)
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(color)
        p.drawPolygon(QPolygonF([tip, left, right]))

    # tooltips

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip and isinstance(event, QHelpEvent):
            index = self.grid.cell_at(event.pos().x(), event.pos().y())
            if index is None:
                QToolTip.hideText()
            else:
                QToolTip.showText(event.globalPos(), self.cell_tip(index), self)
            return True
        return super().event(event)

    def cell_tip(self, index: int) -> str:
        """What a cell holds, in words, for its tooltip."""
        return cell_description(self.pic, index, lambda v: format_number(v, self.pic.dtype))
