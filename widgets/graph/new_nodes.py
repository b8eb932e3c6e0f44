"""The nodes a paused forward pass made since its last pause, marked on the graph.

A debug run paused in forward shows the live graph; the nodes the lines run since the previous
pause get a glow (a soft, wide outline in the "new" colour drawn behind the box) and a small
"new" pill at the box's top right corner, so a class sees the graph grow line by line. A node
inside a folded module marks the module's box. The marks follow the view's scenes: a new
layout (a fold opened, a direction changed) draws them again (``GraphView.sig_scene_ready``).
"""

from __future__ import annotations

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import QGraphicsItem
from shiboken6 import isValid

from widgets.graph.painting import MIN_TEXT_PX, font, node_outline, text_width

# The "new" colour per theme: apart from selection (blue), search (yellow), stepping (orange).
NEW_COLOURS = {"light": "#0ca678", "dark": "#38d9a9", "print": "#000000"}
GLOW_Z = -0.5  # behind the boxes (z 0), above module frames
TAG_Z = 2.0  # over everything, as the other marks' tags
GLOW_PX = 6.0  # how far the glow reaches outside the box, in scene units
TAG_TEXT = "new"


def new_colour(theme) -> QColor:
    return QColor(NEW_COLOURS.get(getattr(theme, "name", "light"), NEW_COLOURS["light"]))


class NewGlowItem(QGraphicsItem):
    """A soft outline around one box: three strokes fading outwards, the inner one solid."""

    def __init__(self, box_id: str, rect: QRectF, shape: str, colour: QColor, tip: str):
        super().__init__()
        self.box_id = box_id
        self.rect = QRectF(rect)
        self.shape_name = shape
        self.colour = QColor(colour)
        self.setZValue(GLOW_Z)
        self.setToolTip(tip)
        self.setAcceptedMouseButtons(Qt.MouseButton.NoButton)

    def boundingRect(self) -> QRectF:
        return self.rect.adjusted(-GLOW_PX - 2, -GLOW_PX - 2, GLOW_PX + 2, GLOW_PX + 2)

    def paint(self, p: QPainter, option, widget=None) -> None:
        p.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        p.setBrush(Qt.BrushStyle.NoBrush)
        for width, alpha in ((GLOW_PX * 2, 50), (GLOW_PX * 1.2, 95), (3.0, 255)):
            c = QColor(self.colour)
            c.setAlpha(alpha)
            p.setPen(QPen(c, width))
            p.drawPath(node_outline(self.rect, self.shape_name))


class NewTagItem(QGraphicsItem):
    """The "new" pill on a box's top right corner."""

    def __init__(self, box_id: str, rect: QRectF, colour: QColor, theme, tip: str):
        super().__init__()
        self.box_id = box_id
        self.theme = theme
        self.colour = QColor(colour)
        px = theme.small_font_px
        w, h = text_width(TAG_TEXT, theme.font_family, px, True) + 10, px + 5.0
        self.rect = QRectF(rect.right() - w * 0.75, rect.top() - h * 0.6, w, h)
        self.setZValue(TAG_Z)
        self.setToolTip(tip)
        self.setAcceptedMouseButtons(Qt.MouseButton.NoButton)

    def boundingRect(self) -> QRectF:
        return self.rect.adjusted(-1, -1, 1, 1)

    def paint(self, p: QPainter, option, widget=None) -> None:
        p.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        p.setPen(QPen(self.colour, 1.2))
        p.setBrush(self.colour)
        r = self.rect.height() / 2
        p.drawRoundedRect(self.rect, r, r)
        lod = option.levelOfDetailFromTransform(p.worldTransform()) if option is not None else 1.0
        if self.theme.small_font_px * lod >= MIN_TEXT_PX:
            p.setPen(QColor("#ffffff"))
            p.setFont(font(self.theme.font_family, self.theme.small_font_px, True))
            p.drawText(self.rect, Qt.AlignmentFlag.AlignCenter, TAG_TEXT)


class NewNodeMarks:
    """Marks ``nodes`` (trace node ids) of the call a ``GraphView`` shows as new; follows its scenes."""

    def __init__(self, view):
        self.view = view
        self.nodes: frozenset[str] = frozenset()
        self.tip = "Made since the last pause"
        self.items: list[QGraphicsItem] = []
        view.sig_scene_ready.connect(lambda _call_id: self.redraw())

    def set_nodes(self, nodes, tip: str | None = None) -> None:
        """Mark these node ids (none: clear); drawn now if the scene is laid out, else when it is."""
        self.nodes = frozenset(nodes or ())
        if tip:
            self.tip = tip
        self.redraw()

    def clear(self) -> None:
        self.set_nodes(())

    def boxes(self) -> list[str]:
        """The boxes marked: each new node's own box, or its folded module's."""
        return sorted({i.box_id for i in self.items if isinstance(i, NewGlowItem) and isValid(i)})

    def redraw(self) -> None:
        view = self.view
        scene = view.scene()
        for item in self.items:
            if isValid(item) and item.scene() is scene:
                scene.removeItem(item)
        self.items = []
        if not self.nodes or view.is_pending() or view.graph_layout() is None:
            return
        theme, colour = view.theme(), new_colour(view.theme())
        done = set()
        for node_id in sorted(self.nodes):
            box = view.box_of(node_id)
            item = view.node_items.get(box) if box is not None else None
            if item is None or box in done:
                continue
            done.add(box)
            b = item.box
            rect = QRectF(b.x, b.y, b.w, b.h)
            for mark in (NewGlowItem(box, rect, item.style.shape, colour, self.tip),
                         NewTagItem(box, rect, colour, theme, self.tip)):
                scene.addItem(mark)
                self.items.append(mark)
