"""GraphView: one call's grad_fn graph, from the loss at the top to the leaves below.

It takes plain data (a CallInfo) and knows nothing of processes. Layout runs on a worker
thread and the scene is built when the result arrives (``sig_scene_ready``); pass
``sync=True`` to lay out and build at once (tests, exports). Zoomed far out, the per-node
items are hidden and one overview picture is drawn instead, so big graphs pan smoothly.
In-place, stale, device and storage-sharing marks are drawn by ``widgets.graph.marks``.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

from PySide6.QtCore import QCoreApplication, QDeadlineTimer, QEvent, QPointF, Qt, Signal
from PySide6.QtGui import QBrush, QKeySequence, QPainter, QTransform
from PySide6.QtWidgets import QGraphicsScene, QGraphicsView, QWidget

from core.layout.boxes import LABELS, Layout
from core.layout.groups import group_info
from core.model.nesting import nested_calls
from core.model.trace import CallInfo
from widgets.graph.items import EdgeItem, GroupBoxItem, NodeItem, SavedItem
from widgets.graph.marks import MarksMixin
from widgets.graph.nav import NavigationMixin
from widgets.graph.painting import NodeStyle, color
from widgets.graph.relations import RelationsMixin
from widgets.graph.state import GraphState
from widgets.graph.steps import StepStatesMixin
from widgets.graph.scene import LayoutRunner, build_message, build_scene, legend_entries
from widgets.graph.scene import overview_marks, search_index, toggled, tooltip
from widgets.graph.minimap import OverviewItem
from widgets.graph.overlays import OverlaysMixin
from widgets.graph.norm_colours import NormColoursMixin
from widgets.theme import Theme, get_theme

log = logging.getLogger(__name__)

OVERVIEW_LOD = 0.2  # below this zoom a big graph is drawn as one overview picture
SMALL_SCENE = 1500  # scenes with fewer items always draw their own items
EXPAND_ONE_LEVEL = 400  # expanding a group bigger than this keeps its subgroups collapsed


class GraphView(NavigationMixin, RelationsMixin, NormColoursMixin, MarksMixin, OverlaysMixin, StepStatesMixin,
                QGraphicsView):
    """The autograd graph of one call, with zoom, search, selection, groups, step states and marks."""

    sig_scene_ready = Signal(str)
    """The scene for a call is built and shown (the call's id, "" for no call)."""
    sig_select_requested = Signal(str)
    """The user asked to select a node (a click, a Find match): a trace node id, or ``group:<path>``
    for a collapsed group. The view does not select it itself: it shows what ``show_selection`` is told."""
    sig_group_toggled = Signal(str)
    """The user collapsed or expanded a module group (its path)."""
    sig_zoom_changed = Signal(int)
    """The zoom changed (percent)."""
    sig_layout_failed = Signal(str)
    """Laying out the call raised; the message."""
    sig_open_call = Signal(str)
    """Open another call: the backward nested in a checkpoint node (its call id)."""

    def __init__(self, parent: QWidget | None = None, theme: str = "light"):
        super().__init__(parent)
        self.setScene(QGraphicsScene(self))
        self.state = GraphState()  # what is shown: the call, its layout, folds, selection, steps
        self._theme: Theme = get_theme(theme)
        self.setRenderHints(QPainter.Antialiasing | QPainter.TextAntialiasing)
        self.setDragMode(QGraphicsView.ScrollHandDrag)
        self.setTransformationAnchor(QGraphicsView.AnchorUnderMouse)
        self.setResizeAnchor(QGraphicsView.AnchorViewCenter)
        self.setViewportUpdateMode(QGraphicsView.SmartViewportUpdate)
        self.setOptimizationFlags(QGraphicsView.DontAdjustForAntialiasing)
        self.setBackgroundBrush(QBrush(color(self._theme.background)))
        # No scroll bars (drag, the wheel and the minimap move the view); the view's scene rect is
        # the graph's with a margin of one viewport, so any point can be brought anywhere.
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.node_items: dict[str, NodeItem] = {}
        self.edge_items: list[EdgeItem] = []
        self.group_items: dict[str, GroupBoxItem] = {}
        self.saved_items: list[SavedItem] = []
        self.overview: OverviewItem | None = None
        self.banner = None  # the line above the graph naming the error the call raised, if any
        self._init_marks()
        self._init_step_states()
        self._legend_boxes: list[str] | None = None  # legend keys for the boxes' styles
        self._legend_shown: tuple = ()  # (entries, theme) last given to the legend
        self._clicked: str | None = None  # the node a click asked to select, until the answer comes
        self._matches: list[str] = []
        self._match_index = -1
        self._search_index: dict[str, str] | None = None
        self._generation = 0
        self._big = False
        self._exporting = False
        self._press: QPointF | None = None
        self.engine = "auto"
        self.direction = "TB"  # "TB", "LR" or "forward" (core.layout.boxes.DIRECTIONS)
        self._runner = LayoutRunner(self)
        self._runner.sig_done.connect(self._on_done)
        self._runner.sig_failed.connect(self._on_failed)
        self._init_overlays()
        self._init_relations()
        self.horizontalScrollBar().valueChanged.connect(self._update_minimap)
        self.verticalScrollBar().valueChanged.connect(self._update_minimap)

    # -- data ---------------------------------------------------------------------------------
    def set_call(self, call: CallInfo | None, *, sync: bool = False, collapsed: frozenset[str] | None = None) -> None:
        """Show ``call``; big graphs open with module groups collapsed unless ``collapsed`` is given."""
        self.state.call = call
        self.state.related = None
        self.state.selected, self._matches, self._match_index = None, [], -1
        self.state.states, self.state.edge_texts, self._search_index = {}, {}, None
        self.state.leaf_lines = {}
        self.state.state_kinds, self.state.box_tally = {}, {}
        self.state.states_token += 1
        self.state.fit_next = True
        self.overlays.reset()
        self._relayout(sync, collapsed, opening=collapsed is None)

    def call(self) -> CallInfo | None:
        return self.state.call

    def graph_layout(self) -> Layout | None:
        return self.state.layout

    def is_pending(self) -> bool:
        """True while a layout runs on the worker thread."""
        return self.state.pending

    def wait_ready(self, timeout_ms: int = 30000) -> bool:
        """Process events until the pending layout is shown; False on timeout."""
        deadline = QDeadlineTimer(timeout_ms)
        while self.state.pending and not deadline.hasExpired():
            QCoreApplication.processEvents()
            self._runner.wait(10)
        QCoreApplication.processEvents()
        return not self.state.pending

    def collapsed(self) -> frozenset[str]:
        return self.state.collapsed

    def box_of(self, node_id: str) -> str | None:
        """The box drawing ``node_id`` now: its own id, or ``group:<path>`` of the folded group
        around it; None while nothing is laid out or for a node not drawn."""
        return self.state.layout.members.get(node_id) if self.state.layout is not None else None

    def set_collapsed(self, paths, *, sync: bool = False) -> None:
        self._relayout(sync, frozenset(paths))

    def toggle_group(self, path: str, *, sync: bool = False) -> None:
        """Collapse an expanded group or expand a collapsed one (one level at a time when big)."""
        if self.state.call is None:
            return
        self.state.focus_after = path if path in self.state.collapsed else "group:" + path
        paths = toggled(group_info(self.state.call), self.state.collapsed, path, EXPAND_ONE_LEVEL)
        self.sig_group_toggled.emit(path)
        self._relayout(sync, paths)

    def set_show_saved(self, show: bool, *, sync: bool = False) -> None:
        if show != self.state.show_saved:
            self.state.show_saved = show
            self._relayout(sync, self.state.collapsed)

    def shows_saved(self) -> bool:
        return self.state.show_saved

    def shows_shapes(self) -> bool:
        return self.state.show_shapes

    def set_show_shapes(self, show: bool) -> None:
        self.state.show_shapes = show
        self._apply_edge_texts()  # the labels' new texts, placed anew

    def relayout(self, *, sync: bool = False, refit: bool = False) -> None:
        """Lay the shown call out again with its folds (after ``direction`` or ``engine`` changed);
        ``refit`` frames the new picture as it opens instead of keeping the old frame."""
        if refit:
            self.state.fit_next = True
        self._relayout(sync, self.state.collapsed)

    def _relayout(self, sync: bool, collapsed, opening: bool = False) -> None:
        self.state.sync = sync
        self._generation += 1
        gen, call = self._generation, self.state.call
        if call is None or not call.nodes:
            self.state.pending = False
            self._build(None)
            self.sig_scene_ready.emit(call.id if call else "")
            return
        self.state.pending = True
        area = self._area() if opening else None
        engine = self.engine + (LABELS if self.state.show_values else "")  # values on edges: room for them
        self._runner.run(gen, call, collapsed, self.state.show_saved, engine, sync=sync,
                         area=(area.width(), area.height()) if area is not None else None, direction=self.direction)

    def _on_done(self, gen: int, result) -> None:
        if gen != self._generation:
            return
        self.state.collapsed, layout = result
        self._build(layout)
        self.state.pending = False
        self.sig_scene_ready.emit(self.state.call.id if self.state.call else "")

    def _on_failed(self, gen: int, message: str) -> None:
        if gen == self._generation:
            self.state.pending = False
            self._build(None, f"Could not lay out this graph: {message}")
            self.sig_layout_failed.emit(message)

    # -- building the scene ---------------------------------------------------------------------
    def _build(self, layout: Layout | None, message: str = "") -> None:
        scene = self.scene()
        scene.clear()
        self.node_items, self.edge_items, self.group_items, self.saved_items = {}, [], {}, []
        self.state.applied_texts = None
        self.overview, self.banner = None, None
        self._forget_marks()
        self.state.layout = layout
        t, call = self._theme, self.state.call
        if layout is None:
            text = message or (
                "Same graph as an earlier call" if call and call.same_as else "No autograd graph to show"
            )
            build_message(scene, text, t)
            self.legend.set_entries([], t)
            self._legend_boxes, self._legend_shown = None, ()
            self.minimap.hide()
            self.resetTransform()
            return
        total = len(layout.nodes) + len(layout.edges) + len(layout.groups)
        self._big = total >= SMALL_SCENE
        if self.state.fit_next:
            scale = self._initial_scale(layout)
            self.setTransform(QTransform.fromScale(scale, scale))
        self.state.detail = not self._big or self.transform().m11() >= OVERVIEW_LOD
        items = build_scene(scene, call, layout, t, show=self.state.detail, with_overview=self._big)
        self.state.applied_texts = None
        self.node_items, self.edge_items, self.group_items, self.saved_items = (
            items.nodes,
            items.edges,
            items.groups,
            items.saved,
        )
        self.overview, self.banner, styles, members = items.overview, items.banner, items.styles, layout.members
        self._add_marks(scene.sceneRect())
        self._pad_scene_rect()
        if self.state.show_shapes or self.state.edge_texts:
            self._apply_edge_texts()
        self._apply_states()
        self.state.accented = []
        if self.state.related is not None:
            self._apply_related()
        elif self._matches:
            self._apply_matches()
        self._legend_entries(styles)
        self.minimap.set_overview(self.overview, scene.sceneRect(), t)
        if self.state.selected is not None and members.get(self.state.selected, self.state.selected) in self.node_items:
            self._highlight(self.state.selected, center=self.state.focus_after is None)
        else:
            self.state.selected = None
        if self.state.fit_next:
            self.state.fit_next = False
            scale = self._initial_scale(layout)  # again, now that the legend's size is known
            self.setTransform(QTransform.fromScale(scale, scale))
            self._initial_view(layout)
        elif self.state.focus_after is not None:
            focus = layout.members.get(self.state.focus_after, self.state.focus_after)
            target = self.node_items.get(focus) or self.group_items.get(focus)
            if target is not None:
                self._reveal(target)
        self.state.focus_after = None
        self._after_zoom()

    def _legend_entries(self, styles: dict[str, NodeStyle] | None = None) -> None:
        """Legend keys for the scene; the boxes' part (O(boxes)) is worked out again only when
        ``styles`` is given (a new scene), so a step that changes which states are present
        costs no pass over the boxes, and an unchanged legend is not redrawn."""
        if styles is not None or self._legend_boxes is None:
            if styles is None:
                styles = {v: i.style for v, i in self.node_items.items()}
            self._legend_boxes = legend_entries(styles, bool(self.group_items), self.saved_items, ())
        entries = legend_entries({}, False, [], self.state.state_kinds, self.marks.legend())
        entries = self._legend_boxes + entries
        if (entries, self._theme) != self._legend_shown:
            self._legend_shown = (entries, self._theme)
            self.legend.set_entries(entries, self._theme)
            self.overlays.place()

    @contextmanager
    def export_mode(self):
        """Show every item (not the zoomed-out overview) while rendering the scene for export."""
        detail = self.state.detail
        self._set_detail(True)
        self._exporting = True
        try:
            yield self.scene()
        finally:
            self._exporting = False
            self._set_detail(detail)
            self._after_zoom()

    # -- theme -------------------------------------------------------------------------------------
    def set_theme(self, name: str) -> None:
        self._theme = t = get_theme(name)
        self.setBackgroundBrush(QBrush(color(t.background)))
        for item in self._scene_items():
            item.set_theme(t)
        if self.banner is not None:
            self.banner.setBrush(color(t.error))
        if self.overview is not None:
            self.overview.set_theme(t)
            self.minimap.set_overview(self.overview, self.scene().sceneRect(), t)
        self.legend.set_entries(self.legend.entries(), t)
        self.overlays.place()
        self.overlays.minimap_tab.update()

    def theme(self) -> Theme:
        return self._theme

    # -- search and selection ---------------------------------------------------------------------
    def search(self, text: str) -> list[str]:
        """Trace node ids whose name, label or variable name contains ``text`` (any case)."""
        text = text.strip().lower()
        self._matches, self._match_index = [], -1
        if text and self.state.call is not None:
            if self._search_index is None:
                self._search_index = search_index(self.state.call)
            self._matches = [nid for nid, s in self._search_index.items() if text in s]
        self._apply_matches()
        if self._matches:
            self.next_match()
        return list(self._matches)

    def next_match(self) -> str | None:
        """Select and centre the next search match; None when there are no matches."""
        if not self._matches:
            return None
        self._match_index = (self._match_index + 1) % len(self._matches)
        nid = self._matches[self._match_index]
        if self.ensure_visible(nid):
            self.sig_select_requested.emit(nid)
        return nid

    def _apply_matches(self) -> None:
        members = self.state.layout.members if self.state.layout else {}
        hit = {members.get(m, m) for m in self._matches}
        for vid, item in self.node_items.items():
            item.set_highlighted(vid in hit)
        self._update_marks()

    def show_selection(self, node_id: str | None) -> None:
        """Show ``node_id`` (a trace id or group id; None or "" for none) as the selection and bring it
        into view, opening folds around it. The selection is the session's; this only draws it."""
        node_id = node_id or None
        clicked, self._clicked = self._clicked, None
        if node_id is not None and node_id == clicked:  # the answer to a click: it is in sight already
            self._highlight(node_id, center=False)
        elif node_id is None or node_id.startswith("group:") or self.state.call is None:
            self._highlight(node_id, center=node_id is not None)
        else:
            self.ensure_visible(node_id, select=True)

    select_node = show_selection  # the name exports and older callers use

    def shown_selection(self) -> str | None:
        """The node whose selection is drawn (as told by ``show_selection``)."""
        return self.state.selected

    def _highlight(self, node_id: str | None, *, center: bool) -> None:
        members = self.state.layout.members if self.state.layout else {}
        old = members.get(self.state.selected, self.state.selected) if self.state.selected else None
        new = members.get(node_id, node_id) if node_id else None
        if old in self.node_items:
            self.node_items[old].set_selected(False)
        item = self.node_items.get(new) if new else None
        self.state.selected = node_id if item is not None else None
        for e in self.edge_items:
            e.set_active(new is not None and new in e.key)
        if item is not None:
            item.set_selected(True)
            if center:
                self.centerOn(item.sceneBoundingRect().center())
        self._update_marks()
        self.overlays.place()  # the selection is never covered

    def _update_marks(self) -> None:
        if self.overview is None:
            return
        selected = self.state.layout.members.get(self.state.selected, self.state.selected) if self.state.selected else None
        self.overview.set_marks(overview_marks(self.node_items, selected))

    # -- zoom and navigation ----------------------------------------------------------------------
    def _after_zoom(self) -> None:
        self._pad_scene_rect()
        if self._big and self.node_items and not self._exporting:
            self._set_detail(self.transform().m11() >= OVERVIEW_LOD)
        self._update_minimap()
        self.sig_zoom_changed.emit(self.zoom_percent())

    def _set_detail(self, detail: bool) -> None:
        if detail == self.state.detail or not self.node_items:
            return
        self.state.detail = detail
        for item in self._scene_items():
            item.setVisible(detail)
        if self.overview is not None and self.overview.scene() is not None:
            self.overview.setVisible(not detail)

    def _update_minimap(self, *_args) -> None:
        self._update_crumbs()  # first: the overlays keep off the breadcrumbs
        self.overlays.update(self.state.layout is not None)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if self.state.opening and self.state.layout is not None:  # the window was laid out after the graph
            s = self._initial_scale(self.state.layout)
            self.setTransform(QTransform.fromScale(s, s))
            self._initial_view(self.state.layout)
            self._after_zoom()
        self._update_minimap()

    def keyPressEvent(self, event) -> None:
        """Ctrl+= / Ctrl+- / Ctrl+0. Keys, not QShortcuts: a main window's actions on the same
        keys then win without making the shortcut ambiguous."""
        ctrl = bool(event.modifiers() & Qt.ControlModifier)
        key = event.key()
        if event.matches(QKeySequence.ZoomIn) or (ctrl and key in (Qt.Key_Equal, Qt.Key_Plus)):
            self.zoom_in()
        elif event.matches(QKeySequence.ZoomOut) or (ctrl and key == Qt.Key_Minus):
            self.zoom_out()
        elif ctrl and key == Qt.Key_0:
            self.fit()
        else:
            super().keyPressEvent(event)
            return
        event.accept()

    # -- mouse ------------------------------------------------------------------------------------
    def viewportEvent(self, event) -> bool:
        if event.type() == QEvent.ToolTip and self.state.call is not None:
            item = self._item_at(event.pos(), NodeItem)
            if item is not None and not item.toolTip():
                item.setToolTip(tooltip(self.state.call, item.node_id))
        return super().viewportEvent(event)

    def mousePressEvent(self, event) -> None:
        self.state.opening = False
        self._press = event.position() if event.button() == Qt.LeftButton else None
        super().mousePressEvent(event)

    def mouseReleaseEvent(self, event) -> None:
        super().mouseReleaseEvent(event)
        if self._press is not None and (event.position() - self._press).manhattanLength() < 5:
            item = self._item_at(event.position().toPoint(), NodeItem)
            if item is not None:
                self._clicked = item.node_id
                self.sig_select_requested.emit(item.node_id)
        self._press = None
        event.accept()

    def mouseDoubleClickEvent(self, event) -> None:
        node = self._item_at(event.position().toPoint(), NodeItem)
        if node is not None and node.node_id.startswith("group:"):
            self.toggle_group(node.node_id[6:])
            return
        if node is not None and self.open_nested(node.node_id):
            event.accept()
            return
        if node is None:
            frame = self._item_at(event.position().toPoint(), GroupBoxItem)
            if frame is not None:
                self.toggle_group(frame.path)
                return
        super().mouseDoubleClickEvent(event)

    def open_nested(self, node_id: str, which: int = 0) -> bool:
        """Ask to show the backward call run inside checkpoint node ``node_id``; False when it ran none."""
        inner = nested_calls(self.state.call, self.state.call.node(node_id) if self.state.call is not None else None)
        if not inner:
            return False
        self.sig_open_call.emit(inner[min(which, len(inner) - 1)].id)
        return True

    def _item_at(self, pos, cls):
        for item in self.items(pos):
            if isinstance(item, cls):
                return item
        return None
