"""Teaching marks on the graph: cut stubs for None inputs, and values (the Values toggle).

A None entry of ``next_functions`` is drawn as a faint dashed stub below its node, labelled
with its cause (detached, made under no_grad, a Python number, requires_grad=False) and the
script's name. With values on, each leaf shows its data and ``.grad`` after the call, and each
root the seed gradient backward starts from. The items join the graph's marks, so they are
rebuilt, themed and exported with them.
"""

from __future__ import annotations

import math

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QPainter, QPen
from PySide6.QtWidgets import QGraphicsItem, QStyleOptionGraphicsItem

from core.layout.visible import open_nodes
from core.model.causes import cut_text, hook_lines, hook_tips, node_notes
from core.model.edge_marks import edge_mark_tip, mark_text
from core.model.grad_notes import node_notes as grad_notes
from core.model.grad_notes import note_tip
from core.model.step_state import leaf_lines_after
from core.model.values import edge_grad_text, seed_text
from widgets.graph.edge_labels import note_grew, place_edge_labels
from widgets.graph.items import EdgeItem
from widgets.graph.labels import sample_path
from widgets.graph.painting import MIN_TEXT_PX, color, font, text_width
from widgets.theme import Theme

STUB_LEN = 22.0
NOTE_Z = 1.8
CUT_Z = -0.2
LEAF_TIP = ("the leaf's data, and its .grad after this call: the sum of the gradients on its incoming edges "
            "(plus what earlier calls left there); while the call is stepped, its .grad at this step")


WRAP_CHARS = 52  # characters of a note's line before it goes on over the next


def wrap_values(line: str, width: int = WRAP_CHARS) -> list[str]:
    """``line`` in pieces of at most ``width`` characters, broken after ", " (the values of a list;
    between a tensor's rows where it can), the pieces after the first indented; a line with nowhere
    to break stays whole."""
    if len(line) <= width:
        return [line]
    out, rest = [], line
    while len(rest) > width:
        at = rest.rfind("], ", 0, width) + 1 or rest.rfind(", ", 0, width)  # between rows, if it can
        if at <= 2:
            break
        out.append(rest[: at + 1])
        rest = "    " + rest[at + 2:]
    return out + [rest]


class NoteItem(QGraphicsItem):
    """Small text, optionally hung from a dashed stub: ``kind`` is 'cut' or 'value'."""

    def __init__(self, kind: str, lines: list[str], tip: str, theme: Theme, target: str, stub: bool,
                 right: bool = False, up: bool = False):
        super().__init__()
        self.right = right  # a stub's text sits right of it (else left)
        self.up = up  # a stub rises from the node's top (else hangs from its bottom)
        self.kind = kind
        self.lines = lines
        self.target = target
        self.theme = theme
        self.stub = stub
        self.leaf = False  # a leaf's value chip (its lines follow stepping: ``set_lines``)
        self.grad_note = False  # a retained grad or autograd.grad result on its node (so do they)
        self._measure()
        self.setToolTip(tip)
        # Cut labels sit under edges and their gradient texts (which matter more), above module frames.
        self.setZValue(CUT_Z if kind == "cut" else NOTE_Z)

    def set_lines(self, lines: list[str]) -> None:
        """New text, at the same place (its size follows the text)."""
        if lines == self.lines:
            return
        self.prepareGeometryChange()
        self.lines = list(lines)
        self._measure()
        self.update()
        if self.scene() is not None:
            note_grew(self.scene(), self.text_rect())

    def shown_lines(self) -> list[str]:
        """The lines as drawn: one longer than ``WRAP_CHARS`` (a leaf's twelve values) goes on over
        the next lines, broken after a comma, so that a chip grows down rather than across."""
        return [piece for line in self.lines for piece in wrap_values(line)]

    def _measure(self) -> None:
        lines, theme, stub, right, up = self.shown_lines(), self.theme, self.stub, self.right, self.up
        px = theme.small_font_px
        text_w = max(text_width(line, theme.font_family, px, False) for line in lines) + 8
        text_h = len(lines) * (px + 3) + 4
        self._top = STUB_LEN if stub else 0.0
        if stub:  # the text sits beside the stub's end, close to the node, clear of mid-edge labels
            self._w = text_w + 14
            self._h = STUB_LEN - 3 + text_h / 2
            self._text = QRectF(14 if right else 0, 0 if up else STUB_LEN - 3 - text_h / 2, text_w, text_h)
        else:
            self._w, self._h = text_w, text_h
            self._text = QRectF(0, 0, text_w, text_h)

    def size(self) -> tuple[float, float]:
        return self._w, self._h

    def stub_x(self) -> float:
        """Where the stub runs, from the item's left."""
        return 6.0 if self.right else self._w - 6

    def text_rect(self) -> QRectF:
        """The text's rectangle in scene coordinates."""
        return self._text.translated(self.pos())

    def label_obstacle(self) -> QRectF:
        """What edge labels keep off: the text (see ``widgets.graph.edge_labels``)."""
        return self.text_rect()

    def boundingRect(self) -> QRectF:
        return QRectF(-2, -1, self._w + 4, self._h + 2)

    def paint(self, p: QPainter, option: QStyleOptionGraphicsItem, widget=None) -> None:
        t = self.theme
        p.setRenderHint(QPainter.Antialiasing, True)
        ink = color(t.muted_text if self.kind in ("cut", "slot") else t.edge_text if self.kind == "grad" else t.text)
        if self.stub:  # a dashed edge from the node's border that ends in a bar: the cut
            x = self.stub_x()
            y0, y1 = (self._h, self._h - self._top + 3) if self.up else (0, self._top - 3)
            p.setPen(QPen(ink, 1.1, Qt.DashLine))
            p.drawLine(int(x), int(y0), int(x), int(y1))
            p.setPen(QPen(ink, 1.6))
            p.drawLine(int(x) - 5, int(y1), int(x) + 5, int(y1))
        lod = option.levelOfDetailFromTransform(p.worldTransform())
        rect = self._text
        if self.kind in ("cut", "slot", "grad"):  # text over edges stays readable
            p.fillRect(rect, color(t.background))
        if self.kind == "hook":
            p.setPen(QPen(color(t.retained), 1.0))
            p.setBrush(color(t.background))
            p.drawRoundedRect(rect, 3, 3)
            ink = color(t.retained)
        if self.kind == "mark":
            ink = color(t.device)
            p.setPen(QPen(ink, 0.8))
            p.setBrush(color(t.background))
            p.drawRoundedRect(rect, rect.height() / 2, rect.height() / 2)
        if self.kind == "value":
            p.setPen(QPen(color(t.edge), 0.8))
            p.setBrush(color(t.background))
            p.drawRoundedRect(rect, 3, 3)
        if lod * t.small_font_px < MIN_TEXT_PX:
            return
        p.setFont(font(t.font_family, t.small_font_px, False))
        p.setPen(ink)
        step = t.small_font_px + 3
        for i, line in enumerate(self.shown_lines()):
            p.drawText(QRectF(rect.x() + 4, rect.y() + 2 + i * step, rect.width(), step),
                       Qt.AlignLeft | Qt.AlignVCenter, line)

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.update()


class Placer:
    """Puts each note at the first candidate spot that covers no node box and no earlier note
    (and, when asked, no edge line, arrowhead or mid-edge text); when none is clear, at the spot
    that covers least."""

    def __init__(self, layout):
        self.taken: dict[tuple[int, int], list[QRectF]] = {}  # boxes and placed notes, by grid cell
        for b in layout.nodes.values():
            self._take(QRectF(b.x, b.y, b.w, b.h))
        for g in layout.groups:  # module frame titles (their strip along the frame's top)
            if not g.collapsed:
                self._take(QRectF(g.x + 10, g.y + 4, max(g.w - 20, 0.0), 14))
        # where edges write their shape or gradient: around the middle of each edge
        self.texts: dict[tuple[int, int], list[QRectF]] = {}
        for x, y in (_middle(e.points) for e in layout.edges):
            t = QRectF(x - 24, y - 9, 48, 18)
            for cell in _cells(t):
                self.texts.setdefault(cell, []).append(t)
        curved, horizontal = layout.engine != "dot", layout.direction == "LR"
        # the drawn lines piece by piece (a straight run, or one S-curve across a gap, which stays
        # inside its end points' box), found through a coarse grid
        self.grid: dict[tuple[int, int], list[tuple]] = {}
        for e in layout.edges:
            for (x0, y0), (x1, y1), bent in _pieces(e.points, curved, horizontal):
                piece = (QRectF(min(x0, x1) - 1, min(y0, y1) - 1, abs(x1 - x0) + 2, abs(y1 - y0) + 2),
                         (x0, y0, x1, y1, horizontal) if bent else None)
                for cell in _cells(piece[0]):
                    self.grid.setdefault(cell, []).append(piece)
        self.curved, self.horizontal = curved, horizontal
        self.heads: dict[tuple[int, int], list[QRectF]] = {}
        for e in layout.edges:
            head = _head(e.points, curved, horizontal)
            for cell in _cells(head):
                self.heads.setdefault(cell, []).append(head)

    def _take(self, r: QRectF) -> None:
        for cell in _cells(r):
            self.taken.setdefault(cell, []).append(r)

    def crosses_edge(self, r: QRectF) -> bool:
        """Whether ``r`` covers a piece of an edge's drawn line."""
        return any(box.intersects(r) and (bend is None or _curve_crosses(bend, r))
                   for cell in _cells(r) for box, bend in self.grid.get(cell, ()))

    def clashes(self, r: QRectF, text: QRectF, avoid_texts: bool, avoid_edges: bool, own: QRectF | None = None) -> int:
        hit = {id(t): t for cell in _cells(r) for t in self.taken.get(cell, ()) if t != own and r.intersects(t)}
        n = 4 * len(hit)
        n += 3 * any(h.intersects(text) for cell in _cells(text) for h in self.heads.get(cell, ()))
        if avoid_texts:
            n += len({id(t) for cell in _cells(r) for t in self.texts.get(cell, ()) if r.intersects(t)})
        if avoid_edges:
            n += 2 * self.crosses_edge(text)
        return n

    def place(self, item: NoteItem, spots: list[tuple[float, float]], avoid_texts: bool = False,
              avoid_edges: bool = False) -> None:
        w, h = item.size()
        best = None
        for x, y in spots:
            n = self.clashes(QRectF(x, y, w, h), item._text.translated(x, y), avoid_texts, avoid_edges)
            if best is None or n < best[0]:
                best = (n, x, y)
            if n == 0:
                break
        _, x, y = best
        item.setPos(x, y)
        self._take(QRectF(x, y, w, h))

    def spot(self, w: float, h: float, spots: list[tuple[float, float]],
             own: QRectF | None = None) -> tuple[float, float]:
        """The first of ``spots`` (top-left corners) where a w x h mark covers no box, note, edge
        line or arrowhead (``own``: the box it may overlap, the node it hangs from), else the one
        that covers least; the spot is then taken."""
        best = None
        for x, y in spots:
            r = QRectF(x, y, w, h)
            n = self.clashes(r, r, False, True, own)
            if best is None or n < best[0]:
                best = (n, x, y)
            if n == 0:
                break
        _, x, y = best
        self._take(QRectF(x, y, w, h))
        return x, y


GRID = 256.0


def _cells(r: QRectF):
    for i in range(int(r.left() // GRID), int(r.right() // GRID) + 1):
        for j in range(int(r.top() // GRID), int(r.bottom() // GRID) + 1):
            yield i, j


def _pieces(points, curved: bool, horizontal: bool):
    """An edge's points as (start, end, bent) pieces, runs of straight pieces in one line joined."""
    k = 0 if horizontal else 1  # the coordinate a straight run advances along
    start = points[0]
    for i in range(1, len(points)):
        a, b = points[i - 1], points[i]
        bent = curved and abs(b[1 - k] - a[1 - k]) >= 0.5
        if bent or not curved:
            if a != start:
                yield start, a, False
            yield a, b, bent
            start = b
    if start != points[-1]:
        yield start, points[-1], False


def _curve_crosses(bend, r: QRectF, steps: int = 16) -> bool:
    """Whether the S-curve ``edge_path`` draws between two points crosses ``r`` (sampled)."""
    x0, y0, x1, y1, horizontal = bend
    line = sample_path([(x0, y0), (x1, y1)], True, horizontal, steps)
    return any(QRectF(QPointF(*a), QPointF(*b)).normalized().adjusted(-1, -1, 1, 1).intersects(r)
               for a, b in zip(line, line[1:]))


def _head(points, curved: bool, horizontal: bool) -> QRectF:
    """The rectangle around an edge's arrowhead (at its last point)."""
    (xa, ya), (xb, yb) = points[-2], points[-1]
    if not curved:
        dx, dy = xb - xa, yb - ya
        k = (dx * dx + dy * dy) ** 0.5 or 1.0
        dx, dy = dx / k, dy / k
    elif horizontal:
        dx, dy = (1.0 if xb >= xa else -1.0), 0.0
    else:
        dx, dy = 0.0, (1.0 if yb >= ya else -1.0)
    a = EdgeItem.ARROW
    xs = [xb, xb - dx * a - dy * a / 2, xb - dx * a + dy * a / 2]
    ys = [yb, yb - dy * a + dx * a / 2, yb - dy * a - dx * a / 2]
    return QRectF(min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)).adjusted(-1, -1, 1, 1)


def beside(path, w: float, h: float, horizontal_first: bool) -> list[tuple[float, float]]:
    """Top-left corners that put a w x h text beside a drawn edge: level with a point on it, left
    or right of it (above or below it for a left-to-right layout, ``horizontal_first``). The
    side the edge bends to comes first (straight: left, or above), all along the edge from its
    middle out, then the other side, then both a little further out. Offsets run along the axis
    the layers are spread on, so a text never slides into the next layer's row of boxes the way
    an offset at right angles to a slanting curve does."""
    out = []
    (sx, sy), (ex, ey) = _xy(path.pointAtPercent(0.0)), _xy(path.pointAtPercent(1.0))
    lean = (ey - sy) if horizontal_first else (ex - sx)
    sides = (1, -1) if lean > 1 else (-1, 1)  # outside a bent edge first: away from its siblings
    for extra in (0.0, 10.0):
        for side in sides:  # one whole side along the edge, then the other
            for t in (0.5, 0.38, 0.62, 0.25, 0.75):
                mx, my = _xy(path.pointAtPercent(t))
                (x0, y0) = _xy(path.pointAtPercent(max(0.0, t - 0.05)))
                (x1, y1) = _xy(path.pointAtPercent(min(1.0, t + 0.05)))
                if horizontal_first:  # the label above or below the line, clear of its slope
                    rise = abs(y1 - y0) / max(abs(x1 - x0), 1e-6) * w / 2
                    off = h / 2 + 4 + min(rise, 3 * h) + extra
                    out.append((mx - w / 2, my + side * off - h / 2))
                else:  # left or right of the line
                    run = abs(x1 - x0) / max(abs(y1 - y0), 1e-6) * h / 2
                    off = w / 2 + 4 + min(run, w) + extra
                    out.append((mx + side * off - w / 2, my - h / 2))
    return out


def _xy(pt) -> tuple[float, float]:
    return pt.x(), pt.y()


def _cut_spots(item: NoteItem, box, k: int, direction: str, up: bool) -> list[tuple[float, float]]:
    """Where a cut stub may hang: from the node's bottom, or its top when ``up`` (the forward
    direction, or a crowded column left to right). Top to bottom, the stub leaves near the end
    its text runs off to; left to right, near the other end, so the text stays under (or over)
    the node, clear of the edges leaving its sides."""
    w, h = item.size()
    sx = item.stub_x()
    if up:
        ys = [box.y - h - k * 12, box.y - h - (k + 1) * 12 - 6]
    else:
        ys = [box.y + box.h + k * 12, box.y + box.h + (k + 1) * 12 + 6]
    near_right = item.right != (direction == "LR")
    ax = box.x + box.w - 12 - 10 * k if near_right else box.x + 12 + 10 * k
    return [(ax - sx, y) for y in ys]


def teaching_items(call, layout, theme: Theme, *, values: bool, show: bool, scene, slots: bool = False,
                   placer: Placer | None = None, leaf_lines: dict | None = None,
                   step_grads: dict | None = None) -> list[NoteItem]:
    """Cut stubs for every drawn node with None inputs; leaf values and seeds when ``values``.
    ``placer``: the one that placed the scene's other marks, so that notes keep off them;
    ``leaf_lines``: a leaf chip's lines by node id, while its call is stepped (else the call's own);
    ``step_grads``: the ``leaf_grads`` of the step shown while it is stepped, so that a retained
    grad reads as it is at that step (else as after the call)."""
    out: list[NoteItem] = []
    noted = grad_notes(call, step_grads) if values else {}
    members = layout.members
    placer = placer or Placer(layout)
    shown = open_nodes(call, layout)
    for n in shown:
        box = layout.nodes.get(members.get(n.id, ""))
        if box is None or box.id != n.id:
            continue
        if n.cuts:
            xs = [x for e in layout.edges if n.id in (e.src, e.dst) for x, _ in e.points]
            lean = sum(xs) / len(xs) - (box.x + box.w / 2) if xs else 0.0
            order = (True, False) if layout.direction == "LR" or lean < -1 else (False, True)
            for k, cut in enumerate(n.cuts):
                text = "✂ " + cut_text(cut, short=True)
                best = None
                # the side away from the node's edges first, then the other; left to right, under
                # the node, then over it (its column holds other nodes above and below)
                ups = {"forward": (True,), "LR": (False, True)}.get(layout.direction, (False,))
                for up, right in ((u, r) for u in ups for r in order):
                    item = NoteItem("cut", [text], f"input {cut['input']} is None: {cut_text(cut)}", theme, n.id,
                                    True, right=right, up=up)
                    w, h = item.size()
                    for x, y in _cut_spots(item, box, k, layout.direction, up):
                        c = placer.clashes(QRectF(x, y, w, h), item._text.translated(x, y), True, True)
                        if best is None or c < best[0]:
                            best = (c, item, x, y)
                    if best[0] == 0:
                        break
                _, item, x, y = best
                placer.place(item, [(x, y)])
                out.append(item)
        hooks = hook_lines(call, n) + node_notes(call, n)
        if hooks:
            item = NoteItem("hook", hooks, "\n".join(hook_tips(call, n)), theme, n.id, False)
            w, h = item.size()
            cx = box.x + box.w / 2 - w / 2
            placer.place(item, [(box.x + box.w - 10, box.y - h + 4), (box.x + box.w + 4, box.y),
                                (box.x - w - 4, box.y), (box.x - w + 10, box.y - h + 4),
                                (box.x + box.w - 10, box.y + box.h - 4), (cx, box.y - h - 4),
                                (cx, box.y + box.h + 4), (box.x + box.w + 4, box.y - h - 4),
                                (box.x - w - 4, box.y + box.h + 4)], avoid_edges=True)
            out.append(item)
        notes = noted.get(n.id)
        if notes:  # a retained grad ("hidden.grad = 3"), what autograd.grad returned for an input
            item = NoteItem("value", notes, note_tip(call, n.id), theme, n.id, False)
            item.grad_note = True
            w, h = item.size()
            cy = box.y + box.h / 2 - h / 2
            placer.place(item, [(box.x - w - 4, cy), (box.x + box.w + 4, cy),
                                (box.x + box.w / 2 - w / 2, box.y - h - 4),
                                (box.x + box.w / 2 - w / 2, box.y + box.h + 4),
                                (box.x - w - 4, box.y - h - 4), (box.x + box.w + 4, box.y + box.h + 4)],
                         avoid_edges=True)
            out.append(item)
        if values and n.kind == "accumulate_grad" and n.variable:
            lines = (leaf_lines or {}).get(n.id) or leaf_lines_after(call, n)
            if lines:
                item = NoteItem("value", lines, LEAF_TIP, theme, n.id, False)
                item.leaf = True
                w, h = item.size()
                cy = box.y + box.h / 2 - h / 2
                placer.place(item, [(box.x + box.w + 4, cy), (box.x - w - 4, cy),
                                    (box.x + box.w / 2 - w / 2, box.y + box.h + 4),
                                    (box.x + box.w + 4, box.y + box.h + 4), (box.x - w - 4, box.y + box.h + 4),
                                    (box.x + box.w / 2 - w / 2, box.y - h - 4),
                                    (box.x + box.w + 4, box.y - h - 4), (box.x - w - 4, box.y - h - 4)],
                             avoid_edges=True)
                out.append(item)
    if slots:
        for e in layout.edges:
            n, dst = call.node(e.src), call.node(e.dst)
            if n is None or dst is None or e.count > 1:
                continue
            item = NoteItem("slot", [f"next[{e.slot}] = ({dst.name}, {e.input_nr})"],
                            f"{n.name}.next_functions[{e.slot}] is ({dst.name}, {e.input_nr}): the gradient for "
                            f"input {e.slot} goes to output {e.input_nr} of {dst.name}", theme, n.id, False)
            w, h = item.size()
            placer.place(item, _slot_spots(e.points, w, h, layout.direction), avoid_edges=True)
            out.append(item)
    if values and call.api != "unreached":  # the seed sits off the root's free side: away from its edges
        for rid in call.roots:
            box = layout.nodes.get(members.get(rid, ""))
            node = call.node(rid)
            if box is None or node is None:
                continue
            item = NoteItem("value", [seed_text(call, node)], "the gradient backward starts from", theme, rid, False)
            w, h = item.size()
            above, below = (box.x + box.w / 2 - w / 2, box.y - h - 4), (box.x + box.w / 2 - w / 2, box.y + box.h + 4)
            left = (box.x - w - 6, box.y + box.h / 2 - h / 2)
            right = (box.x + box.w + 6, box.y + box.h / 2 - h / 2)
            spots = {"forward": [below, above, right, left],
                     "LR": [left, above, below]}.get(layout.direction, [above, right, left, below])
            placer.place(item, spots, avoid_edges=True)
            out.append(item)
    for item in out:
        item.setVisible(show)
        scene.addItem(item)
    label_edges(call, layout, scene, shown, values)
    return out


def label_edges(call, layout, scene, shown, values: bool) -> None:
    """Broadcast and dtype marks (what the picture teaches) and, with ``values``, the gradient each
    edge carried go into the edge's own label, then every label is placed (after the notes, which
    they keep off). Edges leave only from nodes drawn as their own boxes."""
    items = [i for i in scene.items(Qt.AscendingOrder) if isinstance(i, EdgeItem)]
    by_slot = {(i.edge.src, i.edge.slot): i for i in items}
    marks: dict[int, list[str]] = {}
    grads: dict[int, str] = {}
    tips: dict[int, list[str]] = {}
    for n in shown:
        for mark in n.edge_marks or ():
            item = by_slot.get((n.id, mark["input"]))
            if item is not None:
                marks.setdefault(id(item), []).append(mark_text(mark))
                tips.setdefault(id(item), []).append(edge_mark_tip(mark))
        for slot, g in enumerate(call.edge_grads.get(n.id) or () if values else ()):
            item = by_slot.get((n.id, slot))
            if g is not None and item is not None:
                grads[id(item)] = edge_grad_text(g)
                src = call.node(n.next[slot].node) if n.next[slot] is not None else None
                tips.setdefault(id(item), []).append(
                    f"the gradient {n.name} sent to {src.name if src else 'this input'} in this call")
    for item in items:
        item.set_texts(mark=", ".join(marks.get(id(item), ())), grad=grads.get(id(item), ""))
        item.setToolTip("\n\n".join(tips.get(id(item), ())))
    place_edge_labels(scene, items)


def _slot_spots(points, w: float, h: float, direction: str) -> list[tuple[float, float]]:
    """Beside an edge where it leaves the node whose ``next`` entry it is: its first point, or
    its last in the forward direction (the points run from input to consumer there), off the
    arrowhead that ends it."""
    if direction == "forward":
        x, y = points[-1]
        y -= EdgeItem.ARROW + 2 + h
        return [(x + 4, y), (x - w - 4, y), (x + 4, y - h), (x - w - 4, y - h)]
    x, y = points[0]
    if direction == "LR":
        return [(x + 4, y - h - 2), (x + 4, y + 2), (x + 4, y - 2 * h - 2), (x + 4, y + h + 2)]
    return [(x + 4, y + 2), (x - w - 4, y + 2), (x + 4, y + h + 2), (x - w - 4, y + h + 2)]


def _middle(points) -> tuple[float, float]:
    """The point halfway along a polyline."""
    lengths = [math.dist(points[i - 1], points[i]) for i in range(1, len(points))]
    half = sum(lengths) / 2
    for i, seg in enumerate(lengths, 1):
        if half <= seg and seg > 0:
            (x0, y0), (x1, y1) = points[i - 1], points[i]
            t = half / seg
            return x0 + (x1 - x0) * t, y0 + (y1 - y0) * t
        half -= seg
    return points[-1]


def set_show_slots(view, show: bool) -> None:
    """Label each edge with its next_functions entry: ``next[i] = (MulBackward0, 0)``."""
    if view.state.show_slots == show:
        return
    view.state.show_slots = show
    view.redraw_marks()


def set_show_values(view, show: bool) -> None:
    """The Values toggle of a GraphView: leaf data and .grad, and root seeds, on the graph."""
    if view.state.show_values == show:
        return
    view.state.show_values = show
    view.redraw_marks()
