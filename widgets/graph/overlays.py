"""Where the legend and the minimap sit over the graph view, and how they fold away.

Each overlay takes a corner of the viewport that no node box in view reaches (the legend
prefers the bottom left, the minimap the bottom right), else a free stretch of the bottom or
top edge; among free places, the one over fewest texts (frame titles, edge labels, notes).
When no place is free it folds into a small tab, put where it covers no box either. A click on
the tab (or the view's key for it, L or M) opens the overlay again, and it then stays open
where it covers the fewest boxes, until the user folds it or another call is shown. The box of the node backward is at
while stepping and the selected node's box are never covered, not even by an overlay the
user opened. Placement runs again whenever the view scrolls, zooms or is resized, and when
the current node or the selection changes.

With Colour by Gradient Norm on, a third panel, the colour scale (``NormScale``), takes a corner
after them (the top right first), off the boxes kept clear, over the fewest boxes where none is
free; it never folds: the colours mean nothing without it.
"""

from __future__ import annotations

from PySide6.QtCore import QRectF, QSize, QSizeF, Qt, Signal
from PySide6.QtGui import QAction, QFontMetricsF, QKeySequence, QPainter
from PySide6.QtWidgets import QGraphicsView, QWidget

from core.layout.boxes import Layout
from core.model.edge_norms import CallNorms
from widgets.graph.items import EdgeItem, SavedItem
from widgets.graph.marks import TagItem
from widgets.graph.minimap import Legend, Minimap, paint_overlay_frame
from widgets.graph.norm_colours import paint_norm_scale, scale_labels, scale_note, scale_size
from widgets.graph.painting import font

EDGE = 8.0  # viewport pixels between an overlay and the viewport's edge
GAP = 2.0  # viewport pixels kept between an overlay and a node box (rounding of both)
TEXT_SCALE = 0.3  # below this zoom texts under an overlay are too small to count
CORNERS = {  # corners in the order each overlay tries them
    "legend": ("bottom_left", "top_left", "bottom_right", "top_right"),
    "minimap": ("bottom_right", "top_right", "bottom_left", "top_left"),
    "scale": ("top_right", "top_left", "bottom_right", "bottom_left"),
}
# Costs of the places an overlay can take; the pair with the lowest sum is chosen. A text
# under an overlay (a module frame's title, an edge label, a tag, a saved tensor) costs TITLE:
# a free corner, then a free stretch of an edge, then texts covered, before folding into a tab.
OPEN, OPEN_SLID, TITLE, OPEN_COVERING, TAB, TAB_SLID, TAB_COVERING, HIDDEN = 0, 5, 6, 50, 100, 105, 500, 10000


class BoxIndex:
    """Scene rectangles (node boxes, frame titles) in a coarse grid of scene cells, so a
    rectangle query costs the rectangles near it, not all of them."""

    CELL = 256.0

    def __init__(self, rects: list[tuple[float, float, float, float]], ids: list[str]):
        self.rects = rects
        self.ids = {nid: i for i, nid in enumerate(ids)}
        self.cells: dict[tuple[int, int], list[int]] = {}
        c = self.CELL
        for i, (x0, y0, x1, y1) in enumerate(self.rects):
            for cx in range(int(x0 // c), int(x1 // c) + 1):
                for cy in range(int(y0 // c), int(y1 // c) + 1):
                    self.cells.setdefault((cx, cy), []).append(i)

    def hits(self, r: QRectF) -> list[int]:
        """Indices of the boxes that overlap scene rectangle ``r``."""
        x0, y0, x1, y1 = r.left(), r.top(), r.right(), r.bottom()
        c = self.CELL
        cx0, cx1, cy0, cy1 = int(x0 // c), int(x1 // c), int(y0 // c), int(y1 // c)
        if (cx1 - cx0 + 1) * (cy1 - cy0 + 1) > len(self.rects):
            near = range(len(self.rects))  # zoomed far out: a plain scan is cheaper
        else:
            near = {i for cx in range(cx0, cx1 + 1) for cy in range(cy0, cy1 + 1) for i in self.cells.get((cx, cy), ())}
        rects = self.rects
        return [i for i in near if rects[i][0] < x1 and rects[i][2] > x0 and rects[i][1] < y1 and rects[i][3] > y0]

    def rect(self, i: int) -> QRectF:
        x0, y0, x1, y1 = self.rects[i]
        return QRectF(x0, y0, x1 - x0, y1 - y0)


class OverlayTab(QWidget):
    """A small tab standing for a folded overlay; a click opens the overlay."""

    sig_clicked = Signal()
    """The user clicked the tab."""

    def __init__(self, parent: QGraphicsView, text: str, tip: str):
        super().__init__(parent)
        self._text = text
        self.setCursor(Qt.PointingHandCursor)
        self.setToolTip(tip)
        self.hide()

    def size_for_theme(self) -> QSize:
        t = self.parent().theme()
        fm = QFontMetricsF(font(t.font_family, t.small_font_px + 1, True))
        return QSize(int(fm.horizontalAdvance(self._text)) + 22, 24)

    def mousePressEvent(self, event) -> None:
        self.sig_clicked.emit()
        event.accept()

    def mouseReleaseEvent(self, event) -> None:
        event.accept()

    def paintEvent(self, event) -> None:
        t = self.parent().theme()
        p = QPainter(self)
        paint_overlay_frame(p, self.rect(), t, self._text)
        p.end()


class NormScale(QWidget):
    """The colour scale of Colour by Gradient Norm: the heatmap's bar, the smallest and largest
    norm of the call, and what is coloured (leaves only in a call without edge gradients)."""

    def __init__(self, parent: QGraphicsView):
        super().__init__(parent)
        self.norms: CallNorms | None = None
        self.setToolTip("Edges and leaves coloured by ‖g‖₂ of their gradient in this call, on a log scale "
                        "(the palette of the Gradients panel); hover one for its norm")
        self.hide()

    def set_norms(self, norms: CallNorms | None) -> None:
        """The call's norms, or None: no scale."""
        self.norms = norms
        if norms is None:
            self.hide()
            return
        w, h = scale_size(self.parent().theme(), norms)
        self.setFixedSize(int(w), int(h))
        self.update()

    def labels(self) -> tuple[str, str] | None:
        """The smallest and largest norm written under the bar."""
        return scale_labels(self.norms) if self.norms is not None else None

    def note(self) -> str:
        return scale_note(self.norms) if self.norms is not None else ""

    def mousePressEvent(self, event) -> None:
        event.accept()  # a click on the panel does not drag the graph under it

    def paintEvent(self, event) -> None:
        if self.norms is None:
            return
        p = QPainter(self)
        paint_norm_scale(p, QRectF(self.rect()), self.parent().theme(), self.norms)
        p.end()


class OverlaysMixin:
    """The overlays of ``GraphView``: their keys, and placing them again when the current node
    changes (the view places them on every scroll, zoom, resize and selection)."""

    def _init_overlays(self) -> None:
        self.overlays = Overlays(self)
        self.legend, self.minimap = self.overlays.legend, self.overlays.minimap
        self.minimap.sig_center_on.connect(self.centerOn)
        self.act_legend = self._view_action("Fold or Open the &Legend", "L", self.overlays.toggle_legend)
        self.act_minimap = self._view_action("Fold or Open the &Overview Map", "M", self.overlays.toggle_minimap)

    def _view_action(self, text: str, key: str, slot) -> QAction:
        """A key of the view (only while it has the focus), listed with the window's shortcuts."""
        action = QAction(text, self)
        action.setShortcut(QKeySequence(key))
        action.setShortcutContext(Qt.WidgetWithChildrenShortcut)
        action.triggered.connect(slot)
        self.addAction(action)
        return action

    def overlay_keep_clear(self) -> set[str]:
        """Trace node ids (or group ids) no overlay may cover: the current step's and the selection."""
        keep = set(self.overlays.current)
        if self.state.selected is not None:
            keep.add(self.state.selected)
        return keep

    def set_node_states(self, states: dict[str, str]) -> None:
        super().set_node_states(states)
        self.overlays.current = {nid for nid, st in states.items() if st == "current"}
        self.overlays.place()

    def update_step(self, states: dict[str, str | None], texts: dict[tuple[str, str], str | None]) -> None:
        super().update_step(states, texts)
        current, moved = self.overlays.current, False
        for nid, st in states.items():
            if st == "current" and nid not in current:
                current.add(nid)
                moved = True
            elif st != "current" and nid in current:
                current.discard(nid)
                moved = True
        if moved:
            self.overlays.place()


class Overlays:
    """The legend and the minimap over a graphics view's viewport, kept off the node boxes.

    They are children of the view, not of its viewport, so scrolling does not move them; ``place``
    does. The view gives the boxes (``state.layout``), the boxes never to cover
    (``overlay_keep_clear``) and its breadcrumbs (``crumbs``), which the overlays also avoid.
    """

    def __init__(self, view: QGraphicsView):
        self.view = view
        self.legend = Legend(view)
        self.minimap = Minimap(view)
        self.minimap_tab = OverlayTab(view, "Overview \u25b8",
                                      "Overview: folded to keep the graph clear; click or press M to open it")
        self.minimap_tab.sig_clicked.connect(self.toggle_minimap)
        self.scale = NormScale(view)
        self.minimap_folded = False  # the user folded the minimap
        self.minimap_pinned = False  # the user opened it: it stays open where it covers the fewest boxes
        self.minimap_needed = False  # part of the graph is out of sight
        self.current: set[str] = set()  # nodes in the "current" step state, kept clear
        self._index: tuple = (None, None, None)  # (layout, its node boxes, its frame titles)

    # -- what the user asks -----------------------------------------------------------------------
    def toggle_legend(self) -> None:
        """Fold the legend if it is open, else open it (and keep it open)."""
        self.legend.toggle()

    def toggle_minimap(self) -> None:
        """Fold the minimap if it is open, else open it (and keep it open while it is needed)."""
        opening = self.minimap_folded or not self.minimap.isVisible()
        self.minimap_folded, self.minimap_pinned = not opening, opening
        self.place()

    def reset(self) -> None:
        """A new call: no current node, and overlays the user opened go back to folding
        themselves when there is no room."""
        self.current = set()
        self.legend.pinned = False
        self.minimap_pinned = False

    # -- placing ---------------------------------------------------------------------------------
    def update(self, has_graph: bool) -> None:
        """Need the minimap only while part of the graph is out of sight, outline the view, place both."""
        view = self.view
        scene_rect = view.scene().sceneRect()
        visible = view.mapToScene(view.viewport().rect()).boundingRect()
        self.minimap_needed = has_graph and self.minimap.has_overview() and not visible.contains(
            scene_rect.adjusted(2, 2, -2, -2))
        if self.minimap_needed:
            self.minimap.set_view_rect(visible)
        self.place()

    def place(self) -> None:
        """Put each overlay where it covers no node box in view, or fold it into a tab."""
        view = self.view
        vp = QRectF(view.viewport().geometry())
        layout = getattr(view.state, "layout", None)
        texts = view.transform().m11() >= TEXT_SCALE
        boxes, titles = self._indexes(layout, texts)
        reserved, top = [], vp.top() + EDGE
        crumbs = getattr(view, "crumbs", None)
        if crumbs is not None and crumbs.isVisible():
            reserved.append(QRectF(crumbs.geometry()).adjusted(-GAP, -GAP, GAP, GAP))
            top = crumbs.geometry().bottom() + 1 + EDGE / 2  # the top left corner is below the breadcrumbs
        probe = _Probe(view, vp, layout, boxes, titles, reserved, top)
        leg = self.legend
        legend_opts = self._options(probe, "legend", leg.size_for(False), leg.size_for(True),
                                    not leg.folded, leg.pinned, self._now(leg, leg.shown_folded()))
        # The legend's place first (in order of cost), then the minimap's around it, so a tab
        # slid along an edge also goes past the legend.
        minimap_now = (self._now(self.minimap, False) if self.minimap.isVisible()
                       else self._now(self.minimap_tab, True))
        best = None
        for lc, lk, lr in legend_opts:
            if best is not None and lc >= best[0]:
                break
            mc, mk, mr = 0, "none", QRectF()
            if self.minimap_needed:
                probe.reserved = reserved + ([lr.adjusted(-GAP, -GAP, GAP, GAP)] if lk != "hidden" else [])
                mc, mk, mr = self._options(probe, "minimap", self.minimap.size(), self.minimap_tab.size_for_theme(),
                                           not self.minimap_folded, self.minimap_pinned, minimap_now)[0]
            if best is None or lc + mc < best[0]:
                best = (lc + mc, (lk, lr), (mk, mr))
        (lk, lr), (mk, mr) = best[1], best[2]
        leg.set_tucked(lk == "tab" and not leg.folded)
        leg.setVisible(lk != "hidden")
        if lk != "hidden":
            leg.move(int(lr.x()), int(lr.y()))
            leg.raise_()
        self.minimap.setVisible(mk == "open")
        self.minimap_tab.setVisible(mk == "tab")
        if mk == "open":
            self.minimap.move(int(mr.x()), int(mr.y()))
            self.minimap.raise_()
        elif mk == "tab":
            self.minimap_tab.setToolTip("Overview: click or press M to open it" if self.minimap_folded else
                                        "Overview: folded to keep the graph clear; click or press M to open it")
            self.minimap_tab.setFixedSize(self.minimap_tab.size_for_theme())
            self.minimap_tab.move(int(mr.x()), int(mr.y()))
            self.minimap_tab.raise_()
        self._place_scale(probe, reserved + [r.adjusted(-GAP, -GAP, GAP, GAP) for k, r in ((lk, lr), (mk, mr))
                                             if k not in ("hidden", "none")])

    def _place_scale(self, probe: "_Probe", taken: list[QRectF]) -> None:
        """The colour scale, after the legend and the minimap (``taken``): the cheapest open place."""
        scale = self.scale
        if scale.norms is None:
            scale.hide()
            return
        probe.reserved = taken
        size = scale.size()
        places = [(c, r) for c, k, r in self._options(probe, "scale", size, size, True, True,
                                                      self._now(scale, False)) if k == "open"]
        scale.setVisible(bool(places))
        if places:
            scale.move(int(places[0][1].x()), int(places[0][1].y()))
            scale.raise_()
            scale.update()

    @staticmethod
    def _now(widget: QWidget, tab: bool) -> tuple[str, QRectF] | None:
        """Where ``widget`` is shown now: ("open" or "tab", its geometry); None when hidden."""
        return ("tab" if tab else "open", QRectF(widget.geometry())) if widget.isVisible() else None

    def _indexes(self, layout: Layout | None, texts: bool) -> tuple[BoxIndex | None, BoxIndex | None]:
        """The node boxes (with the margin their items draw in) of ``layout`` and, when ``texts``
        count (zoomed in enough to read them), its frame titles, each indexed once per layout."""
        view = self.view
        if layout is None:
            self._index = (None, None, None)
        elif self._index[0] is not layout:
            item = next(iter(view.node_items.values()), None)
            m = -item.boundingRect().left() if item is not None else 0.0
            nodes = list(layout.nodes.values())
            boxes = BoxIndex([(b.x - m, b.y - m, b.x + b.w + m, b.y + b.h + m) for b in nodes], [b.id for b in nodes])
            self._index = (layout, boxes, None)
        if texts and self._index[0] is not None and self._index[2] is None:
            frames = [g.title_rect() for g in view.group_items.values()]
            titles = BoxIndex([(r.left(), r.top(), r.right(), r.bottom()) for r in frames], list(view.group_items))
            self._index = (layout, self._index[1], titles)
        return self._index[1], self._index[2] if texts else None

    def _options(self, probe: "_Probe", name: str, open_size: QSize, tab_size: QSize, want_open: bool,
                 pinned: bool, now: tuple[str, QRectF] | None = None) -> list[tuple[float, str, QRectF]]:
        """The places one overlay can take, each with its cost: open in a free corner, or along the
        bottom or top edge, open over boxes (only when the user opened it), a tab in a free corner
        or along an edge, a tab over boxes, hidden. None of them covers a box kept clear. Where it
        is ``now`` (kind, place) along an edge it stays while that place is free, so panning does
        not drag it along the gaps between boxes."""
        opts: list[tuple[float, str, QRectF]] = []

        def add(kind: str, r: QRectF, free: float, over_boxes: float | None) -> None:
            hit = probe.covered(r)
            if hit is None:
                return
            boxes, titles = hit
            if boxes == 0:
                opts.append((free + TITLE * titles, kind, r))
            elif over_boxes is not None:
                opts.append((over_boxes + 10 * boxes, kind, r))

        right = CORNERS[name][0].endswith("right")
        for rank, corner in enumerate(CORNERS[name]):
            if want_open:
                add("open", probe.corner(corner, open_size), OPEN + rank, OPEN_COVERING + rank / 10 if pinned else None)
            add("tab", probe.corner(corner, tab_size), TAB + rank, TAB_COVERING + rank / 10)
        if want_open:
            for k, r in enumerate(probe.slid(open_size, right)):
                add("open", r, OPEN_SLID + k / 100, None)
        for k, r in enumerate(probe.slid(tab_size, right)):  # also when a corner is free: the other overlay may take it
            add("tab", r, TAB_SLID + k / 100, None)
        if now is not None and now[0] in ("open", "tab") and (now[0] == "tab" or want_open):
            kind, r = now
            size = open_size if kind == "open" else tab_size
            if r.size() == QSizeF(size) and probe.inside(r):
                add(kind, r, (OPEN_SLID if kind == "open" else TAB_SLID) - 0.5, None)
        opts.append((HIDDEN, "hidden", QRectF()))
        return sorted(opts, key=lambda o: o[0])


class _Probe:
    """Rectangles in view coordinates tested against the node boxes and frame titles in the viewport."""

    def __init__(self, view: QGraphicsView, vp: QRectF, layout: Layout | None, index: BoxIndex | None,
                 titles: BoxIndex | None, reserved: list[QRectF], top_left: float):
        self.view, self.vp, self.index, self.titles, self.reserved = view, vp, index, titles, reserved
        self.top_left = top_left  # where the top left corner starts (below the breadcrumbs)
        self.offset = vp.topLeft()
        self.to_scene, _ = view.viewportTransform().inverted()
        self.to_view = view.viewportTransform()
        s = max(view.transform().m11(), 1e-6)
        self.pad = GAP / s
        self.texts = view.scene() if titles is not None and view.state.detail else None
        self.keep = set()
        if index is not None:
            members = layout.members
            for nid in view.overlay_keep_clear():
                i = index.ids.get(members.get(nid, nid))
                if i is not None:
                    self.keep.add(i)

    def corner(self, corner: str, size: QSize) -> QRectF:
        vp, w, h = self.vp, size.width(), size.height()
        x = vp.left() + EDGE if corner.endswith("left") else vp.right() - EDGE - w
        top = self.top_left if corner == "top_left" else vp.top() + EDGE
        y = top if corner.startswith("top") else vp.bottom() - EDGE - h
        return QRectF(x, y, w, h)

    def inside(self, r: QRectF) -> bool:
        """True when ``r`` lies within the viewport's margin."""
        return self.vp.adjusted(EDGE - 1, EDGE - 1, 1 - EDGE, 1 - EDGE).contains(r)

    def _scene(self, r: QRectF) -> QRectF:
        return self.to_scene.mapRect(r.translated(-self.offset)).adjusted(-self.pad, -self.pad, self.pad, self.pad)

    def covered(self, r: QRectF) -> tuple[int, int] | None:
        """How many node boxes and frame titles ``r`` covers; None when it covers a box kept
        clear or the breadcrumbs."""
        if any(r.intersects(c) for c in self.reserved):
            return None
        if self.index is None:
            return 0, 0
        scene = self._scene(r)
        hits = self.index.hits(scene)
        if self.keep.intersection(hits):
            return None
        titles = len(self.titles.hits(scene)) if self.titles is not None else 0
        return len(hits), titles + self._texts(scene)

    def _texts(self, scene: QRectF) -> int:
        """Edge labels, notes (value chips, cut stubs), tags and saved tensors under scene
        rectangle ``scene``."""
        if self.texts is None:
            return 0
        n = 0
        for item in self.texts.items(scene):
            if not item.isVisible():
                continue
            if isinstance(item, EdgeItem):
                r = item.label_rect()
            elif hasattr(item, "text_rect"):  # a note
                r = item.text_rect()
            elif isinstance(item, (TagItem, SavedItem)):
                r = item.sceneBoundingRect()
            else:
                continue
            n += not r.isNull() and r.intersects(scene)
        return n

    def slid(self, size: QSize, right: bool) -> list[QRectF]:
        """Free places along the bottom edge, then the top edge: in each free stretch of an edge,
        the place at its left end and the one at its right end, the nearest to the left (or the
        ``right``) side first."""
        vp, w, h = self.vp, size.width(), size.height()
        out = []
        for y in (vp.bottom() - EDGE - h, vp.top() + EDGE):
            row = []
            strip = QRectF(vp.left() + EDGE, y, vp.width() - 2 * EDGE, h)
            blocked = [(c.left(), c.right()) for c in self.reserved if c.intersects(strip)]
            if self.index is not None:
                for i in self.index.hits(self._scene(strip)):
                    r = self.to_view.mapRect(self.index.rect(i)).translated(self.offset)
                    blocked.append((r.left() - GAP, r.right() + GAP))
            x = strip.left()
            for x0, x1 in sorted(blocked) + [(strip.right(), strip.right())]:
                if x0 - x >= w:
                    row.append(QRectF(x, y, w, h))
                    if x0 - w > x:
                        row.append(QRectF(x0 - w, y, w, h))
                x = max(x, x1)
            out += sorted(row, key=lambda r: -r.x() if right else r.x())
        return out
