"""Scene items of the graph view: nodes, edges, group frames and saved-tensor boxes.

Each item caches its drawing in device coordinates and draws text only where it is
readable; how a box is painted is ``widgets.graph.painting``'s (shared with the legend).
"""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QFontMetricsF, QPainter, QPainterPath, QPainterPathStroker, QPolygonF
from PySide6.QtWidgets import QGraphicsItem, QStyleOptionGraphicsItem

from core.layout.boxes import EdgePath, GroupBox, NodeBox, SavedBox
from core.model.values import compact_values, edge_label
from widgets.display_text import cut_middle
from widgets.graph.labels import sample_path
from widgets.graph.painting import (
    MIN_TEXT_PX, NodeStyle, color, font, node_outline, paint_node, pen, summary_px, text_metrics,
)
from widgets.theme import Theme

_DEVICE_CACHE = QGraphicsItem.DeviceCoordinateCache


class NodeItem(QGraphicsItem):
    """One trace node, or one collapsed group (``group:<path>``)."""

    def __init__(self, box: NodeBox, style: NodeStyle, theme: Theme):
        super().__init__()
        self.node_id = box.id
        self.box = box
        self.style = style
        self.theme = theme
        self.state: str | None = None
        self.selected = False
        self.highlighted = False
        self.tint: dict = {}  # theme fields drawn otherwise (``set_tint``)
        self._tinted: tuple = (None, None)  # (theme, the theme with the tint)
        self._rect = QRectF(0, 0, box.w, box.h)
        self._bounds = self._rect.adjusted(-10, -10, 10, 10)
        self.setPos(box.x, box.y)  # stacking: frames < edges < nodes, by z and insertion order
        self.setCacheMode(_DEVICE_CACHE)

    def boundingRect(self) -> QRectF:
        return self._bounds

    def shape(self) -> QPainterPath:
        return node_outline(self._rect, self.style.shape)

    def paint(self, p: QPainter, option: QStyleOptionGraphicsItem, widget=None) -> None:
        lod = option.levelOfDetailFromTransform(p.worldTransform())
        paint_node(
            p, self._rect, self.style, tinted(self), self.box.label, lod, self.state, self.selected, self.highlighted
        )

    def set_state(self, state: str | None) -> None:
        if state != self.state:
            self.state = state
            self.update()

    def set_selected(self, selected: bool) -> None:
        if selected != self.selected:
            self.selected = selected
            self.update()

    def set_highlighted(self, highlighted: bool) -> None:
        if highlighted != self.highlighted:
            self.highlighted = highlighted
            self.update()

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.update()

    def set_tint(self, tint: dict) -> None:
        """Draw with these theme fields replaced (``{"leaf_fill": "#21918c"}``: Colour by Gradient
        Norm); ``{}`` for the theme's own colours."""
        set_tint(self, tint)


def tinted(item) -> Theme:
    """The theme ``item`` is drawn in: its theme with its tint, made once per theme and tint."""
    if not item.tint:
        return item.theme
    if item._tinted[0] is not item.theme:
        item._tinted = (item.theme, replace(item.theme, **item.tint))
    return item._tinted[1]


def set_tint(item, tint: dict) -> None:
    if tint != item.tint:
        item.tint, item._tinted = dict(tint), (None, None)
        item.update()


def edge_path(points: list[tuple[float, float]], curved: bool = True, horizontal: bool = False) -> QPainterPath:
    """Straight runs through layer bands, S-curves (vertical tangents, horizontal ones for a
    left-to-right layout) across the gaps."""
    path = QPainterPath(QPointF(*points[0]))
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if horizontal:
            if not curved or abs(y1 - y0) < 0.5:
                path.lineTo(x1, y1)
            else:
                mx = (x0 + x1) / 2
                path.cubicTo(mx, y0, mx, y1, x1, y1)
        elif not curved or abs(x1 - x0) < 0.5:
            path.lineTo(x1, y1)
        else:
            my = (y0 + y1) / 2
            path.cubicTo(x0, my, x1, my, x1, y1)
    return path


class EdgeItem(QGraphicsItem):
    """An edge with an arrowhead at the node the gradient flows into, and optional texts."""

    ARROW = 7.0

    def __init__(self, edge: EdgePath, theme: Theme, shape_text: str = "", curved: bool = True,
                 horizontal: bool = False):
        super().__init__()
        self.edge = edge
        self._horizontal = horizontal
        self.key = (edge.src, edge.dst)
        self.theme = theme
        self.active = False
        self.accent: str | None = None  # a theme colour name: the edge is drawn bold in it
        self.tint: dict = {}  # theme fields drawn otherwise (``set_tint``)
        self._tinted: tuple = (None, None)  # (theme, the theme with the tint)
        self.shape_text = shape_text
        self.show_shape = False
        self.value_text = ""  # the gradient a step sent along the edge ('grad = [2, 2]')
        self.mark_text = ""  # a broadcast or dtype change on the edge ('[4, 3] → Σ → [3]')
        self.grad_text = ""  # with Values on: the gradient the call sent ('grad = [8, 8, 8]')
        self.stepping = False  # a step view is shown: only stepped gradients are written
        self._curved = curved
        self._path: QPainterPath | None = None  # built on first paint: most edges are never seen
        xs = [p[0] for p in edge.points]
        ys = [p[1] for p in edge.points]
        x0, y0 = min(xs), min(ys)
        self._line_bounds = QRectF(x0 - 5, y0 - 3, max(xs) - x0 + 10, max(ys) - y0 + 6)
        self._bounds = self._line_bounds
        self._text_rect = QRectF()
        self._size = (0.0, 0.0)
        self._form = 0  # which of ``label_forms`` is drawn
        self._shape: QPainterPath | None = None
        self._leader: tuple[QPointF, QPointF] | None = None
        self.setCacheMode(_DEVICE_CACHE)

    def _ensure_path(self) -> None:
        if self._path is not None:
            return
        pts = self.edge.points
        (xa, ya), (xb, yb) = pts[-2], pts[-1]
        if not self._curved:
            d = _unit(xb - xa, yb - ya)
        elif self._horizontal:
            d = (1.0 if xb >= xa else -1.0, 0.0)
        else:
            d = (0.0, 1.0 if yb >= ya else -1.0)
        base = (xb - d[0] * self.ARROW, yb - d[1] * self.ARROW)
        self._path = edge_path(pts[:-1] + [base], self._curved, self._horizontal)
        nx, ny, half = -d[1], d[0], self.ARROW * 0.5
        self._arrow = QPolygonF(
            [
                QPointF(xb, yb),
                QPointF(base[0] + nx * half, base[1] + ny * half),
                QPointF(base[0] - nx * half, base[1] - ny * half),
            ]
        )

    def boundingRect(self) -> QRectF:
        return self._bounds

    def shape(self) -> QPainterPath:
        """The line and the label: what hovering shows the edge's tooltip over."""
        if self._shape is None:  # made on first hover: most edges are never hovered
            self._ensure_path()
            stroker = QPainterPathStroker()
            stroker.setWidth(6)
            self._shape = stroker.createStroke(self._path)
            if not self._text_rect.isNull():
                self._shape.addRect(self._text_rect)
        return self._shape

    def label_text(self) -> str:
        """The one label of the edge as drawn (see ``label_forms``)."""
        forms = self.label_forms()
        return forms[min(self._form, len(forms) - 1)] if forms else ""

    def label_forms(self) -> list[str]:
        """The edge's label, whole and (when it differs) shorter: its shape and broadcast/dtype chip,
        then '= values' (the gradient a step gave it; with Values on and no stepping, the one the
        call sent). The placer takes the shorter form only where the whole one finds no room."""
        value = self.value_text if self.stepping else (self.value_text or self.grad_text)
        parts = [t for t in ((self.shape_text if self.show_shape else ""), self.mark_text) if t]
        whole = edge_label(parts, value)
        if not whole:
            return []
        forms = [whole]
        for level in (1, 2):
            short = edge_label(parts, compact_values(value, level))
            if short != forms[-1]:
                forms.append(short)
        if self.show_shape and self.shape_text and value:  # the shape is in the inspector too
            short = edge_label([self.mark_text] if self.mark_text else [], compact_values(value, 2))
            if short not in forms:
                forms.append(short)
        return forms

    def label_sizes(self) -> list[tuple[float, float]]:
        """The size of each of ``label_forms``."""
        fm = text_metrics(self.theme.font_family, self.theme.small_font_px)
        return [(fm.horizontalAdvance(t) + 8, fm.height() + 2) for t in self.label_forms()]

    def set_texts(self, *, show_shape: bool | None = None, value: str | None = None, mark: str | None = None,
                  grad: str | None = None, stepping: bool | None = None) -> None:
        """New label parts; the label keeps its spot until ``set_label_at`` (the label placer) moves it."""
        if show_shape is not None:
            self.show_shape = show_shape
        if value is not None:
            self.value_text = value
        if mark is not None:
            self.mark_text = mark
        if grad is not None:
            self.grad_text = grad
        if stepping is not None:
            self.stepping = stepping
        if any(v is not None for v in (show_shape, value, mark, grad, stepping)):
            self._form = 0  # new text: the whole of it, until the placer finds it no room
        text = self.label_text()
        size = (0.0, 0.0)
        if text:
            fm = text_metrics(self.theme.font_family, self.theme.small_font_px)
            size = (fm.horizontalAdvance(text) + 8, fm.height() + 2)
        if size == self._size:
            self.update()
            return
        self._size = size
        if not text:
            self._set_label(QRectF(), None)
            return
        r = self._text_rect
        if r.isNull():  # until placed: beside the middle of its last gap crossing
            ax, ay = _label_anchor(self.edge.points, self._curved)
            r = QRectF(ax + 4, ay - size[1] / 2, 0, 0)
        self._set_label(QRectF(r.x(), r.center().y() - size[1] / 2, size[0], size[1]), self._leader)

    def label_size(self) -> tuple[float, float]:
        """The label's width and height (0, 0 without one)."""
        return self._size

    def label_rect(self) -> QRectF:
        """The label's box in scene coordinates (null without one)."""
        return QRectF(self._text_rect)

    def leader(self) -> tuple[QPointF, QPointF] | None:
        """The short line from the edge to its label, when the label sits off the line."""
        return self._leader

    def horizontal(self) -> bool:
        """Drawn for a left-to-right layout (S-curves with horizontal tangents)."""
        return self._horizontal

    def arrow_rect(self) -> QRectF:
        """The arrowhead's box in scene coordinates (no label covers one)."""
        self._ensure_path()
        return self._arrow.boundingRect().adjusted(-1, -1, 1, 1)

    def line_points(self) -> list[tuple[float, float]]:
        """The drawn line, sampled (what the label placer measures distances to)."""
        return sample_path(self.edge.points, self._curved, self._horizontal)

    def set_label_at(self, rect: tuple[float, float, float, float], a=None, b=None, form: int = 0) -> None:
        """Put the label (``label_forms()[form]``) at ``rect`` (x0, y0, x1, y1), joined to its edge
        by a leader from ``a`` to ``b``."""
        self._form = form
        self._size = (rect[2] - rect[0], rect[3] - rect[1])
        self._set_label(QRectF(QPointF(rect[0], rect[1]), QPointF(rect[2], rect[3])),
                        (QPointF(*a), QPointF(*b)) if a is not None else None)

    def _set_label(self, rect: QRectF, leader) -> None:
        if rect == self._text_rect and leader == self._leader:
            self.update()
            return
        self.prepareGeometryChange()
        self._text_rect, self._leader, self._shape = rect, leader, None
        if rect.isNull():
            self._bounds = self._line_bounds
        else:
            # Room for the text enlarged twice about its centre (zoomed out, see ``summary_px``).
            big = rect.adjusted(-rect.width() / 2, -rect.height() / 2, rect.width() / 2, rect.height() / 2)
            self._bounds = self._line_bounds.united(big)
            if leader is not None:
                self._bounds = self._bounds.united(QRectF(leader[0], leader[1]).normalized().adjusted(-2, -2, 2, 2))
        self.update()

    def set_active(self, active: bool) -> None:
        """Drawn emphasised: the edge touches the selected node."""
        if active != self.active:
            self.active = active
            self.update()

    def set_accent(self, accent: str | None) -> None:
        """Drawn bold in the theme colour ``accent`` (e.g. "device"); None for the plain edge."""
        if accent != self.accent:
            self.accent = accent
            self.update()

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.set_texts()

    def set_tint(self, tint: dict) -> None:
        """Draw with these theme fields replaced (``{"edge": "#21918c"}``: Colour by Gradient Norm);
        ``{}`` for the theme's own colours."""
        set_tint(self, tint)

    def paint(self, p: QPainter, option: QStyleOptionGraphicsItem, widget=None) -> None:
        t = tinted(self)
        lod = option.levelOfDetailFromTransform(p.worldTransform())
        p.setRenderHint(QPainter.Antialiasing, True)
        c = t.edge_active if self.active else getattr(t, self.accent) if self.accent else t.edge
        bold = self.active or self.accent is not None
        width = t.line_width * (2.0 if bold else 1.0) * (1.0 + 0.35 * min(self.edge.count - 1, 3))
        self._ensure_path()
        p.setPen(pen(c, width))
        p.setBrush(Qt.NoBrush)
        p.drawPath(self._path)
        p.setPen(Qt.NoPen)
        p.setBrush(color(c))
        p.drawPolygon(self._arrow)
        text = self.label_text()
        px = summary_px(lod, t.small_font_px, 2.0 * t.small_font_px) if text else 0
        if px:
            r = self._text_rect
            if px != t.small_font_px:  # zoomed out: the same text, enlarged about its centre
                k = px / t.small_font_px
                r = QRectF(r.center().x() - r.width() * k / 2, r.center().y() - r.height() * k / 2,
                           r.width() * k, r.height() * k)
            if self._leader is not None and px == t.small_font_px:
                p.setPen(pen(c, 0.8))
                p.drawLine(*self._leader)
            p.setPen(pen(t.device, 0.8) if self.mark_text else Qt.NoPen)
            p.setBrush(color(t.background))
            p.drawRoundedRect(r, 3, 3)
            p.setFont(font(t.font_family, px))
            p.setPen(color(t.edge_text))
            p.drawText(r, Qt.AlignCenter, text)


def _unit(dx: float, dy: float) -> tuple[float, float]:
    n = (dx * dx + dy * dy) ** 0.5 or 1.0
    return dx / n, dy / n


def _label_anchor(points, curved: bool) -> tuple[float, float]:
    """Middle of the last gap crossing, near the node the edge feeds."""
    for i in range(len(points) - 1, 0, -1):
        (x0, y0), (x1, y1) = points[i - 1], points[i]
        if abs(x1 - x0) >= 0.5 or not curved:
            return (x0 + x1) / 2, (y0 + y1) / 2
    (x0, y0), (x1, y1) = points[-2], points[-1]
    return (x0 + x1) / 2, (y0 + y1) / 2


class GroupBoxItem(QGraphicsItem):
    """The frame of an expanded module group; double-click collapses it."""

    def __init__(self, group: GroupBox, theme: Theme):
        super().__init__()
        self.path = group.path
        self.group = group
        self.theme = theme
        self._rect = QRectF(0, 0, group.w, group.h)
        self.setPos(group.x, group.y)
        self.setZValue(-1 + 0.01 * group.depth)
        self.setCacheMode(_DEVICE_CACHE)
        self.setToolTip(f"module {group.path}\n{group.count:,} nodes\ndouble-click to collapse")

    def boundingRect(self) -> QRectF:
        return self._rect.adjusted(-2, -2, 2, 2)

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.update()

    def title_rect(self) -> QRectF:
        """Where the frame's title is written, in scene coordinates (labels and notes keep off it)."""
        t = self.theme
        f = font(t.font_family, t.small_font_px + 1, True)
        w = min(QFontMetricsF(f).horizontalAdvance("\u2212 " + cut_middle(self.group.label)), self._rect.width() - 20)
        return QRectF(self.group.x + 10, self.group.y + 4, max(w, 0.0), 14)

    def paint(self, p: QPainter, option: QStyleOptionGraphicsItem, widget=None) -> None:
        t = self.theme
        lod = option.levelOfDetailFromTransform(p.worldTransform())
        p.setRenderHint(QPainter.Antialiasing, True)
        p.setBrush(color(t.group_box_fill))
        p.setPen(pen(t.group_box_border, t.line_width * 0.9))
        p.drawRoundedRect(self._rect, 8, 8)
        if lod * t.small_font_px >= MIN_TEXT_PX:
            f = font(t.font_family, t.small_font_px + 1, True)
            p.setFont(f)
            p.setPen(color(t.group_text))
            r = QRectF(10, 4, self._rect.width() - 20, 14)
            # The fold sign is for the screen (widget is None when a scene is rendered for export).
            sign = "\u2212 " if widget is not None else ""
            text = QFontMetricsF(f).elidedText(sign + cut_middle(self.group.label), Qt.ElideMiddle, r.width())
            p.drawText(r, Qt.AlignLeft | Qt.AlignVCenter, text)


class SavedItem(QGraphicsItem):
    """A tensor the node saved for backward: a small tab beside the node."""

    def __init__(self, saved: SavedBox, node_box: NodeBox, theme: Theme, no_grad: bool, tooltip: str):
        super().__init__()
        self.saved = saved
        self.theme = theme
        self.no_grad = no_grad
        self._rect = QRectF(0, 0, saved.w, saved.h)
        self._link_y = node_box.y + node_box.h / 2 - saved.y
        self._link_x = node_box.x + node_box.w - saved.x
        self.setPos(saved.x, saved.y)
        self.setCacheMode(_DEVICE_CACHE)
        self.setToolTip(tooltip)

    def boundingRect(self) -> QRectF:
        return self._rect.united(QRectF(self._link_x, min(self._link_y, 0), 1, abs(self._link_y) + 1)).adjusted(
            -2, -2, 2, 2
        )

    def paint(self, p: QPainter, option: QStyleOptionGraphicsItem, widget=None) -> None:
        t = self.theme
        lod = option.levelOfDetailFromTransform(p.worldTransform())
        p.setRenderHint(QPainter.Antialiasing, True)
        state = self.saved.state
        border = t.error if state == "stale" else t.no_grad_border if self.no_grad else t.saved_border
        p.setPen(pen(border, 0.8, Qt.DotLine))
        p.drawLine(QPointF(self._link_x, self._link_y), QPointF(0, self._rect.height() / 2))
        style = Qt.DashLine if state in ("freed", "stale") else Qt.DotLine if self.no_grad else Qt.SolidLine
        p.setPen(pen(border, 1.0 if state != "stale" else 2.0, style))
        p.setBrush(color(t.no_grad_fill if self.no_grad else t.error_fill if state == "stale" else t.saved_fill))
        p.drawRoundedRect(self._rect, 3, 3)
        px = summary_px(lod, t.small_font_px, self._rect.height())
        if px:
            p.setFont(font(t.font_family, px))
            p.setPen(color(t.muted_text if state == "freed" else t.text))
            label = self.saved.label if px == t.small_font_px else self.saved.label.split(" ", 1)[0]
            p.drawText(self._rect, Qt.AlignCenter, label)

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.update()
