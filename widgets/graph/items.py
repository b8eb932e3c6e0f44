"""Scene items of the graph view: nodes, edges, group frames and saved-tensor boxes.

Each item caches its drawing in device coordinates and draws text only where it is
readable. ``paint_node`` is shared with the legend so the legend shows exactly what the
graph draws. Kinds differ by outline shape and line style, not colour alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QFont, QFontMetricsF, QPainter, QPainterPath, QPen, QPolygonF
from PySide6.QtWidgets import QGraphicsItem, QStyleOptionGraphicsItem

from core.layout.boxes import EdgePath, GroupBox, NodeBox, SavedBox
from widgets.theme import Theme

MIN_TEXT_PX = 6.0  # text smaller than this on screen is drawn as a summary at this size
STATES = ("executed", "current", "frontier", "failed")  # what set_node_states understands
_DEVICE_CACHE = QGraphicsItem.DeviceCoordinateCache


@lru_cache(maxsize=256)
def color(hex_str: str) -> QColor:
    """A QColor from ``#rrggbb`` or ``#rrggbbaa`` (CSS order, unlike Qt's ``#aarrggbb``)."""
    h = hex_str.lstrip("#")
    if len(h) == 8:
        return QColor(int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16), int(h[6:8], 16))
    return QColor("#" + h)


@lru_cache(maxsize=32)
def _metrics(family: str, px: int) -> QFontMetricsF:
    """Metrics of ``font(family, px)``: edge texts are measured thousands at a time while stepping."""
    return QFontMetricsF(font(family, px))


@lru_cache(maxsize=32)
def font(family: str, px: int, bold: bool = False) -> QFont:
    f = QFont(family)
    f.setPixelSize(px)
    f.setBold(bold)
    return f


@lru_cache(maxsize=4096)
def text_width(text: str, family: str, px: int, bold: bool) -> float:
    """How wide ``text`` is drawn in ``font(family, px, bold)``: tags and notes are sized by it."""
    return QFontMetricsF(font(family, px, bold)).horizontalAdvance(text)


def summary_px(lod: float, px: float, room: float) -> int:
    """Scene pixel size for text of ``px`` at ``lod``: ``px`` while it reads (>= 6 px on screen);
    below that, as large as 6 screen pixels when that fits ``room`` (scene px), else 0 (no text).
    Zoomed out, a chip then shows its first words rather than nothing."""
    if lod * px >= MIN_TEXT_PX:
        return int(px)
    big = MIN_TEXT_PX / max(lod, 1e-6)
    return int(big + 0.999) if big <= room else 0


@dataclass(frozen=True)
class NodeStyle:
    """How a node is drawn: ``shape`` is op, leaf, custom, other or group."""

    shape: str
    no_grad: bool = False
    retained: bool = False
    error: bool = False
    stale: bool = False  # a saved tensor was changed in place: backward will fail here


@lru_cache(maxsize=256)
def _pen(hex_str: str, width: float, style=Qt.SolidLine) -> QPen:
    """A shared pen (QPainter copies it, so callers must not change it)."""
    pen = QPen(color(hex_str), width, style)
    pen.setJoinStyle(Qt.RoundJoin)
    pen.setCapStyle(Qt.RoundCap)
    return pen


def node_outline(rect: QRectF, shape: str) -> QPainterPath:
    path = QPainterPath()
    if shape == "leaf":
        r = rect.height() / 2
        path.addRoundedRect(rect, r, r)
    elif shape == "other":
        path.addRect(rect)
    elif shape == "group":
        path.addRoundedRect(rect, 3, 3)
    else:
        path.addRoundedRect(rect, 7, 7)
    return path


_SHAPE_COLORS = {"op": "op", "leaf": "leaf", "custom": "custom", "group": "group"}


def node_colors(style: NodeStyle, theme: Theme) -> tuple[str, str]:
    prefix = _SHAPE_COLORS.get(style.shape, "other")
    fill, border = getattr(theme, prefix + "_fill"), getattr(theme, prefix + "_border")
    if style.no_grad:
        fill, border = theme.no_grad_fill, theme.no_grad_border
    if style.error:
        fill, border = theme.error_fill, theme.error
    return fill, border


_RINGS = {  # state -> theme colour, width, line style of the ring drawn around the node
    "current": ("current", 3.2, Qt.SolidLine),
    "frontier": ("frontier", 1.8, Qt.DashLine),
    "failed": ("failed", 3.0, Qt.SolidLine),
}


def paint_node(
    p: QPainter,
    rect: QRectF,
    style: NodeStyle,
    theme: Theme,
    label: str,
    lod: float,
    state: str | None = None,
    selected: bool = False,
    highlighted: bool = False,
) -> None:
    """Draw one node (shape, fill, border, badges, state marks and, when readable, its label)."""
    p.setRenderHint(QPainter.Antialiasing, True)
    outline = node_outline(rect, style.shape)
    lw = theme.line_width
    if highlighted:
        p.setPen(Qt.NoPen)
        glow = color(theme.highlight)
        p.setBrush(QColor(glow.red(), glow.green(), glow.blue(), 150))
        p.drawPath(node_outline(rect.adjusted(-5, -5, 5, 5), style.shape))
    fill, border = node_colors(style, theme)
    if state == "executed":
        fill = theme.executed_fill
    p.setBrush(color(fill))
    dash = Qt.DashLine if style.shape == "custom" or style.stale else Qt.DotLine if style.no_grad else Qt.SolidLine
    width = lw * (2.2 if style.error else 1.6 if style.shape == "group" else 1.0)
    p.setPen(_pen(border, width, dash))
    p.drawPath(outline)
    if style.shape == "group":  # a second outline: a stack of boxes
        p.setBrush(Qt.NoBrush)
        p.setPen(_pen(border, lw * 0.8))
        p.drawPath(node_outline(rect.adjusted(3, 3, -3, -3), "group"))
    ring = _RINGS.get(state) if state else None
    if ring:
        p.setBrush(Qt.NoBrush)
        p.setPen(_pen(getattr(theme, ring[0]), ring[1], ring[2]))
        p.drawPath(node_outline(rect.adjusted(-3.5, -3.5, 3.5, 3.5), style.shape))
    if selected:
        p.setBrush(Qt.NoBrush)
        p.setPen(_pen(theme.selection, 2.4))
        p.drawPath(node_outline(rect.adjusted(-6, -6, 6, 6), style.shape))
    if lod * theme.font_px >= MIN_TEXT_PX:
        _paint_label(p, rect, style, theme, label, state)
        _paint_badges(p, rect, style, theme, state)
    elif label:
        px = summary_px(lod, theme.font_px, rect.height() * 0.8)
        if px:  # the op name (or module path) alone, large enough to read
            f = font(theme.font_family, px, style.shape in ("leaf", "group"))
            p.setFont(f)
            p.setPen(color(theme.text))
            line = label.split("\n", 1)[0]
            p.drawText(rect, _ALIGN_CENTER, _elided(theme.font_family, px, f.bold(), line, round(rect.width() - 4, 1)))


def _paint_label(p: QPainter, rect: QRectF, style: NodeStyle, theme: Theme, label: str, state) -> None:
    lines = label.split("\n")
    pad = 8 + (rect.height() / 4 if style.shape == "leaf" else 0)
    inner = rect.adjusted(pad, 2, -pad, -2)
    main = font(theme.font_family, theme.font_px, style.shape in ("leaf", "group"))
    sub = font(theme.font_family, theme.font_px - 1)
    heights = [theme.font_px + 4] + [theme.font_px + 3] * (len(lines) - 1)
    y = rect.center().y() - sum(heights) / 2
    text_color = color(theme.muted_text if state == "executed" else theme.text)
    width = inner.width()
    for i, (line, lh) in enumerate(zip(lines, heights)):
        f = main if i == 0 else sub
        p.setFont(f)
        p.setPen(text_color if i == 0 else color(theme.muted_text))
        text = _elided(theme.font_family, f.pixelSize(), f.bold(), line, round(width, 1))
        p.drawText(QRectF(inner.left(), y, width, lh), _ALIGN_CENTER, text)
        y += lh


_ALIGN_CENTER = Qt.AlignCenter


@lru_cache(maxsize=4096)
def _elided(family: str, px: int, bold: bool, text: str, width: float) -> str:
    """Node labels repeat (every AddmmBackward0 is cut the same way): measure each once."""
    return QFontMetricsF(font(family, px, bold)).elidedText(text, Qt.ElideMiddle, width)


def _paint_badges(p: QPainter, rect: QRectF, style: NodeStyle, theme: Theme, state) -> None:
    if style.retained:  # a diamond on the top-right corner: .grad is kept
        c = QPointF(rect.right() - 4, rect.top() + 1)
        p.setPen(_pen(theme.background, 1.0))
        p.setBrush(color(theme.retained))
        p.drawPolygon(QPolygonF([c + QPointF(0, -6), c + QPointF(6, 0), c + QPointF(0, 6), c + QPointF(-6, 0)]))
    if style.error or state == "failed":  # "!" in a circle on the top-left corner
        c = QPointF(rect.left() + 2, rect.top() + 1)
        p.setPen(Qt.NoPen)
        p.setBrush(color(theme.error if style.error else theme.failed))
        p.drawEllipse(c, 7, 7)
        p.setPen(_pen(theme.background, 2.0))
        p.drawLine(c + QPointF(0, -3.5), c + QPointF(0, 1))
        p.drawPoint(c + QPointF(0, 4))
    if state == "executed":  # a check mark on the bottom-right corner
        c = QPointF(rect.right() - 2, rect.bottom() - 1)
        p.setPen(_pen(theme.background, 1.0))
        p.setBrush(color(theme.executed_mark))
        p.drawEllipse(c, 7, 7)
        p.setPen(_pen(theme.background, 2.0))
        p.drawPolyline(QPolygonF([c + QPointF(-3.5, 0), c + QPointF(-1, 2.8), c + QPointF(3.5, -2.5)]))
    if state == "current":  # a play triangle on the left edge
        c = QPointF(rect.left() - 1, rect.center().y())
        p.setPen(_pen(theme.background, 1.0))
        p.setBrush(color(theme.current))
        p.drawPolygon(QPolygonF([c + QPointF(-5, -7), c + QPointF(7, 0), c + QPointF(-5, 7)]))


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
            p, self._rect, self.style, self.theme, self.box.label, lod, self.state, self.selected, self.highlighted
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
        self.shape_text = shape_text
        self.show_shape = False
        self.value_text = ""
        self._curved = curved
        self._path: QPainterPath | None = None  # built on first paint: most edges are never seen
        xs = [p[0] for p in edge.points]
        ys = [p[1] for p in edge.points]
        x0, y0 = min(xs), min(ys)
        self._line_bounds = QRectF(x0 - 5, y0 - 3, max(xs) - x0 + 10, max(ys) - y0 + 6)
        self._bounds = self._line_bounds
        self._text_rect = QRectF()
        self._anchor: tuple[float, float] | None = None  # where the text sits (see _label_anchor)
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

    def _text(self) -> str:
        parts = [t for t in ((self.shape_text if self.show_shape else ""), self.value_text) if t]
        return "  ".join(parts)

    def set_texts(self, *, show_shape: bool | None = None, value: str | None = None) -> None:
        if show_shape is not None:
            self.show_shape = show_shape
        if value is not None:
            self.value_text = value
        text = self._text()
        rect = QRectF()
        if text:
            fm = _metrics(self.theme.font_family, self.theme.small_font_px)
            w, h = fm.horizontalAdvance(text) + 8, fm.height() + 2
            if self._anchor is None:
                self._anchor = _label_anchor(self.edge.points, self._curved)
            ax, ay = self._anchor
            rect = QRectF(ax + 4, ay - h / 2, w, h)
        if rect != self._text_rect:
            self.prepareGeometryChange()
            self._text_rect = rect
            # Room for the text enlarged twice about its centre (zoomed out, see ``summary_px``).
            big = rect.adjusted(-rect.width() / 2, -rect.height() / 2, rect.width() / 2, rect.height() / 2)
            self._bounds = self._line_bounds.united(big) if not rect.isNull() else self._line_bounds
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

    def paint(self, p: QPainter, option: QStyleOptionGraphicsItem, widget=None) -> None:
        t = self.theme
        lod = option.levelOfDetailFromTransform(p.worldTransform())
        p.setRenderHint(QPainter.Antialiasing, True)
        c = t.edge_active if self.active else getattr(t, self.accent) if self.accent else t.edge
        bold = self.active or self.accent is not None
        width = t.line_width * (2.0 if bold else 1.0) * (1.0 + 0.35 * min(self.edge.count - 1, 3))
        self._ensure_path()
        p.setPen(_pen(c, width))
        p.setBrush(Qt.NoBrush)
        p.drawPath(self._path)
        p.setPen(Qt.NoPen)
        p.setBrush(color(c))
        p.drawPolygon(self._arrow)
        text = self._text()
        px = summary_px(lod, t.small_font_px, 2.0 * t.small_font_px) if text else 0
        if px:
            r = self._text_rect
            if px != t.small_font_px:  # zoomed out: the same text, enlarged about its centre
                k = px / t.small_font_px
                r = QRectF(r.center().x() - r.width() * k / 2, r.center().y() - r.height() * k / 2,
                           r.width() * k, r.height() * k)
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

    def paint(self, p: QPainter, option: QStyleOptionGraphicsItem, widget=None) -> None:
        t = self.theme
        lod = option.levelOfDetailFromTransform(p.worldTransform())
        p.setRenderHint(QPainter.Antialiasing, True)
        p.setBrush(color(t.group_box_fill))
        p.setPen(_pen(t.group_box_border, t.line_width * 0.9))
        p.drawRoundedRect(self._rect, 8, 8)
        if lod * t.small_font_px >= MIN_TEXT_PX:
            f = font(t.font_family, t.small_font_px + 1, True)
            p.setFont(f)
            p.setPen(color(t.group_text))
            r = QRectF(10, 4, self._rect.width() - 20, 14)
            # The fold sign is for the screen (widget is None when a scene is rendered for export).
            sign = "\u2212 " if widget is not None else ""
            text = QFontMetricsF(f).elidedText(sign + self.group.label, Qt.ElideMiddle, r.width())
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
        p.setPen(_pen(border, 0.8, Qt.DotLine))
        p.drawLine(QPointF(self._link_x, self._link_y), QPointF(0, self._rect.height() / 2))
        style = Qt.DashLine if state in ("freed", "stale") else Qt.DotLine if self.no_grad else Qt.SolidLine
        p.setPen(_pen(border, 1.0 if state != "stale" else 2.0, style))
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
