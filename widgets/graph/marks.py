"""Tensor-anatomy marks on the graph: in-place ops, stale saved tensors, shared storages, devices,
and the op a script's forward pass failed in.

Tags are small labelled pills on a node, a saved box or an edge; storage links are dashed lines
between the items whose tensors share one storage. What to mark comes from ``core.model.anatomy``
(and ``core.model.forward_errors`` for a failed op); this module only places and paints it. Every
mark has a tooltip that explains it in plain words. In-place, stale, failed-op and device marks
are always drawn; links and view tags only with sharing on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QPainter, QPainterPath, QPainterPathStroker, QPen
from PySide6.QtWidgets import QGraphicsItem, QGraphicsScene, QStyleOptionGraphicsItem

from core.model import anatomy
from core.model.forward_errors import failed_op, mark_text, mark_tip
from core.model.nan_check import nonfinite_marks
from core.layout.boxes import Layout
from core.layout.groups import node_index
from core.layout.visible import open_nodes
from core.model.trace import CallInfo
from widgets.graph.items import EdgeItem, NodeItem, SavedItem, edge_path
from widgets.graph.teaching import Placer, beside, teaching_items
from widgets.graph.links import LinkEnd, Obstacles, label_spot, link_route, rect_tuple, route_path, spanning_pairs
from widgets.graph.painting import MIN_TEXT_PX, color, font, text_width
from widgets.theme import Theme

# kind -> (line and text colour, fill colour, bold): theme attribute names
TAG_STYLES = {
    "stale": ("error", "error_fill", True),
    "inplace": ("inplace", "background", False),
    "view": ("sharing", "background", False),
    "device": ("device", "background", False),
    "device_edge": ("device", "background", True),
    "allreduce": ("device", "background", False),
    "failed": ("error", "error_fill", True),
    "nonfinite": ("error", "error_fill", True),
}
NODE_TAG_ORDER = ("nonfinite", "stale", "inplace", "view", "device", "allreduce")
UNFOLDED_KINDS = ("nonfinite",)  # one tag each, not "text +1"
TAG_GAP = 3.0
LINK_Z = 0.5  # above edges and nodes (routes go around boxes), below tags
TAG_Z = 2.0  # above everything
CAREFUL_LINKS = 400  # up to this many links in a scene, routes go around boxes; beyond, the shortest
_CACHE = QGraphicsItem.DeviceCoordinateCache


def tag_size(text: str, theme: Theme, bold: bool) -> tuple[float, float]:
    return text_width(text, theme.font_family, theme.small_font_px, bold) + 10, theme.small_font_px + 5.0


def paint_tag(p: QPainter, rect: QRectF, kind: str, text: str, theme: Theme, lod: float = 1.0) -> None:
    """A pill with a border in the kind's colour; the text only where it is readable."""
    line, fill, bold = TAG_STYLES[kind]
    p.setRenderHint(QPainter.Antialiasing, True)
    p.setPen(QPen(color(getattr(theme, line)), 1.6 if bold else 1.1))
    p.setBrush(color(getattr(theme, fill)))
    r = rect.height() / 2
    p.drawRoundedRect(rect.adjusted(0.5, 0.5, -0.5, -0.5), r, r)
    if lod * theme.small_font_px >= MIN_TEXT_PX:
        p.setFont(font(theme.font_family, theme.small_font_px, bold))
        p.setPen(color(theme.text if kind in ("inplace", "device", "failed") else getattr(theme, line)))
        p.drawText(rect, Qt.AlignCenter, text)


class TagItem(QGraphicsItem):
    """A labelled pill: ``kind`` is stale, inplace, view, device, device_edge, allreduce, failed or
    nonfinite;
    ``target`` what it marks."""

    def __init__(self, kind: str, text: str, tip: str, theme: Theme, target):
        super().__init__()
        self.kind = kind
        self.text = text
        self.target = target  # a box id, ("saved", node id, name) or (src box, dst box)
        self.theme = theme
        w, h = tag_size(text, theme, TAG_STYLES[kind][2])
        self._rect = QRectF(0, 0, w, h)
        self.setToolTip(tip)
        self.setZValue(TAG_Z)
        self.setCacheMode(_CACHE)

    def size(self) -> tuple[float, float]:
        return self._rect.width(), self._rect.height()

    def label_obstacle(self) -> QRectF:
        """What edge labels keep off: the whole tag (see ``widgets.graph.edge_labels``)."""
        return self.sceneBoundingRect()

    def boundingRect(self) -> QRectF:
        return self._rect.adjusted(-1, -1, 1, 1)

    def paint(self, p: QPainter, option: QStyleOptionGraphicsItem, widget=None) -> None:
        lod = option.levelOfDetailFromTransform(p.worldTransform())
        paint_tag(p, self._rect, self.kind, self.text, self.theme, lod)

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.update()


class FailLinkItem(QGraphicsItem):
    """Dashed red lines from a failed op's mark to the boxes of the inputs it was called on, each
    ending in a dot on the box's border: where the op would have joined the graph."""

    def __init__(self, lines: list[tuple[QPointF, QPointF]], tip: str, theme: Theme, targets: tuple):
        super().__init__()
        self.lines = lines
        self.targets = targets  # the input boxes, as the lines reach them
        self.theme = theme
        rect = QRectF()
        for a, b in lines:
            rect = rect.united(QRectF(a, b).normalized())
        self._bounds = rect.adjusted(-4, -4, 4, 4)
        self.setToolTip(tip)
        self.setZValue(LINK_Z)

    def boundingRect(self) -> QRectF:
        return self._bounds

    def paint(self, p: QPainter, option: QStyleOptionGraphicsItem, widget=None) -> None:
        t = self.theme
        p.setRenderHint(QPainter.Antialiasing, True)
        pen = QPen(color(t.error), 1.6, Qt.CustomDashLine)
        pen.setDashPattern([4.0, 3.0])
        pen.setCapStyle(Qt.FlatCap)
        for a, b in self.lines:
            p.setPen(pen)
            p.drawLine(a, b)
            p.setPen(Qt.NoPen)
            p.setBrush(color(t.error))
            p.drawEllipse(b, 3.0, 3.0)

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.update()


def link_pen(theme: Theme, width: float = 1.5) -> QPen:
    pen = QPen(color(theme.sharing), width, Qt.CustomDashLine)
    pen.setDashPattern([4.0, 3.0])
    pen.setCapStyle(Qt.FlatCap)
    return pen


class ShareLinkItem(QGraphicsItem):
    """A dashed line between two items whose tensors share ``storage``, labelled with its id."""

    def __init__(self, storage: str, ends: tuple, path: QPainterPath, mid: QPointF, tip: str, theme: Theme):
        super().__init__()
        self.storage = storage
        self.ends = ends  # the two marked items' keys: box id or ("saved", node id, name)
        self.theme = theme
        self._path = path
        w, h = tag_size(storage, theme, False)
        self._label = QRectF(mid.x() - w / 2, mid.y() - h / 2, w, h)
        self._shape: QPainterPath | None = None  # made on first hover: most links are never hovered
        self.careful = True  # routed around boxes; edge labels keep off its line (``line_obstacles``)
        self._bounds = path.boundingRect().adjusted(-3, -3, 3, 3).united(self._label.adjusted(-1, -1, 1, 1))
        self.setToolTip(tip)
        self.setZValue(LINK_Z)
        self.setCacheMode(_CACHE)

    def label_obstacle(self) -> QRectF:
        """What edge labels keep off: the pill that names the storage (see ``widgets.graph.edge_labels``)."""
        return self._label.translated(self.pos())

    def line_obstacles(self, piece: float = 12.0) -> list[tuple[float, float, float, float]]:
        """The dashed line as small boxes (x0, y0, x1, y1) of at most ``piece`` px along it, which
        edge labels keep off too: a label crossed by a link is hard to read. Nothing for the links
        of a scene with more than ``CAREFUL_LINKS`` (their routes do not go around boxes either)."""
        if not self.careful:
            return []
        out = []
        dx, dy = self.pos().x(), self.pos().y()
        for poly in self._path.toSubpathPolygons():
            points = [(p.x() + dx, p.y() + dy) for p in poly]
            for (x0, y0), (x1, y1) in zip(points, points[1:]):
                n = max(1, int(max(abs(x1 - x0), abs(y1 - y0)) // piece) + 1)
                for i in range(n):
                    ax, ay = x0 + (x1 - x0) * i / n, y0 + (y1 - y0) * i / n
                    bx, by = x0 + (x1 - x0) * (i + 1) / n, y0 + (y1 - y0) * (i + 1) / n
                    out.append((min(ax, bx) - 0.75, min(ay, by) - 0.75, max(ax, bx) + 0.75, max(ay, by) + 0.75))
        return out

    def boundingRect(self) -> QRectF:
        return self._bounds

    def shape(self) -> QPainterPath:
        if self._shape is None:
            stroker = QPainterPathStroker()
            stroker.setWidth(8)
            self._shape = stroker.createStroke(self._path)
            self._shape.addRect(self._label)
        return self._shape

    def paint(self, p: QPainter, option: QStyleOptionGraphicsItem, widget=None) -> None:
        t = self.theme
        lod = option.levelOfDetailFromTransform(p.worldTransform())
        p.setRenderHint(QPainter.Antialiasing, True)
        p.setPen(link_pen(t))
        p.setBrush(Qt.NoBrush)
        p.drawPath(self._path)
        p.setPen(QPen(color(t.sharing), 1.0))
        p.setBrush(color(t.background))
        r = self._label.height() / 2
        p.drawRoundedRect(self._label, r, r)
        if lod * t.small_font_px >= MIN_TEXT_PX:
            p.setFont(font(t.font_family, t.small_font_px))
            p.setPen(color(t.sharing))
            p.drawText(self._label, Qt.AlignCenter, self.storage)

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.update()


def paint_legend_sample(p: QPainter, key: str, rect: QRectF, theme: Theme) -> bool:
    """The legend's picture for a mark; False for keys that are not marks."""
    if key == "sharing":
        p.setRenderHint(QPainter.Antialiasing, True)
        p.setPen(link_pen(theme))
        y = rect.center().y()
        p.drawLine(QPointF(rect.left(), y), QPointF(rect.right(), y))
        return True
    sample = {"inplace": "\u270e", "view": "view", "device": "\u2192", "failed_op": "failed",
              "nonfinite": "NaN"}.get(key)
    if sample is None:
        return False
    kind = {"device": "device_edge", "failed_op": "failed"}.get(key, key)
    w, h = tag_size(sample, theme, TAG_STYLES[kind][2])
    c = rect.center()
    paint_tag(p, QRectF(c.x() - w / 2, c.y() - h / 2, w, h), kind, sample, theme)
    return True


@dataclass
class MarkItems:
    """The marks in a scene, and the legend keys they need."""

    tags: list[TagItem] = field(default_factory=list)
    links: list[ShareLinkItem] = field(default_factory=list)
    failed: list[FailLinkItem] = field(default_factory=list)  # a failed op's lines to its inputs
    accented: list[EdgeItem] = field(default_factory=list)  # edges drawn bold: a device change
    placer: Placer | None = None  # where the marks went: the scene's notes keep off them
    direction: str = "TB"  # the layout's: other than top down, the legend says which way arrows point

    def items(self) -> list[QGraphicsItem]:
        return [*self.links, *self.failed, *self.tags]

    def legend(self) -> list[str]:
        kinds = {t.kind for t in self.tags}
        keys = [k for k in ("inplace", "view") if k in kinds]
        if self.links:
            keys.insert(1 if "inplace" in keys else 0, "sharing")
        if "device_edge" in kinds:
            keys.append("device")
        if "failed" in kinds:
            keys.append("failed_op")
        if "nonfinite" in kinds:
            keys.append("nonfinite")
        if self.direction != "TB":
            keys.append("flow_forward" if self.direction == "forward" else "flow_backward")
        return keys

    def bounds(self) -> QRectF:
        rect = QRectF()
        for item in self.items():
            rect = rect.united(item.sceneBoundingRect())
        return rect

    def remove(self, scene: QGraphicsScene) -> None:
        for item in self.items():
            if item.scene() is scene:
                scene.removeItem(item)
        for edge in self.accented:
            edge.set_accent(None)
        self.tags, self.links, self.failed, self.accented = [], [], [], []


def all_reduce_tips(call: CallInfo) -> dict[str, tuple[str, str]]:
    """node id -> (tag, tooltip) for the AccumulateGrad nodes a DDP all-reduce wrote (see trace format)."""
    ar = (call.options or {}).get("all_reduce")
    if not ar:
        return {}
    out = {}
    names = {t.id: t.name for t in call.tensors}
    for n in call.nodes:
        if n.id not in ar.get("nodes", ()):
            continue
        name = names.get(n.variable)
        entry = ar.get("params", {}).get(name, {})

        def short(v):
            data = (v or {}).get("data") or (v or {}).get("sample") or []
            return "[" + ", ".join(f"{x:.4g}" for x in data[:4]) + (", …]" if len(data) > 4 else "]")

        tip = (f"DDP all-reduce ({ar.get('backend')}, {ar.get('world_size')} ranks, {ar.get('op')}): "
               f"{name}.grad on rank {ar.get('rank')} was {short(entry.get('local'))} after this node, "
               f"and {short(entry.get('reduced'))} once averaged over the ranks.")
        out[n.id] = (f"\u21c4 all-reduce \u00d7{ar.get('world_size')}", tip)
    return out


def _flagged(call: CallInfo) -> tuple[list, list]:
    """(stale nodes, in-place nodes) of the call, kept on the call."""
    cached = call.__dict__.get("_flagged_nodes")
    if cached is None:
        cached = ([n for n in call.nodes if n.stale is not None], [n for n in call.nodes if n.inplace])
        object.__setattr__(call, "_flagged_nodes", cached)
    return cached


def _in_order(call: CallInfo, stale: list, inplace: list) -> list:
    if not inplace:
        return stale
    if not stale:
        return inplace
    index = node_index(call)
    return sorted({id(n): n for n in (*stale, *inplace)}.values(), key=lambda n: index[n.id])


def build_marks(
    scene: QGraphicsScene,
    call: CallInfo,
    layout: Layout,
    nodes: dict[str, NodeItem],
    saved: list[SavedItem],
    edges: list[EdgeItem],
    theme: Theme,
    *,
    sharing: bool,
    show: bool = True,
) -> MarkItems:
    """Add the marks for ``call`` to a scene already filled from ``layout``."""
    out = MarkItems(placer=Placer(layout), direction=layout.direction)
    members = layout.members
    saved_at = {(s.saved.node, s.saved.name): s for s in saved}
    node_tags: dict[str, dict[str, list[tuple[str, str]]]] = {}  # box -> kind -> [(text, tip)]

    def tag(box: str, kind: str, text: str, tip: str) -> None:
        node_tags.setdefault(box, {}).setdefault(kind, []).append((text, tip))

    devices = anatomy.call_devices(call)
    stale, inplace = _flagged(call)
    reduced = all_reduce_tips(call)
    # Failures and in-place ops show on the box that holds them, folded or not (kept lists, so
    # a fold does not walk the call); the other tags only on nodes drawn as their own boxes.
    for n in _in_order(call, stale, inplace):
        box = members.get(n.id)
        if box is None or box not in nodes:
            continue
        if n.stale is not None:
            tag(box, "stale", "\u26a0 stale: " + anatomy.stale_tag(n), anatomy.stale_tip(call, n))
        if n.inplace:
            tag(box, "inplace", f"\u270e in-place {n.inplace}", anatomy.inplace_tip(call, n, stale))
    for node_id, text, tip in nonfinite_marks(call):
        box = members.get(node_id)
        if box is not None and box in nodes:
            tag(box, "nonfinite", text, tip)
    for n in open_nodes(call, layout):
        box = n.id
        if box not in nodes:
            continue
        base = anatomy.view_base(call, n.tensor) if sharing else None
        if base is not None:
            tag(box, "view", f"view of {anatomy.tensor_name(call, base)}", anatomy.view_tip(call, n.tensor, base))
        device = anatomy.node_device(call, n) if len(devices) > 1 else None
        if device:
            tip = f"Output on {device}. This call uses {len(devices)} devices: {', '.join(devices)}."
            tag(box, "device", device, tip)
        if n.id in reduced:
            tag(box, "allreduce", reduced[n.id][0], reduced[n.id][1])
    for box, kinds in node_tags.items():
        row = []
        for kind in NODE_TAG_ORDER:
            found = kinds.get(kind)
            if not found:
                continue
            if kind in UNFOLDED_KINDS:
                row += [_add(scene, out, TagItem(kind, text, tip, theme, box), show) for text, tip in found]
                continue
            text, tip = found[0]
            if len(found) > 1:
                text += f" +{len(found) - 1}"
                tip = "\n\n".join(t for _, t in found)
            row.append(_add(scene, out, TagItem(kind, text, tip, theme, box), show))
        b = layout.nodes[box]
        w = sum(item.size()[0] for item in row) + TAG_GAP * (len(row) - 1)
        h = max(item.size()[1] for item in row)
        x, y = out.placer.spot(w, h, _tag_spots(b, w, h, layout.direction), own=QRectF(b.x, b.y, b.w, b.h))
        for item in row:
            item.setPos(x, y + (h - item.size()[1]) / 2)
            x += item.size()[0] + TAG_GAP
    _failed_op(scene, out, call, layout, nodes, theme, show)
    _saved_marks(scene, out, call, saved, theme, sharing, show)
    _device_edges(scene, out, call, members, edges, theme, show, layout.direction)
    if sharing:
        _links(scene, out, call, layout, saved_at, theme, show)
    return out


def _tag_spots(b, w: float, h: float, direction: str) -> list[tuple[float, float]]:
    """Top-left corners for a node's row of tags, best first: hanging from its border on the side
    edges do not use (top to bottom and forward, edges meet a node's top and bottom: right of
    where they leave the bottom first; left to right, they meet its sides: the bottom), then the
    other places around the node. The placer takes the first that covers no edge or arrowhead."""
    cx, cy = b.x + b.w / 2, b.y + b.h / 2
    below, above = b.y + b.h - 5, b.y - h + 5  # overlapping the border by 5 px
    if direction == "LR":
        return [(b.x + 8, below), (b.x + b.w - 8 - w, below), (cx - w / 2, below), (b.x + 8, above),
                (b.x + b.w - 8 - w, above), (cx - w / 2, b.y + b.h + 4), (cx - w / 2, b.y - h - 4)]
    return [(cx + 8, below), (cx - 8 - w, below), (b.x + b.w + 4, cy - h / 2), (b.x - w - 4, cy - h / 2),
            (cx + 8, above), (cx - 8 - w, above), (b.x + b.w + 4, b.y + b.h + 4), (b.x - w - 4, b.y + b.h + 4)]


def _add(scene: QGraphicsScene, out: MarkItems, item, show: bool):
    item.setVisible(show)
    scene.addItem(item)
    kept = out.tags if isinstance(item, TagItem) else out.failed if isinstance(item, FailLinkItem) else out.links
    kept.append(item)
    return item


FAIL_GAP = 30.0  # between a failed op's mark and the boxes of its inputs: room for the lines


def _failed_op(scene, out: MarkItems, call: CallInfo, layout: Layout, nodes: dict[str, NodeItem], theme,
               show: bool) -> None:
    """The op the script's forward pass failed in, drawn where it would have joined the graph: a
    red mark on the consumer's side of its inputs' boxes (above them top down, left of them left to
    right, below them in forward order), joined to each by a dashed line."""
    op = failed_op(call)
    if op is None:
        return
    boxes = []
    for entry in op["inputs"]:
        box = layout.members.get(entry["node"]) if entry["node"] is not None else None
        if box is not None and box in nodes and box not in boxes:
            boxes.append(box)
    tip = mark_tip(op)
    tag = _add(scene, out, TagItem("failed", mark_text(op), tip, theme, ("failed", tuple(boxes))), show)
    w, h = tag.size()
    rects = [layout.nodes[b] for b in boxes]
    if not rects:  # no input has a graph: the mark stands over the graph built so far
        rects = [layout.nodes[r] for r in (layout.members.get(n) for n in call.roots) if r in layout.nodes][:1]
    if not rects:
        return
    left, right = min(b.x for b in rects), max(b.x + b.w for b in rects)
    top, bottom = min(b.y for b in rects), max(b.y + b.h for b in rects)
    cx, cy = (left + right) / 2, (top + bottom) / 2
    if layout.direction == "LR":
        spots = [(left - FAIL_GAP - w, cy - h / 2), (left - FAIL_GAP - w, top - FAIL_GAP - h),
                 (left - FAIL_GAP - w, bottom + FAIL_GAP)]
    else:
        y = bottom + FAIL_GAP if layout.direction == "forward" else top - FAIL_GAP - h
        far = bottom + 2 * FAIL_GAP + h if layout.direction == "forward" else top - 2 * FAIL_GAP - 2 * h
        # above (below in forward order) the inputs, then beside them, then further out
        spots = [(cx - w / 2, y), (left, y), (right - w, y), (right + FAIL_GAP, cy - h / 2),
                 (left - FAIL_GAP - w, cy - h / 2), (cx - w / 2, far)]
    x, y = out.placer.spot(w, h, spots)
    tag.setPos(x, y)
    if not boxes:
        return
    mark = QRectF(x, y, w, h)
    lines = []
    for b in rects:
        if layout.direction == "LR" or mark.right() <= b.x:
            lines.append((QPointF(mark.right(), mark.center().y()), QPointF(b.x, b.y + b.h / 2)))
        elif mark.left() >= b.x + b.w:
            lines.append((QPointF(mark.left(), mark.center().y()), QPointF(b.x + b.w, b.y + b.h / 2)))
        elif mark.bottom() <= b.y:
            lines.append((QPointF(min(max(b.x + b.w / 2, mark.left() + h), mark.right() - h), mark.bottom()),
                          QPointF(b.x + b.w / 2, b.y)))
        else:
            lines.append((QPointF(min(max(b.x + b.w / 2, mark.left() + h), mark.right() - h), mark.top()),
                          QPointF(b.x + b.w / 2, b.y + b.h)))
    _add(scene, out, FailLinkItem(lines, tip, theme, tuple(boxes)), show)


def _saved_marks(scene, out: MarkItems, call: CallInfo, saved: list[SavedItem], theme, sharing, show) -> None:
    """A stale saved box gets a warning sign; with sharing on, a saved view names its base."""
    for s in saved:
        box, node = s.saved, call.node(s.saved.node)
        marks = []
        if box.state == "stale" and node.stale is not None and node.stale.saved == box.name:
            tip = anatomy.stale_tip(call, node)
            s.setToolTip(f"saved for backward: {box.name}\n{tip}")
            marks.append(("stale", "\u26a0", tip))
        base = anatomy.view_base(call, box.tensor) if sharing else None
        if base is not None:
            tip = anatomy.view_tip(call, box.tensor, base, box.name)
            marks.append(("view", f"view of {anatomy.tensor_name(call, base)}", tip))
        if not marks:
            continue
        row = [_add(scene, out, TagItem(kind, text, tip, theme, ("saved", box.node, box.name)), show)
               for kind, text, tip in marks]
        w = sum(item.size()[0] for item in row) + TAG_GAP * (len(row) - 1)
        h = max(item.size()[1] for item in row)
        right, top, bottom = box.x + box.w - w, box.y - h - 2, box.y + box.h + 2
        # beside the box, then over or under it; a box squeezed between nodes (a saved box sits in
        # its node's row) has its tag further up or down, clear of their boxes and names
        mid = box.x + (box.w - w) / 2
        x, y = out.placer.spot(w, h, [(box.x + box.w + 4, box.y + (box.h - h) / 2), (right, top), (right, bottom),
                                      (box.x, top), (box.x, bottom), (box.x - w - 4, box.y + (box.h - h) / 2),
                                      *((x, y) for d in (10.0, 22.0, 34.0) for x in (mid, right, box.x)
                                        for y in (top - d, bottom + d))])
        for item in row:
            item.setPos(x, y + (h - item.size()[1]) / 2)
            x += item.size()[0] + TAG_GAP


def _device_edges(scene, out: MarkItems, call: CallInfo, members, edges: list[EdgeItem], theme, show,
                  direction: str = "TB") -> None:
    """Bold edges with a "cpu → cuda:0" label where the gradient crosses devices."""
    by_key: dict[tuple[str, str], list[EdgeItem]] = {}
    for e in edges:
        by_key.setdefault(e.key, []).append(e)
    texts: dict[int, tuple[EdgeItem, dict[str, str]]] = {}
    for change in anatomy.device_changes(call):
        u, v = members.get(change.src), members.get(change.dst)
        found = by_key.get((u, v)) if u != v else None
        if not found:
            continue
        edge = next((e for e in found if e.edge.slot == change.slot and u == change.src), found[0])
        texts.setdefault(id(edge), (edge, {}))[1].setdefault(change.text, anatomy.device_change_tip(call, change))
    for edge, found in texts.values():
        edge.set_accent("device")
        out.accented.append(edge)
        tag = TagItem("device_edge", " / ".join(found), "\n\n".join(found.values()), theme, edge.key)
        w, h = _add(scene, out, tag, show).size()
        placer = out.placer
        path = edge_path(edge.edge.points, placer.curved, placer.horizontal)
        tag.setPos(*placer.spot(w, h, beside(path, w, h, direction == "LR")))


def _links(scene, out: MarkItems, call: CallInfo, layout: Layout, saved_at, theme, show) -> None:
    """Join the items holding each shared storage with the fewest, shortest dashed lines."""
    members = layout.members
    with_saved = {node for node, _ in saved_at}
    found = []
    for storage, holders in anatomy.storage_holders(call).items():
        own_saved = {h.node for h in holders if h.saved is not None and (h.node, h.saved) in saved_at}
        ends: dict = {}  # item key -> LinkEnd
        for h in holders:
            if h.saved is not None and (h.node, h.saved) in saved_at:
                b = saved_at[(h.node, h.saved)].saved
                ends.setdefault(("saved", h.node, h.saved), LinkEnd((b.x, b.y, b.x + b.w, b.y + b.h), saved=True))
            elif h.saved is None and h.node in own_saved:
                continue  # the node's own saved box stands for its output
            else:
                b = layout.nodes.get(members.get(h.node, ""))
                if b is not None:
                    ends.setdefault(b.id, LinkEnd((b.x, b.y, b.x + b.w, b.y + b.h), right_free=b.id not in with_saved))
        if len(ends) >= 2:
            found.append((storage, holders, ends))
    obstacles = None
    if sum(len(ends) - 1 for _, _, ends in found) <= CAREFUL_LINKS:
        boxes = [(b.x, b.y, b.x + b.w, b.y + b.h) for b in (*layout.nodes.values(), *layout.saved)]
        obstacles = Obstacles([*boxes, *(rect_tuple(t.sceneBoundingRect()) for t in out.tags)])
    infos = {s.id: s for s in call.storages}
    for storage, holders, ends in found:
        tip = anatomy.storage_tip(call, storage, holders, infos.get(storage))
        keys = list(ends)
        centres = [((e.rect[0] + e.rect[2]) / 2, (e.rect[1] + e.rect[3]) / 2) for e in ends.values()]
        size = tag_size(storage, theme, False)
        for i, j in spanning_pairs(centres):
            a, b = ends[keys[i]], ends[keys[j]]
            kind, points = link_route(a, b, obstacles)
            mid = label_spot(kind, points, size, (a.rect, b.rect), obstacles)
            link = ShareLinkItem(storage, (keys[i], keys[j]), route_path(kind, points), mid, tip, theme)
            link.careful = obstacles is not None
            _add(scene, out, link, show)


class MarksMixin:
    """GraphView's marks: rebuilt with each scene, and on their own when sharing is switched."""

    def _init_marks(self) -> None:
        self.marks = MarkItems()  # in-place, stale, device and storage-sharing marks
        self._show_sharing = False
        self._base_rect = QRectF()  # the scene rect without the marks

    def _forget_marks(self) -> None:
        """The scene was cleared, and the marks' items with it (and the items Colour by Gradient
        Norm had tinted: ``widgets.graph.norm_colours``)."""
        self.marks = MarkItems()
        self.norm_colouring = None
        self.overlays.scale.set_norms(None)

    def set_show_sharing(self, show: bool) -> None:
        """Link tensors that share a storage with dashed lines and tag views with their base."""
        if show == self._show_sharing:
            return
        self._show_sharing = show
        if self.state.layout is not None and not self.state.pending:  # a pending layout builds its own marks
            self._add_marks()
            self._legend_entries({v: i.style for v, i in self.node_items.items()})
            self.minimap.set_overview(self.overview, self.scene().sceneRect(), self._theme)
            self._update_minimap()

    def show_sharing(self) -> bool:
        return self._show_sharing

    def redraw_marks(self) -> None:
        """Rebuild the marks after a toggle they draw from (``state.show_values``, ``state.show_slots``)
        changed; a pending layout builds its own."""
        if self.state.layout is not None and not self.state.pending:
            self._add_marks()

    def _add_marks(self, base: QRectF | None = None) -> None:
        """(Re)build the marks; the scene rect grows to hold them (``base``: the rect without them)."""
        scene = self.scene()
        if base is not None:
            self._base_rect = QRectF(base)
        self.marks.remove(scene)
        items = (self.node_items, self.saved_items, self.edge_items)
        self.marks = build_marks(
            scene, self.state.call, self.state.layout, *items, self._theme, sharing=self._show_sharing, show=self.state.detail
        )
        self.marks.tags.extend(teaching_items(self.state.call, self.state.layout, self._theme, scene=scene, show=self.state.detail,
                                              values=self.state.show_values, leaf_lines=self.state.leaf_lines,
                                              slots=self.state.show_slots, placer=self.marks.placer,
                                              step_grads=self.step_grads()))
        rect = self.marks.bounds()
        for edge in self.edge_items:  # a label placed beside an edge on the graph's side
            if edge.label_size()[0]:
                rect = rect.united(edge.label_rect())
        scene.setSceneRect(self._base_rect.united(rect.adjusted(-6, -6, 6, 6)) if rect.isValid() else self._base_rect)
        self._colour_norms()  # the edges' tooltips were just written anew (``label_edges``)

    def _scene_items(self) -> list[QGraphicsItem]:
        """The per-box items: hidden in the zoomed-out overview, restyled by a theme change."""
        groups, nodes = self.group_items.values(), self.node_items.values()
        return [*groups, *self.edge_items, *nodes, *self.saved_items, *self.marks.items()]
