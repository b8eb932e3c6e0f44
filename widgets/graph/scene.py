"""Filling a QGraphicsScene from a Layout: item styles, tooltips, edge shapes, search text.

Kept apart from ``GraphView`` so the view holds interaction only; everything here is a
function of the call, its layout and the theme.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, QRectF, Qt, QThreadPool, QTimer, Signal
from PySide6.QtGui import QFontMetricsF
from PySide6.QtWidgets import QGraphicsScene, QGraphicsSimpleTextItem

from core.model.anatomy import line_name, stale_tip
from core.model.causes import blamed_nodes
from core.layout.boxes import Layout
from core.layout.compound import layout_call
from core.layout.groups import PAGE_MARK, default_collapsed, group_info
from core.layout.visible import edge_shapes, node_label
from core.model.values import format_shape
from core.layout.opening import opening_layout
from core.layout.visible import prepare_folds
from core.model.trace import CallInfo, paused_gc
from widgets.display_text import cut_line, cut_text
from widgets.graph.items import EdgeItem, GroupBoxItem, NodeItem, SavedItem
from widgets.graph.edge_labels import place_edge_labels, replace_edge_labels
from widgets.graph.minimap import OverviewItem
from widgets.graph.painting import NodeStyle, color, font
from widgets.theme import Theme

log = logging.getLogger(__name__)

KIND_NAMES = {"backward": "backward op", "accumulate_grad": "leaf (AccumulateGrad)", "custom": "custom Function"}


@dataclass
class SceneItems:
    nodes: dict[str, NodeItem] = field(default_factory=dict)
    edges: list[EdgeItem] = field(default_factory=list)
    groups: dict[str, GroupBoxItem] = field(default_factory=dict)
    saved: list[SavedItem] = field(default_factory=list)
    overview: OverviewItem | None = None
    banner: QGraphicsSimpleTextItem | None = None
    styles: dict[str, NodeStyle] = field(default_factory=dict)


def build_scene(
    scene: QGraphicsScene, call: CallInfo, layout: Layout, theme: Theme, *, show: bool, with_overview: bool
) -> SceneItems:
    """Add one item per box, edge, frame and saved tensor; ``show`` False adds them hidden.

    Node tooltips are made on first hover (``tooltip``), not here: most are never read, and
    making thousands of them up front costs a tenth of the build.
    """
    with paused_gc():
        return _build_scene(scene, call, layout, theme, show, with_overview)


def _build_scene(scene, call, layout, theme, show, with_overview) -> SceneItems:
    t = theme
    out = SceneItems(styles=node_styles(call, layout.nodes))
    curved = layout.engine != "dot"
    for g in layout.groups:
        if not g.collapsed:
            item = out.groups[g.path] = GroupBoxItem(g, t)
            _add(scene, item, show)
    shapes = edge_shapes(call)
    for e in layout.edges:
        item = EdgeItem(e, t, shapes.get(e.dst, ""), curved, layout.direction == "LR")
        _add(scene, item, show)
        out.edges.append(item)
    for box in layout.nodes.values():
        item = out.nodes[box.id] = NodeItem(box, out.styles[box.id], t)
        _add(scene, item, show)
    for s in layout.saved:
        tensor = call.tensor(s.tensor)
        tip = f"saved for backward: {s.name}" + (
            f"\n{format_shape(tensor.shape)} {tensor.dtype}" if tensor else f"\n{s.state}"
        )
        item = SavedItem(s, layout.nodes[s.node], t, tensor is not None and not tensor.requires_grad, tip)
        _add(scene, item, show)
        out.saved.append(item)
    out.overview = OverviewItem(layout, out.styles, t)
    if with_overview:
        out.overview.setVisible(not show)
        scene.addItem(out.overview)
    rect = QRectF(0, 0, layout.width, layout.height)
    if call.error is not None:  # a banner above the graph, part of the scene so exports show it
        f = font(t.font_family, t.font_px, True)
        message = cut_line(f"This call raised {call.error.type}: {call.error.message}", 1_000)
        out.banner = QGraphicsSimpleTextItem(
            QFontMetricsF(f).elidedText(message, Qt.ElideRight, max(layout.width - 16, 640))
        )
        out.banner.setFont(f)
        out.banner.setBrush(color(t.error))
        out.banner.setPos(8, -18)
        out.banner.setToolTip(message)
        scene.addItem(out.banner)
        rect = rect.united(out.banner.sceneBoundingRect().adjusted(-8, -6, 8, 0))
    scene.setSceneRect(rect)
    return out


def build_message(scene: QGraphicsScene, text: str, theme: Theme) -> None:
    """A scene holding only a line of text (no call, an empty call, a failed layout)."""
    item = QGraphicsSimpleTextItem(text)
    item.setFont(font(theme.font_family, theme.font_px + 2))
    item.setBrush(color(theme.muted_text))
    scene.addItem(item)
    scene.setSceneRect(item.boundingRect().adjusted(-40, -40, 40, 40))


def _add(scene: QGraphicsScene, item, show: bool) -> None:
    if not show:
        item.setVisible(False)
    scene.addItem(item)


def node_styles(call: CallInfo, box_ids) -> dict[str, NodeStyle]:
    """Style of each drawn box. When a call raised and no node is to blame, all its nodes are marked."""
    blamed = blamed_nodes(call)
    failed_call = call.error is not None and blamed is None
    out = {}
    for box_id in box_ids:
        if box_id.startswith("group:"):
            out[box_id] = NodeStyle("group", error=failed_call)
            continue
        n = call.node(box_id)
        shape = {"backward": "op", "accumulate_grad": "leaf", "custom": "custom"}.get(n.kind, "other")
        t = call.tensor(n.variable or n.tensor)
        no_grad = t is not None and not t.requires_grad
        stale = n.stale is not None
        error = stale or failed_call or (blamed is not None and n.id in blamed)
        out[box_id] = NodeStyle(shape, no_grad, t is not None and t.retains_grad, error, stale)
    return out


TIP_LINE, TIP_TEXT = 200, 2_000  # a tooltip shows long names cut


def tooltip(call: CallInfo, box_id: str) -> str:
    if box_id.startswith("group:"):
        path = box_id[6:]
        count = group_info(call).count.get(path, 0)
        info = group_info(call)
        ins, outs = info.boundary(path)
        title = f"{info.title(path)} (collapsed)" if path in info.pages else f"module {path} (collapsed)"
        lines = [title, f"{count:,} nodes"]
        if path in info.repeat:
            lines.append(f"{info.repeat[path]} blocks built of the same ops")
        lines.append(f"reads {ins} node{'s' if ins != 1 else ''} from outside, read by {outs}")
        return cut_text("\n".join(lines + ["double-click to expand"]), TIP_LINE, TIP_TEXT)
    n = call.node(box_id)
    lines = [n.name, f"kind: {KIND_NAMES.get(n.kind, n.kind)}"]
    t = call.tensor(n.variable or n.tensor)
    if t is not None:
        lines.append(f"tensor: {t.name or n.label or '(unnamed)'}  {format_shape(t.shape)}  {t.dtype}")
        if not t.requires_grad:
            lines.append("does not require grad")
        if t.retains_grad:
            lines.append("retains .grad")
    elif n.label:
        lines.append(f"tensor: {n.label}")
    if n.line:
        lines.append(line_name(call, n.line))
    module = group_info(call).module.get(n.id)
    if module and module.startswith(PAGE_MARK):  # a page of a huge call, not a module
        module = module.partition(".")[2]
    if module:
        lines.append(f"module {module}")
    if n.inplace:
        lines.append(f"made by the in-place op {n.inplace}")
    if n.stale is not None:
        lines.append(stale_tip(call, n))
    return cut_text("\n".join(lines), TIP_LINE, TIP_TEXT)


def search_index(call: CallInfo) -> dict[str, str]:
    """Lower-case text searched for each trace node: name, label, tensor names."""
    out = {}
    for n in call.nodes:
        names = [n.name, node_label(call, n), n.label or ""]
        for tid in (n.variable, n.tensor):
            t = call.tensor(tid)
            if t is not None and t.name:
                names.append(t.name)
        out[n.id] = "\n".join(names).lower()
    return out


def legend_entries(styles: dict[str, NodeStyle], frames: bool, saved: list[SavedItem], states, marks=()) -> list[str]:
    """Legend keys for what the scene shows, in a fixed order; ``marks`` from ``MarkItems.legend``."""
    present = {s.shape for s in styles.values()}
    entries = [k for k in ("op", "leaf", "custom", "other", "group") if k in present]
    if frames:
        entries.append("frame")
    if saved:
        entries.append("saved")
    if any(s.no_grad for s in styles.values()) or any(i.no_grad for i in saved):
        entries.append("no_grad")
    if any(s.retained for s in styles.values()):
        entries.append("retained")
    if any(s.error for s in styles.values()):
        entries.append("error")
    if any(s.stale for s in styles.values()):
        entries.append("stale")
    entries += marks
    return entries + [s for s in ("executed", "current", "frontier", "failed") if s in set(states)]


def toggled(info, collapsed: frozenset[str], path: str, one_level_above: int) -> frozenset[str]:
    """The collapsed set after folding or unfolding ``path``; a big group opens one level."""
    if path in collapsed:
        paths = set(collapsed) - {path}
        if info.count.get(path, 0) > one_level_above or path in info.repeat:
            paths |= set(info.drawn_children(path))  # a "× N" stack opens to its members
    else:
        paths = {p for p in collapsed if not p.startswith(path + ".")} | {path}
    return frozenset(paths)


def overview_marks(nodes: dict[str, NodeItem], selected: str | None) -> dict[str, str]:
    """Boxes the zoomed-out overview rings: search matches, running or failed steps, the selection."""
    marks = {v: "highlight" for v, i in nodes.items() if i.highlighted}
    marks.update({v: i.state for v, i in nodes.items() if i.state in ("current", "failed")})
    if selected is not None:
        marks[selected] = "selection"
    return marks


def compute_layout(call: CallInfo, collapsed, show_saved: bool, engine: str, area=None, direction: str = "TB"):
    """(collapsed groups, layout). When ``collapsed`` is None: the opening fold that fits ``area``
    (viewport width, height) readably, or ``default_collapsed`` without an area."""
    if collapsed is None and area is not None:
        return opening_layout(call, area, show_saved=show_saved, engine=engine, direction=direction)
    if collapsed is None:
        collapsed = default_collapsed(call)
    collapsed = frozenset(collapsed)
    return collapsed, layout_call(call, collapsed=collapsed, show_saved=show_saved, engine=engine, direction=direction)


class LayoutRunner(QObject):
    """Lays out calls on one worker thread; results come back as signals on the GUI thread."""

    sig_done = Signal(int, object)
    """A layout finished: (generation, (collapsed, layout))."""
    sig_failed = Signal(int, str)
    """A layout raised: (generation, message)."""

    def __init__(self, parent: QObject):
        super().__init__(parent)
        self._pool = QThreadPool(self)
        self._pool.setMaxThreadCount(1)
        self._latest = 0  # the generation of the last layout asked for
        self._asked: tuple | None = None  # (generation, call) of the last layout run off the GUI thread
        self._shown: tuple | None = None  # (generation, call, collapsed) of the last one shown
        # Once a layout is shown, the layout thread prepares the next fold; it waits until the
        # scene is built and painted, as preparing meanwhile would slow both (one interpreter).
        self._prepare_timer = QTimer(self)
        self._prepare_timer.setSingleShot(True)
        self._prepare_timer.setInterval(PREPARE_DELAY_MS)
        self._prepare_timer.timeout.connect(self._prepare)
        self.sig_done.connect(self._after_done)

    def run(self, gen: int, call: CallInfo, collapsed, show_saved: bool, engine: str, *, sync: bool = False,
            area=None, direction: str = "TB") -> None:
        def job() -> None:
            try:
                result = compute_layout(call, collapsed, show_saved, engine, area, direction)
            except Exception as exc:  # a bad trace must not take the window down
                log.exception("layout failed")
                _emit(self.sig_failed, gen, f"{type(exc).__name__}: {exc}")
                return
            _emit(self.sig_done, gen, result)

        self._latest = gen
        self._asked = None if sync else (gen, call)
        if sync:
            job()
        else:
            self._pool.start(job)

    def wait(self, msecs: int) -> None:
        self._pool.waitForDone(msecs)

    def _after_done(self, gen: int, result) -> None:
        if self._asked is not None and self._asked[0] == gen == self._latest:
            self._shown = (gen, self._asked[1], result[0])
            self._prepare_timer.start()

    def _prepare(self) -> None:
        if self._shown is None or self._shown[0] != self._latest:
            return
        gen, call, collapsed = self._shown
        self._pool.start(lambda: prepare_next_fold(call, collapsed, lambda: self._latest != gen))


PREPARE_DELAY_MS = 150


def prepare_next_fold(call: CallInfo, collapsed, stop) -> None:
    """On the layout thread, once a layout is shown: what the user's next fold will need, until
    ``stop()`` says another layout is waiting."""
    try:
        prepare_folds(call, collapsed, stop)
    except Exception:  # only a head start: the fold itself computes what is missing
        log.exception("preparing folds failed")


def _emit(signal, *args) -> None:
    try:
        signal.emit(*args)
    except RuntimeError:  # the view was deleted while the layout ran
        pass


def apply_edge_texts(view) -> int:
    """Put gradient texts on the view's edges, touching only those that changed since last time;
    returns how many edge items were given a text."""
    members = view.state.layout.members if view.state.layout else {}
    values: dict[tuple[str, str], str] = {}
    sources: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for key, v in view.state.edge_texts.items():
        drawn = (members.get(key[0], key[0]), members.get(key[1], key[1]))
        values[drawn] = v  # several edges drawn as one (into a folded group): the last one's text
        sources.setdefault(drawn, []).append(key)
    stamp = (id(view.edge_items), len(view.edge_items), view.state.show_shapes)
    last = view.state.applied_texts
    touched = 0
    stepping = bool(view.state.states or view.state.edge_texts)
    if last is None or last[0] != stamp or any(i.stepping != stepping for i in view.edge_items[:1]):
        last = None
    if last is not None and last[0] == stamp:
        # Stepping changes a few edges at a time: touch only those (5,000-edge graphs).
        by_key = last[2]
        changed = {k for k in values.keys() | last[1].keys() if values.get(k) != last[1].get(k)}
        moved = []
        for key in changed:
            for item in by_key.get(key, ()):
                item.set_texts(show_shape=view.state.show_shapes, value=values.get(key, ""))
                moved.append(item)
                touched += 1
        replace_edge_labels(view.scene(), view.edge_items, moved)
    else:
        by_key = {}
        for item in view.edge_items:
            by_key.setdefault(item.key, []).append(item)
            item.set_texts(show_shape=view.state.show_shapes, value=values.get(item.key, ""), stepping=stepping)
            touched += 1
        place_edge_labels(view.scene(), view.edge_items)
    view.state.applied_texts = (stamp, values, by_key, sources)
    return touched


def update_edge_texts(view, changes: dict[tuple[str, str], str | None]) -> int:
    """Apply changed edge texts (None removes one) to the view's ``_edge_texts`` and to the edge
    items they are drawn on, and nothing else: O(changes), not O(edges). Returns how many edge
    items were given a text. Gives what ``apply_edge_texts`` would: a drawn edge that stands for
    several (into a folded group) shows the text of the one that got its first text last."""
    texts = view.state.edge_texts
    last = view.state.applied_texts
    stamp = (id(view.edge_items), len(view.edge_items), view.state.show_shapes)
    if last is None and view.state.layout is not None and not view.state.show_shapes and not texts:
        # A scene built without texts: every edge shows none; index the edges, touch none.
        by_key: dict[tuple[str, str], list] = {}
        for item in view.edge_items:
            by_key.setdefault(item.key, []).append(item)
        last = view.state.applied_texts = (stamp, {}, by_key, {})
    touched = _enter_stepping(view) if view.edge_items and not view.edge_items[0].stepping else 0
    if last is None or last[0] != stamp or view.state.layout is None:
        for key, text in changes.items():
            if text is None:
                texts.pop(key, None)
            else:
                texts[key] = text
        return touched + (apply_edge_texts(view) if view.state.layout is not None else 0)
    _, values, by_key, sources = last
    members = view.state.layout.members
    drawn_keys = set()
    for key, text in changes.items():
        drawn = (members.get(key[0], key[0]), members.get(key[1], key[1]))
        keys = sources.setdefault(drawn, [])
        if text is None:
            if texts.pop(key, None) is not None:
                keys.remove(key)
        else:
            if key not in texts:
                keys.append(key)
            texts[key] = text
        drawn_keys.add(drawn)
    moved = []
    for drawn in drawn_keys:
        keys = sources.get(drawn)
        value = texts[keys[-1]] if keys else None
        if value == values.get(drawn):
            continue
        if value is None:
            values.pop(drawn, None)
        else:
            values[drawn] = value
        for item in by_key.get(drawn, ()):
            item.set_texts(show_shape=view.state.show_shapes, value=value or "")
            moved.append(item)
            touched += 1
    replace_edge_labels(view.scene(), view.edge_items, moved)
    return touched


def _enter_stepping(view) -> int:
    """Stepping starts: edges show only the gradients steps gave them, not the call's (Values).
    Returns how many edge items changed text."""
    changed = []
    for item in view.edge_items:
        if item.grad_text and not item.value_text:
            item.set_texts(stepping=True)
            changed.append(item)
        else:
            item.stepping = True
    replace_edge_labels(view.scene(), view.edge_items, changed)
    return len(changed)
