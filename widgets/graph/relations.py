"""Folding the whole graph, showing how nodes relate, and where the view is.

- Expand all, collapse all, fold to a depth of the module tree.
- For a node: what feeds it gradient (its ancestors, toward the loss), where its gradient
  flows (its descendants, toward the leaves), the paths from the loss to it; and, for two
  calls, the nodes and edges one has that the other lacks. The graph questions are answered
  by ``core.model.graph_query`` (networkx); this module only marks the answer on the drawing.
- Breadcrumbs: the module path of the frame at the centre of the view, each part a link that
  frames that module.
- A context menu offering all of the above.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QLabel, QMenu

from core.model.graph_query import CallDiff, ancestors, compare_calls, descendants, loss_to_leaf_paths, path_edges
from core.layout.groups import group_info
from core.model.nesting import link_nested, nested_calls
from core.model.trace import CallInfo
from widgets.display_text import cut_line
from widgets.graph.items import GroupBoxItem, NodeItem

CRUMBS_HEAD, CRUMBS_TAIL = 2, 6  # a deeper module path shows its first and last parts only


@dataclass
class Related:
    """What is marked: trace node ids and (src, dst) edges, and a line saying what it is."""

    nodes: set[str] = field(default_factory=set)
    edges: set[tuple[str, str]] | None = None  # None: every edge between marked nodes
    note: str = ""


class Breadcrumbs(QLabel):
    """``model › transformer › h × 12 › 7``: where the view is; click a part to frame it."""

    def __init__(self, view):
        super().__init__(view)
        self._view = view
        self.setTextFormat(Qt.RichText)
        self.setAttribute(Qt.WA_TransparentForMouseEvents, False)
        self.setStyleSheet("QLabel { background: rgba(255,255,255,215); border: 1px solid #c8ccd2;"
                           " border-radius: 4px; padding: 2px 6px; color: #333; }")
        self.linkActivated.connect(view.frame_group)
        self._key = None
        self._frames = None  # (layout, [(left, top, right, bottom, path)]) of its open frames
        self.hide()

    def update_for(self, layout, call: CallInfo | None, centre, note: str) -> None:
        path = None
        if layout is not None and call is not None:
            if self._frames is None or self._frames[0] is not layout:
                # open frames, deepest first: called on every scroll, so no Qt object per frame
                frames = sorted((g for g in layout.groups if not g.collapsed), key=lambda g: -g.depth)
                self._frames = (layout, [(g.x, g.y, g.x + g.w, g.y + g.h, g.path) for g in frames])
            x, y = centre.x(), centre.y()
            path = next((p for x0, y0, x1, y1, p in self._frames[1] if x0 <= x <= x1 and y0 <= y <= y1), None)
        key = (path, note, id(layout))
        if key == self._key:
            return
        self._key = key
        parts = ['<a href="">graph</a>']
        if path is not None:
            info = group_info(call)
            chain = [g for g in info.ancestors[path] if info.is_drawn(g)]
            parent = None
            for k, g in enumerate(chain):
                if CRUMBS_HEAD <= k < len(chain) - CRUMBS_TAIL:  # a very deep path: its middle is one "…"
                    if k == CRUMBS_HEAD:
                        parts.append(f"… {len(chain) - CRUMBS_HEAD - CRUMBS_TAIL:,} more …")
                else:
                    parts.append(f'<a href="{html.escape(g)}">{html.escape(cut_line(info.title(g, parent), 80))}</a>')
                parent = g
        text = " \u203a ".join(parts)
        if note:
            text += f"<br><span style='color:#8a5a00'>{html.escape(cut_line(note))}</span>"
        self.setText(text)
        self.adjustSize()
        self.setVisible(layout is not None and (path is not None or bool(note)))
        self.move(8, 8)
        self.raise_()


class RelationsMixin:
    """Folding, related-node marks, call comparison, breadcrumbs and the context menu."""

    def _init_relations(self) -> None:
        self._peers: list[CallInfo] = []
        self.crumbs = Breadcrumbs(self)

    # -- folding -----------------------------------------------------------------------------
    def expand_all(self, *, sync: bool | None = None) -> None:
        """Open every module; the pages of a huge call stay folded (each opens on its own), as
        drawing 100,000 boxes at once would stall the window."""
        pages = frozenset(group_info(self.state.call).pages) if self.state.call is not None else frozenset()
        self.set_collapsed(pages, sync=self.state.sync if sync is None else sync)

    def collapse_all(self, *, sync: bool | None = None) -> None:
        """Fold every top-level module (the graph's overview)."""
        self.set_fold_depth(0, sync=sync)

    def set_fold_depth(self, depth: int, *, sync: bool | None = None) -> None:
        """Open ``depth`` levels of the module tree; deeper modules fold (0: every top-level module)."""
        if self.state.call is not None:
            coll = group_info(self.state.call).fold_to_depth(depth)
            self.set_collapsed(coll, sync=self.state.sync if sync is None else sync)

    def frame_group(self, path: str) -> None:
        """Fit the frame of module ``path`` in the view ("" or unknown: the whole graph)."""
        item = self.group_items.get(path) or self.node_items.get("group:" + path)
        if item is None:
            self.fit()
            return
        r = item.sceneBoundingRect()
        area = self._area()
        s = self._fit_scale(r, area)
        self.set_zoom(s * 100)
        self._center_in(r.center(), area)
        self._after_zoom()

    # -- related nodes -------------------------------------------------------------------------
    def show_related(self, node_id: str, mode: str) -> set[str]:
        """Mark ``mode`` of trace node ``node_id``: "upstream" (what feeds it gradient, toward the
        loss), "downstream" (where its gradient flows, toward the leaves) or "paths" (from the
        loss to it). Returns the marked node ids, the node itself included."""
        call = self.state.call
        if call is None or call.node(node_id) is None:
            return set()
        name = call.node(node_id).name
        if mode == "upstream":
            nodes = ancestors(call, node_id)
            rel = Related(nodes | {node_id}, None, f"{len(nodes):,} nodes feed gradient into {name}")
        elif mode == "downstream":
            nodes = descendants(call, node_id)
            rel = Related(nodes | {node_id}, None, f"the gradient of {name} flows into {len(nodes):,} nodes")
        elif mode == "paths":
            paths = loss_to_leaf_paths(call, node_id)
            rel = Related({n for p in paths for n in p}, path_edges(paths),
                          f"{len(paths)} path{'s' if len(paths) != 1 else ''} from the loss to {name}")
        else:
            raise ValueError(f"unknown mode {mode!r}: use upstream, downstream or paths")
        self.state.related = rel
        self._apply_related()
        return set(rel.nodes)

    def set_peer_calls(self, calls: list[CallInfo]) -> None:
        """The other calls of the run, offered by "Compare with call"."""
        self._peers = [c for c in calls if c.nodes]
        link_nested(calls)  # checkpoint nodes list the backward calls run inside them

    def show_diff(self, other: CallInfo) -> CallDiff:
        """Mark what this call has that ``other`` lacks (nodes and edges added since ``other``)."""
        diff = compare_calls(other, self.state.call)
        if diff.same_structure:
            note = f"same structure as #{other.index} (verified node by node)"
        else:
            note = f"since #{other.index}: {diff.summary()}"
        self.state.related = Related(set(diff.added_nodes), set(diff.added_edges), note)
        self._apply_related()
        return diff

    def clear_related(self) -> None:
        self.state.related = None
        self._apply_related()

    def related_note(self) -> str:
        return self.state.related.note if self.state.related else ""

    def _apply_related(self) -> None:
        for item, accent in self.state.accented:
            item.set_accent(accent)
        self.state.accented = []
        self._apply_matches()
        rel = self.state.related
        if rel is None or self.state.layout is None:
            self._update_crumbs()
            return
        members = self.state.layout.members
        boxes = {members.get(n, n) for n in rel.nodes}
        for vid in boxes:
            item = self.node_items.get(vid)
            if item is not None:
                item.set_highlighted(True)
        if rel.edges is None:
            keys = None
        else:
            keys = {(members.get(a, a), members.get(b, b)) for a, b in rel.edges}
        for e in self.edge_items:
            if (e.key in keys) if keys is not None else (e.key[0] in boxes and e.key[1] in boxes):
                self.state.accented.append((e, e.accent))
                e.set_accent("highlight")
        self._update_marks()
        self._update_crumbs()

    def _update_crumbs(self) -> None:
        centre = self.mapToScene(self.viewport().rect().center())
        self.crumbs.update_for(self.state.layout, self.state.call, centre, self.related_note())

    # -- the context menu ------------------------------------------------------------------------
    def contextMenuEvent(self, event) -> None:
        menu = self.context_menu(event.pos())
        menu.exec(event.globalPos())

    def context_menu(self, pos: QPoint) -> QMenu:
        """The menu for a right-click at ``pos`` (viewport coordinates)."""
        menu = QMenu(self)
        item = self._item_at(pos, NodeItem)
        node = item.node_id if item is not None and not item.node_id.startswith("group:") else None
        if node is not None:
            menu.addAction("What feeds it gradient (toward the loss)", lambda: self.show_related(node, "upstream"))
            menu.addAction("Where its gradient flows (toward the leaves)",
                           lambda: self.show_related(node, "downstream"))
            menu.addAction("Paths from the loss to here", lambda: self.show_related(node, "paths"))
            for k, inner in enumerate(nested_calls(self.state.call, self.state.call.node(node))):
                menu.addAction(f"Show nested backward #{inner.index}", lambda k=k: self.open_nested(node, k))
        elif item is not None:
            menu.addAction("Expand this module", lambda: self.toggle_group(item.node_id[6:]))
        if item is None or node is not None:
            frame = self._item_at(pos, GroupBoxItem)
            if frame is not None:
                menu.addAction(f"Collapse {frame.path}", lambda: self.toggle_group(frame.path))
        peers = [c for c in self._peers if self.state.call is not None and c.id != self.state.call.id]
        if peers:
            sub = menu.addMenu("Compare with call")
            for c in peers[:30]:
                sub.addAction(c.title, lambda c=c: self.show_diff(c))
        if self.state.related is not None:
            menu.addAction("Clear highlights", self.clear_related)
        menu.addSeparator()
        menu.addAction("Expand all modules", self.expand_all)
        menu.addAction("Collapse all modules", self.collapse_all)
        depth = menu.addMenu("Open modules to depth")
        for d in range(1, 5):
            depth.addAction(str(d), lambda d=d: self.set_fold_depth(d))
        menu.addAction("Fit (Ctrl+0)", self.fit)
        return menu
