"""How the graph's boxes and texts are painted: colours, fonts, text sizes, node outlines.

``paint_node`` draws a box the same way for a scene item (``widgets.graph.items.NodeItem``),
the legend and the minimap, so the legend shows exactly what the graph draws. Kinds differ by
outline shape and line style, not colour alone. Colours, fonts, pens and text metrics are
cached: a big graph asks for the same few thousands of times.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QFont, QFontMetricsF, QPainter, QPainterPath, QPen, QPolygonF

from widgets.display_text import cut_middle
from widgets.theme import Theme

MIN_TEXT_PX = 6.0  # text smaller than this on screen is drawn as a summary at this size
STATES = ("executed", "current", "frontier", "failed")  # what set_node_states understands


@lru_cache(maxsize=256)
def color(hex_str: str) -> QColor:
    """A QColor from ``#rrggbb`` or ``#rrggbbaa`` (CSS order, unlike Qt's ``#aarrggbb``)."""
    h = hex_str.lstrip("#")
    if len(h) == 8:
        return QColor(int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16), int(h[6:8], 16))
    return QColor("#" + h)


@lru_cache(maxsize=32)
def text_metrics(family: str, px: int) -> QFontMetricsF:
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
def pen(hex_str: str, width: float, style=Qt.SolidLine) -> QPen:
    """A shared pen (QPainter copies it, so callers must not change it)."""
    out = QPen(color(hex_str), width, style)
    out.setJoinStyle(Qt.RoundJoin)
    out.setCapStyle(Qt.RoundCap)
    return out


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
    p.setPen(pen(border, width, dash))
    p.drawPath(outline)
    if style.shape == "group":  # a second outline: a stack of boxes
        p.setBrush(Qt.NoBrush)
        p.setPen(pen(border, lw * 0.8))
        p.drawPath(node_outline(rect.adjusted(3, 3, -3, -3), "group"))
    ring = _RINGS.get(state) if state else None
    if ring:
        p.setBrush(Qt.NoBrush)
        p.setPen(pen(getattr(theme, ring[0]), ring[1], ring[2]))
        p.drawPath(node_outline(rect.adjusted(-3.5, -3.5, 3.5, 3.5), style.shape))
    if selected:
        p.setBrush(Qt.NoBrush)
        p.setPen(pen(theme.selection, 2.4))
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


def _elided(family: str, px: int, bold: bool, text: str, width: float) -> str:
    return _elided_fitting(family, px, bold, cut_middle(text), width)


@lru_cache(maxsize=4096)
def _elided_fitting(family: str, px: int, bold: bool, text: str, width: float) -> str:
    """Node labels repeat (every AddmmBackward0 is cut the same way): measure each once."""
    return QFontMetricsF(font(family, px, bold)).elidedText(text, Qt.ElideMiddle, width)


def _paint_badges(p: QPainter, rect: QRectF, style: NodeStyle, theme: Theme, state) -> None:
    if style.retained:  # a diamond on the top-right corner: .grad is kept
        c = QPointF(rect.right() - 4, rect.top() + 1)
        p.setPen(pen(theme.background, 1.0))
        p.setBrush(color(theme.retained))
        p.drawPolygon(QPolygonF([c + QPointF(0, -6), c + QPointF(6, 0), c + QPointF(0, 6), c + QPointF(-6, 0)]))
    if style.error or state == "failed":  # "!" in a circle on the top-left corner
        c = QPointF(rect.left() + 2, rect.top() + 1)
        p.setPen(Qt.NoPen)
        p.setBrush(color(theme.error if style.error else theme.failed))
        p.drawEllipse(c, 7, 7)
        p.setPen(pen(theme.background, 2.0))
        p.drawLine(c + QPointF(0, -3.5), c + QPointF(0, 1))
        p.drawPoint(c + QPointF(0, 4))
    if state == "executed":  # a check mark on the bottom-right corner
        c = QPointF(rect.right() - 2, rect.bottom() - 1)
        p.setPen(pen(theme.background, 1.0))
        p.setBrush(color(theme.executed_mark))
        p.drawEllipse(c, 7, 7)
        p.setPen(pen(theme.background, 2.0))
        p.drawPolyline(QPolygonF([c + QPointF(-3.5, 0), c + QPointF(-1, 2.8), c + QPointF(3.5, -2.5)]))
    if state == "current":  # a play triangle on the left edge
        c = QPointF(rect.left() - 1, rect.center().y())
        p.setPen(pen(theme.background, 1.0))
        p.setBrush(color(theme.current))
        p.drawPolygon(QPolygonF([c + QPointF(-5, -7), c + QPointF(7, 0), c + QPointF(-5, 7)]))

