"""The line beside the Graph and Storage tabs saying where a debug run is paused in forward.

"Paused in forward: <module> line 31 › model.forward line 19   ■ 3 nodes added since the last
pause" (the last frame's line is the one about to run). It takes the room the tabs leave: the frames are elided in the middle when
the window is narrow, the count of new nodes (with its colour, the graph's mark) always shows.
"""

from __future__ import annotations

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFontMetrics, QPainter, QPalette
from PySide6.QtWidgets import QTabWidget, QWidget

GAP = 12  # pixels between the parts, and kept free beside the tabs


class PauseStrip(QWidget):
    """``where`` and ``new`` (the nodes added), drawn in one line in a tab widget's corner."""

    def __init__(self, tabs: QTabWidget):
        super().__init__(tabs)
        self.tabs = tabs
        self.where = ""
        self.new = ""
        self.colour = QColor("#0ca678")

    def set_text(self, where: str, new: str, colour: QColor) -> None:
        self.where, self.new, self.colour = where, new, QColor(colour)
        self.setToolTip(f"{where}\n{new}")
        self.updateGeometry()
        self.update()

    def text(self) -> str:
        return f"{self.where}  {self.new}"

    def _widths(self) -> tuple[int, int]:
        fm = QFontMetrics(self.font())
        return fm.horizontalAdvance(self.where), fm.horizontalAdvance(self.new) + fm.height() + 4

    def sizeHint(self) -> QSize:
        where, new = self._widths()
        full = where + new + 3 * GAP + 2  # 2: elidedText cuts a text exactly as wide as its room
        room = self.tabs.width() - self.tabs.tabBar().sizeHint().width() - GAP
        return QSize(max(self.minimumSizeHint().width(), min(full, room)), QFontMetrics(self.font()).height() + 6)

    def minimumSizeHint(self) -> QSize:
        return QSize(self._widths()[1] + 2 * GAP, QFontMetrics(self.font()).height() + 6)

    def elided_where(self) -> str:
        """The frames as drawn: elided in the middle to the room left by the count."""
        fm = QFontMetrics(self.font())
        room = self.width() - self._widths()[1] - 3 * GAP
        return fm.elidedText(self.where, Qt.TextElideMode.ElideMiddle, max(0, room))

    def paintEvent(self, event) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        fm = QFontMetrics(self.font())
        h = self.height()
        new_w = self._widths()[1]
        p.setPen(self.palette().color(QPalette.ColorRole.WindowText))
        p.drawText(QRectF(GAP, 0, self.width() - new_w - 3 * GAP, h),
                   Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft, self.elided_where())
        x = self.width() - GAP - new_w
        side = fm.height() * 0.7
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(self.colour)
        p.drawRoundedRect(QRectF(x, (h - side) / 2, side, side), 2, 2)
        p.setPen(self.palette().color(QPalette.ColorRole.WindowText))
        p.drawText(QRectF(x + side + 4, 0, new_w, h), Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft,
                   self.new)
