"""Framing and moving the graph view: the opening frame, Fit, zoom, and bringing a node into view.

The opening frame shows the whole graph when its text then reads (at least 9 px on screen),
else the region around the loss at the readable scale. Fit and the opening frame use the
part of the viewport the legend leaves free. The view's scene rect is the graph's with a
margin of one viewport each side, so a point can be brought anywhere (no scroll bars).
"""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF
from PySide6.QtWidgets import QGraphicsView
from PySide6.QtGui import QTransform

from core.layout.boxes import Layout
from core.layout.groups import group_info
from core.layout.opening import READABLE_SCALE

MAX_FIT = 1.5
MAX_ZOOM = 4.0


class NavigationMixin:
    """Framing, zoom and ``ensure_visible`` for ``GraphView``."""

    def _initial_scale(self, layout: Layout) -> float:
        """Fitted when the whole graph then reads (text at least 9 px), else the readable scale."""
        fit = self._fit_scale(QRectF(0, 0, layout.width, layout.height), self._area())
        return max(fit, READABLE_SCALE)

    def _initial_view(self, layout: Layout) -> None:
        """The whole graph when it fits readably; else the region around the loss: at the top (on
        the left left to right, at the bottom in forward order)."""
        self.state.opening = True
        r = self.scene().sceneRect()
        area = self._area()
        s = self.transform().m11()
        if r.width() * s <= area.width() + 1 and r.height() * s <= area.height() + 1:
            self._center_in(r.center(), area)
            return
        root = self.state.call.roots[0] if self.state.call.roots else None
        box = layout.nodes.get(layout.members.get(root, "")) if root else None
        area = self._area(minimap=True)  # part of the graph is out of sight: the minimap shows
        if box is None:
            self._center_in(r.center(), area)
            return
        x = box.x + box.w / 2 if r.width() * s > area.width() else r.center().x()
        if self.direction == "LR":  # the loss is on the left
            y = box.y + box.h / 2 if r.height() * s > area.height() else r.center().y()
            self._center_in(QPointF(box.x - 12 + area.width() / 2 / s, y), area)
        elif self.direction == "forward":  # the loss is at the bottom
            self._center_in(QPointF(x, box.y + box.h + 12 - area.height() / 2 / s), area)
        else:
            top = min(box.y, r.top() + 4) - 12
            self._center_in(QPointF(x, top + area.height() / 2 / s), area)

    def _area(self, minimap: bool = False) -> QRectF:
        """The part of the viewport left free by the legend in its own corner (bottom left, open
        unless the user folded it) and, with ``minimap``, the minimap (bottom right), in viewport
        pixels: of the strip between them and the band above them, the larger one. A graph framed
        in it leaves those corners free, so the overlays open there."""
        vp = QRectF(self.viewport().rect())
        leg, mm = self.legend, self.minimap
        lw = lh = mw = mh = 0.0
        if leg.entries():
            size = leg.size_for(leg.folded)
            lw, lh = size.width() + 16, size.height() + 16
        if minimap and mm.has_overview():
            mw, mh = mm.width() + 16, mm.height() + 16
        if not (lw or mw):
            return vp
        middle = QRectF(vp.left() + lw, vp.top(), max(1.0, vp.width() - lw - mw), vp.height())
        above = QRectF(vp.left(), vp.top(), vp.width(), max(1.0, vp.height() - max(lh, mh)))
        return middle if middle.width() * middle.height() >= above.width() * above.height() else above

    def _center_in(self, point: QPointF, area: QRectF) -> None:
        """Scroll so that scene ``point`` shows at the centre of ``area`` (viewport pixels)."""
        s = self.transform().m11()
        vc = QRectF(self.viewport().rect()).center()
        shift = (area.center() - vc) / s
        self._pad_scene_rect()
        self.centerOn(point - shift)

    def _pad_scene_rect(self) -> None:
        r = self.scene().sceneRect()
        s = max(self.transform().m11(), 1e-3)
        mx, my = self.viewport().width() / s, self.viewport().height() / s
        self.setSceneRect(r.adjusted(-mx, -my, mx, my))

    def ensure_visible(self, node_id: str, *, select: bool = False, sync: bool | None = None,
                       open_folds: bool = True) -> bool:
        """Expand the folds around ``node_id`` (a trace node id) as needed and scroll it into view,
        zooming in when the view is too far out to read it; ``select`` also selects it (no signal).

        Only the path to the node opens (its siblings stay folded). When folds open, the layout
        runs like any other (on the worker thread unless ``sync``, by default as the last one did)
        and the node is shown once it is drawn. ``open_folds`` False scrolls to the box that shows
        the node now (its folded group) and lays out nothing. False for an unknown node."""
        call = self.state.call
        if call is None or self.state.layout is None and not self.state.pending:
            return False
        if call.node(node_id) is None and node_id not in self.node_items:
            return False
        if not open_folds and self.state.pending:
            self.state.focus_after = node_id  # shown once the layout under way is drawn
            return True
        target = self.state.collapsed
        if open_folds and call.node(node_id) is not None:
            target = group_info(call).expand_path(self.state.collapsed, node_id)
        self.state.opening = False
        if target != self.state.collapsed or self.state.pending:
            if select:
                self.state.selected = node_id
            self.state.focus_after = node_id
            self._relayout(self.state.sync if sync is None else sync, target)
            return True
        if select:
            self._highlight(node_id, center=False)
        item = self.node_items.get(self.state.layout.members.get(node_id, node_id))
        if item is not None:
            self._reveal(item)
        return item is not None

    def _reveal(self, item) -> None:
        """Zoom in to a readable scale if needed and centre ``item`` unless it is in sight already."""
        zoomed = self.transform().m11() < READABLE_SCALE * 0.6
        if zoomed:
            s = READABLE_SCALE
            self.setTransform(QTransform.fromScale(s, s))
        area = self._area()
        box = item.sceneBoundingRect()
        shown = self.mapFromScene(box).boundingRect()
        if not area.contains(QRectF(shown)):
            self._center_in(box.center(), area)
        if zoomed:  # a scroll alone updates the minimap through the scroll bars
            self._after_zoom()

    def smallest_text_px(self) -> float:
        """On-screen pixel height of the smallest text drawn in the visible part of the graph
        (node labels, frame titles, saved chips and edge texts that are shown); 0 for none."""
        t, s = self._theme, self.transform().m11()
        seen = self.mapToScene(self.viewport().rect()).boundingRect()
        sizes = []
        for item in self.node_items.values():
            if item.isVisible() and item.sceneBoundingRect().intersects(seen):
                sizes.append(t.font_px - 1 if "\n" in item.box.label else t.font_px)
        if any(g.isVisible() and g.sceneBoundingRect().intersects(seen) for g in self.group_items.values()):
            sizes.append(t.small_font_px + 1)
        if any(i.isVisible() and i.sceneBoundingRect().intersects(seen) for i in self.saved_items):
            sizes.append(t.small_font_px)
        if self.state.show_shapes or self.state.edge_texts:
            sizes.append(t.small_font_px)
        return min(sizes) * s if sizes else 0.0

    def zoom_percent(self) -> int:
        return round(self.transform().m11() * 100)

    def set_zoom(self, percent: float) -> None:
        self.state.opening = False
        s = max(self._min_zoom(), min(MAX_ZOOM, percent / 100))
        anchor = self.transformationAnchor()
        self.setTransformationAnchor(QGraphicsView.AnchorViewCenter)
        self.setTransform(QTransform.fromScale(s, s))
        self.setTransformationAnchor(anchor)
        self._after_zoom()

    def zoom_in(self) -> None:
        self.set_zoom(self.transform().m11() * 125)

    def zoom_out(self) -> None:
        self.set_zoom(self.transform().m11() * 80)

    def fit(self) -> None:
        """Show the whole graph beside the legend (never enlarged past 150 %)."""
        self.state.opening = False
        r = self.scene().sceneRect()
        area = self._area()
        s = self._fit_scale(r, area)
        self.setTransform(QTransform.fromScale(s, s))
        self._center_in(r.center(), area)
        self._after_zoom()

    def _fit_scale(self, r: QRectF, area: QRectF | None = None) -> float:
        vp = area if area is not None else QRectF(self.viewport().rect())
        if r.width() <= 0 or r.height() <= 0:
            return 1.0
        return min(MAX_FIT, (vp.width() - 16) / r.width(), (vp.height() - 16) / r.height())

    def _min_zoom(self) -> float:
        return min(0.1, self._fit_scale(self.scene().sceneRect()) * 0.8)

    def wheelEvent(self, event) -> None:
        dy = event.angleDelta().y()
        if dy == 0:
            return super().wheelEvent(event)
        self.state.opening = False
        current = self.transform().m11()
        target = max(self._min_zoom(), min(MAX_ZOOM, current * 1.0015**dy))
        pos = event.position().toPoint()
        anchor = self.mapToScene(pos)
        self.setTransformationAnchor(QGraphicsView.NoAnchor)
        self.scale(target / current, target / current)
        moved = self.mapFromScene(anchor) - pos  # keep the point under the mouse where it was
        self.horizontalScrollBar().setValue(self.horizontalScrollBar().value() + moved.x())
        self.verticalScrollBar().setValue(self.verticalScrollBar().value() + moved.y())
        self.setTransformationAnchor(QGraphicsView.AnchorUnderMouse)
        self._after_zoom()
        event.accept()
