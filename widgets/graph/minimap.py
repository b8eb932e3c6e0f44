"""The graph's overview picture, the minimap and the legend.

``OverviewItem`` draws every box and edge with a handful of painter calls; the view shows
it instead of the per-node items when zoomed out so far that no text is readable, which
keeps a full repaint of a 5,000-node graph in a few milliseconds. The minimap and the
legend are overlays: child widgets of the view that do not scroll with the scene, placed by
``widgets.graph.overlays``.
"""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, QSize, Qt, Signal
from PySide6.QtGui import QColor, QFontMetricsF, QPainter, QPainterPath, QPen, QPixmap
from PySide6.QtWidgets import QGraphicsItem, QWidget

from core.layout.boxes import Layout
from widgets.graph.painting import NodeStyle, color, font, node_colors, paint_node
from widgets.graph.marks import paint_legend_sample
from widgets.theme import Theme


class OverviewItem(QGraphicsItem):
    """The whole graph at low detail: boxes by style, edges as polylines, marks for what matters."""

    def __init__(self, layout: Layout, styles: dict[str, NodeStyle], theme: Theme):
        super().__init__()
        self.theme = theme
        self._rect = QRectF(0, 0, layout.width, layout.height)
        self._boxes: dict[NodeStyle, QPainterPath] = {}
        for box in layout.nodes.values():
            path = self._boxes.setdefault(styles[box.id], QPainterPath())
            path.addRect(box.x, box.y, box.w, box.h)
        self._centres = {b.id: QPointF(b.x + b.w / 2, b.y + b.h / 2) for b in layout.nodes.values()}
        self._frames = QPainterPath()
        for g in layout.groups:
            if not g.collapsed:
                self._frames.addRect(g.x, g.y, g.w, g.h)
        self._edges = QPainterPath()
        for e in layout.edges:
            pts = e.points
            self._edges.moveTo(*pts[0])
            for x, y in pts[1:]:
                self._edges.lineTo(x, y)
        self.marks: dict[str, str] = {}  # box id -> colour name in the theme
        self.setZValue(0)
        self.setCacheMode(QGraphicsItem.DeviceCoordinateCache)

    def boundingRect(self) -> QRectF:
        return self._rect

    def set_marks(self, marks: dict[str, str]) -> None:
        if marks != self.marks:
            self.marks = dict(marks)
            self.update()

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.update()

    def paint(self, p: QPainter, option=None, widget=None) -> None:
        self.draw(p, marks=True)

    def draw(self, p: QPainter, marks: bool = True) -> None:
        """Draw with cosmetic (one device pixel) lines, so it reads at any scale."""
        t = self.theme
        p.setRenderHint(QPainter.Antialiasing, False)
        pen = QPen(color(t.group_box_border), 0)
        p.setPen(pen)
        p.setBrush(color(t.group_box_fill))
        p.drawPath(self._frames)
        p.setBrush(Qt.NoBrush)
        p.setPen(QPen(color(t.edge), 0))
        p.drawPath(self._edges)
        for style, path in self._boxes.items():
            fill, border = node_colors(style, t)
            p.setBrush(color(fill))
            p.setPen(QPen(color(border), 0))
            p.drawPath(path)
        if marks and self.marks:
            p.setRenderHint(QPainter.Antialiasing, True)
            transform = p.worldTransform()
            p.resetTransform()
            for node_id, which in self.marks.items():
                c = self._centres.get(node_id)
                if c is None:
                    continue
                d = transform.map(c)
                p.setPen(QPen(color(getattr(t, which)), 2.5))
                p.setBrush(Qt.NoBrush)
                p.drawEllipse(d, 7, 7)
            p.setTransform(transform)


class Minimap(QWidget):
    """A thumbnail of the whole graph with the visible area outlined; click or drag to move."""

    sig_center_on = Signal(QPointF)
    """The user clicked or dragged on the minimap; the scene point to centre on."""

    MAX = QSize(190, 150)

    def __init__(self, parent: QWidget):
        super().__init__(parent)
        self.setCursor(Qt.PointingHandCursor)
        self.setToolTip("Overview: click or drag to move the view; M folds it")
        self._overview: OverviewItem | None = None
        self._pixmap = QPixmap()
        self._scene_rect = QRectF()
        self._view_rect = QRectF()
        self._theme: Theme | None = None
        self.hide()

    def has_overview(self) -> bool:
        """True when there is a graph to show (the minimap appears once part of it is out of sight)."""
        return self._overview is not None and not self._scene_rect.isEmpty()

    def set_overview(self, overview: OverviewItem | None, scene_rect: QRectF, theme: Theme) -> None:
        self._overview = overview
        self._scene_rect = QRectF(scene_rect)
        self._theme = theme
        self._pixmap = QPixmap()
        if overview is not None and scene_rect.width() > 0 and scene_rect.height() > 0:
            s = min(self.MAX.width() / scene_rect.width(), self.MAX.height() / scene_rect.height())
            w = max(28, int(scene_rect.width() * s) + 8)
            h = max(28, int(scene_rect.height() * s) + 8)
            self.setFixedSize(w, h)
        self.update()

    def set_view_rect(self, rect: QRectF) -> None:
        self._view_rect = QRectF(rect)
        self.update()

    def _scale(self) -> tuple[float, float, float]:
        r = self._scene_rect
        s = min((self.width() - 8) / r.width(), (self.height() - 8) / r.height())
        ox = (self.width() - r.width() * s) / 2
        oy = (self.height() - r.height() * s) / 2
        return s, ox, oy

    def paintEvent(self, event) -> None:
        if self._overview is None or self._theme is None or self._scene_rect.isEmpty():
            return
        t = self._theme
        p = QPainter(self)
        p.setRenderHint(QPainter.Antialiasing, True)
        p.setPen(QPen(color(t.overlay_border), 1))
        p.setBrush(color(t.overlay_fill))
        p.drawRoundedRect(QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5), 5, 5)
        s, ox, oy = self._scale()
        if self._pixmap.isNull() or self._pixmap.size() != self.size():
            self._pixmap = QPixmap(self.size())
            self._pixmap.fill(Qt.transparent)
            pp = QPainter(self._pixmap)
            pp.translate(ox, oy)
            pp.scale(s, s)
            pp.translate(-self._scene_rect.topLeft())
            self._overview.draw(pp, marks=False)
            pp.end()
        p.drawPixmap(0, 0, self._pixmap)
        v = self._view_rect.intersected(self._scene_rect)
        if not v.isEmpty():
            r = QRectF(
                ox + (v.x() - self._scene_rect.x()) * s,
                oy + (v.y() - self._scene_rect.y()) * s,
                v.width() * s,
                v.height() * s,
            )
            r = r.adjusted(-1, -1, 1, 1)
            if r.width() < 6:
                r.adjust(-(6 - r.width()) / 2, 0, (6 - r.width()) / 2, 0)
            if r.height() < 6:
                r.adjust(0, -(6 - r.height()) / 2, 0, (6 - r.height()) / 2)
            view = color(t.minimap_view)
            p.setPen(QPen(view, 1.5))
            p.setBrush(QColor(view.red(), view.green(), view.blue(), 40))
            p.drawRect(r)
        p.end()

    def _emit(self, pos) -> None:
        s, ox, oy = self._scale()
        x = (pos.x() - ox) / s + self._scene_rect.x()
        y = (pos.y() - oy) / s + self._scene_rect.y()
        self.sig_center_on.emit(QPointF(x, y))

    def mousePressEvent(self, event) -> None:
        if event.button() == Qt.LeftButton:
            self._emit(event.position())
        event.accept()

    def mouseMoveEvent(self, event) -> None:
        if event.buttons() & Qt.LeftButton:
            self._emit(event.position())
        event.accept()

    def mouseReleaseEvent(self, event) -> None:
        event.accept()


LEGEND_ENTRIES = {
    "op": ("backward op", NodeStyle("op"), None),
    "leaf": ("leaf tensor (AccumulateGrad)", NodeStyle("leaf"), None),
    "custom": ("custom Function", NodeStyle("custom"), None),
    "other": ("other node", NodeStyle("other"), None),
    "group": ("collapsed module", NodeStyle("group"), None),
    "frame": ("module (double-click to fold)", None, None),
    "saved": ("saved for backward", None, None),
    "no_grad": ("does not require grad", NodeStyle("op", no_grad=True), None),
    "retained": ("retains .grad", NodeStyle("op", retained=True), None),
    "error": ("raised an error", NodeStyle("op", error=True), None),
    "stale": ("will fail: a saved tensor changed in place", NodeStyle("op", error=True, stale=True), None),
    "inplace": ("made by an in-place op", None, None),
    "sharing": ("dashed: same storage", None, None),
    "view": ("view of \u2026: shares its base's memory", None, None),
    "device": ("gradient crosses devices", None, None),
    "failed_op": ("failed in forward: the op the script raised in", None, None),
    "nonfinite": ("first NaN/inf: the op that made it, the node whose gradient did", None, None),
    "executed": ("executed", NodeStyle("op"), "executed"),
    "current": ("running now", NodeStyle("op"), "current"),
    "frontier": ("ready to run", NodeStyle("op"), "frontier"),
    "failed": ("failed", NodeStyle("op"), "failed"),
    "flow_backward": ("arrows: gradients, from the loss to the leaves", None, None),
    "flow_forward": ("arrows: forward order, from the inputs to the loss", None, None),
}


def paint_legend_entry(p: QPainter, key: str, sample: QRectF, theme: Theme, frame_width: float = 1.0,
                       saved_inset: float = 6.0) -> None:
    """The picture of one legend entry, the same on screen and in exports."""
    _, style, state = LEGEND_ENTRIES[key]
    if key.startswith("flow_"):
        y = sample.center().y()
        p.setPen(QPen(color(theme.edge), 1.4))
        p.drawLine(QPointF(sample.left() + 2, y), QPointF(sample.right() - 7, y))
        p.setPen(Qt.NoPen)
        p.setBrush(color(theme.edge))
        tip = sample.right() - 1
        p.drawPolygon([QPointF(tip, y), QPointF(tip - 7, y - 3.5), QPointF(tip - 7, y + 3.5)])
    elif key == "frame":
        p.setPen(QPen(color(theme.group_box_border), frame_width))
        p.setBrush(color(theme.group_box_fill))
        p.drawRoundedRect(sample, 5, 5)
    elif key == "saved":
        p.setPen(QPen(color(theme.saved_border), 1))
        p.setBrush(color(theme.saved_fill))
        p.drawRoundedRect(sample.adjusted(saved_inset, 3, -saved_inset, -3), 3, 3)
    elif style is None:
        paint_legend_sample(p, key, sample, theme)
    else:
        paint_node(p, sample, style, theme, "", 1.0, state)


def paint_overlay_frame(p: QPainter, rect, theme: Theme, title: str, right: float = 14) -> None:
    """An overlay's rounded panel and its bold title (the legend, the folded overlays' tabs)."""
    p.setRenderHint(QPainter.Antialiasing, True)
    p.setPen(QPen(color(theme.overlay_border), 1))
    p.setBrush(color(theme.overlay_fill))
    p.drawRoundedRect(QRectF(rect).adjusted(0.5, 0.5, -0.5, -0.5), 5, 5)
    p.setFont(font(theme.font_family, theme.small_font_px + 1, True))
    p.setPen(color(theme.text))
    p.drawText(QRectF(10, 4, rect.width() - right, 16), Qt.AlignLeft | Qt.AlignVCenter, title)


class Legend(QWidget):
    """What each shape and mark means, for the kinds present in the graph; click to fold or open."""

    sig_folded = Signal(bool)
    """The user folded (True) or unfolded the legend; the window remembers it."""

    ROW = 22

    def __init__(self, parent: QWidget):
        super().__init__(parent)
        self._entries: list[str] = []
        self._theme: Theme | None = None
        self.folded = False  # the user folded it (the window remembers it)
        self.tucked = False  # folded for want of a corner free of nodes (``Overlays.place``)
        self.pinned = False  # the user opened it: it stays open, off the current and selected nodes
        self.setCursor(Qt.PointingHandCursor)
        self._cached: tuple = (None, None)  # (what was drawn, its pixmap)
        self._tip()

    def set_entries(self, entries: list[str], theme: Theme) -> None:
        self._entries = [e for e in entries if e in LEGEND_ENTRIES]
        self._theme = theme
        self._resize()
        self.update()

    def entries(self) -> list[str]:
        return list(self._entries)

    def shown_folded(self) -> bool:
        """True when only the title tab shows: folded by the user, or tucked away."""
        return self.folded or self.tucked

    def size_for(self, folded: bool) -> QSize:
        """The legend's size open (``folded`` False) or as its title tab."""
        rows = 0 if folded else len(self._entries)
        width = 90.0
        if self._theme is not None and rows:
            fm = QFontMetricsF(font(self._theme.font_family, self._theme.small_font_px + 1))
            width = max(fm.horizontalAdvance(LEGEND_ENTRIES[k][0]) for k in self._entries) + 80
        return QSize(int(width), 24 + rows * self.ROW + (6 if rows else 0))

    def _resize(self) -> None:
        self.setFixedSize(self.size_for(self.shown_folded()))

    def _tip(self) -> None:
        self.setToolTip("Legend: folded to keep the graph clear; click or press L to open it" if self.tucked
                        else "Legend: click or press L to fold or unfold")

    def _replace(self) -> None:
        if self.parent() is not None and hasattr(self.parent(), "overlays"):
            self.parent().overlays.place()

    def set_folded(self, folded: bool) -> None:
        """Fold or unfold as the user last left it; unfolded, it still tucks away when it has no room."""
        if folded != self.folded or self.pinned:
            self.folded, self.pinned = folded, False
            self._resize()
            self.update()
            self._replace()

    def set_tucked(self, tucked: bool) -> None:
        """Fold into the title tab (True) because no corner is free, or open again."""
        if tucked != self.tucked:
            self.tucked = tucked
            self._resize()
            self._tip()
            self.update()

    def toggle(self) -> None:
        """The user's click or key: fold an open legend; open a folded one, which then stays open."""
        opening = self.shown_folded() or self.isHidden()  # hidden: no place kept the current node clear
        self.folded, self.pinned = not opening, opening
        self.set_tucked(False)
        self._resize()
        self.update()
        self._replace()
        self.sig_folded.emit(self.folded)

    def mousePressEvent(self, event) -> None:
        self.toggle()
        event.accept()

    def mouseReleaseEvent(self, event) -> None:
        event.accept()

    def paintEvent(self, event) -> None:
        # Drawn once into a pixmap: the legend sits over the graph, so it repaints with every frame.
        key = (tuple(self._entries), self._theme, self.shown_folded(), self.size(), self.devicePixelRatioF())
        if key != self._cached[0]:
            pixmap = QPixmap(self.size() * self.devicePixelRatioF())
            pixmap.setDevicePixelRatio(self.devicePixelRatioF())
            pixmap.fill(Qt.transparent)
            self._draw(pixmap)
            self._cached = (key, pixmap)
        p = QPainter(self)
        p.drawPixmap(0, 0, self._cached[1])
        p.end()

    def _draw(self, device) -> None:
        t = self._theme
        if t is None:
            return
        p = QPainter(device)
        paint_overlay_frame(p, self.rect(), t, "Legend " + ("\u25b8" if self.shown_folded() else "\u25be"), 20)
        if not self.shown_folded():
            y = 26.0
            for key in self._entries:
                text = LEGEND_ENTRIES[key][0]
                sample = QRectF(16, y + 2, 40, 17)
                paint_legend_entry(p, key, sample, t)
                p.setFont(font(t.font_family, t.small_font_px + 1))
                p.setPen(color(t.text))
                p.drawText(QRectF(66, y, self.width() - 72, self.ROW - 2), Qt.AlignLeft | Qt.AlignVCenter, text)
                y += self.ROW
        p.end()
