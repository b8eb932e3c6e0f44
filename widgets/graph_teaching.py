"""Teaching marks on the graph: cut stubs for None inputs, and values (the Values toggle).

A None entry of ``next_functions`` is drawn as a faint dashed stub below its node, labelled
with its cause (detached, made under no_grad, a Python number, requires_grad=False) and the
script's name. With values on, each leaf shows its data and ``.grad`` after the call, and each
root the seed gradient backward starts from. The items join the graph's marks, so they are
rebuilt, themed and exported with them.
"""

from __future__ import annotations

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QPainter, QPen
from PySide6.QtWidgets import QGraphicsItem, QStyleOptionGraphicsItem

from core.layout import open_nodes
from core.causes import cut_text, hook_lines, hook_tips, node_notes
from core.edge_marks_text import edge_mark_tip, mark_text
from core.value_text import edge_grad_text, leaf_value_lines, seed_text
from widgets.graph_items import MIN_TEXT_PX, color, font
from widgets.theme import Theme

STUB_LEN = 22.0
NOTE_Z = 1.8
CUT_Z = -0.2


class NoteItem(QGraphicsItem):
    """Small text, optionally hung from a dashed stub: ``kind`` is 'cut' or 'value'."""

    def __init__(self, kind: str, lines: list[str], tip: str, theme: Theme, target: str, stub: bool):
        super().__init__()
        self.kind = kind
        self.lines = lines
        self.target = target
        self.theme = theme
        self.stub = stub
        from widgets.graph_marks import _text_width

        px = theme.small_font_px
        text_w = max(_text_width(line, theme.font_family, px, False) for line in lines) + 8
        text_h = len(lines) * (px + 3) + 4
        self._top = STUB_LEN if stub else 0.0
        if stub:  # the text sits left of the stub's end, close to the node, clear of mid-edge labels
            self._w = text_w + 14
            self._text = QRectF(0, STUB_LEN - 3 - text_h / 2, text_w, text_h)
            self._h = STUB_LEN - 3 + text_h / 2
        else:
            self._w, self._h = text_w, text_h
            self._text = QRectF(0, 0, text_w, text_h)
        self.setToolTip(tip)
        # Cut labels sit under edges and their gradient texts (which matter more), above module frames.
        self.setZValue(CUT_Z if kind == "cut" else NOTE_Z)

    def size(self) -> tuple[float, float]:
        return self._w, self._h

    def boundingRect(self) -> QRectF:
        return QRectF(-2, -1, self._w + 4, self._h + 2)

    def paint(self, p: QPainter, option: QStyleOptionGraphicsItem, widget=None) -> None:
        t = self.theme
        p.setRenderHint(QPainter.Antialiasing, True)
        ink = color(t.muted_text if self.kind in ("cut", "slot") else t.edge_text if self.kind == "grad" else t.text)
        if self.stub:  # a dashed edge from the node's bottom that ends in a bar: the cut
            x = self._w - 6
            p.setPen(QPen(ink, 1.1, Qt.DashLine))
            p.drawLine(int(x), 0, int(x), int(self._top) - 3)
            p.setPen(QPen(ink, 1.6))
            p.drawLine(int(x) - 5, int(self._top) - 3, int(x) + 5, int(self._top) - 3)
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
        for i, line in enumerate(self.lines):
            p.drawText(QRectF(rect.x() + 4, rect.y() + 2 + i * step, rect.width(), step),
                       Qt.AlignLeft | Qt.AlignVCenter, line)

    def set_theme(self, theme: Theme) -> None:
        self.theme = theme
        self.update()


class _Placer:
    """Puts each note at the first candidate spot that covers no node box and no earlier note."""

    def __init__(self, layout):
        self.taken = [QRectF(b.x, b.y, b.w, b.h) for b in layout.nodes.values()]
        # where edges write their shape or gradient: around the middle of each edge
        self.texts = [QRectF(x - 24, y - 9, 48, 18) for x, y in (_middle(e.points) for e in layout.edges)]

    def place(self, item: NoteItem, spots: list[tuple[float, float]], avoid_texts: bool = False) -> None:
        w, h = item.size()
        for x, y in spots:
            r = QRectF(x, y, w, h)
            if not any(r.intersects(t) for t in self.taken) and not (
                    avoid_texts and any(r.intersects(t) for t in self.texts)):
                break
        else:
            x, y = spots[0]
        item.setPos(x, y)
        self.taken.append(QRectF(x, y, w, h))


def teaching_items(call, layout, theme: Theme, *, values: bool, show: bool, scene, slots: bool = False
                   ) -> list[NoteItem]:
    """Cut stubs for every drawn node with None inputs; leaf values and seeds when ``values``."""
    out: list[NoteItem] = []
    members = layout.members
    placer = _Placer(layout)
    shown = open_nodes(call, layout)
    for n in shown:
        box = layout.nodes.get(members.get(n.id, ""))
        if box is None or box.id != n.id:
            continue
        if n.cuts:
            y = box.y + box.h
            for k, cut in enumerate(n.cuts):
                text = "✂ " + cut_text(cut, short=True)
                item = NoteItem("cut", [text], f"input {cut['input']} is None: {cut_text(cut)}", theme, n.id, True)
                anchor = box.x + 12 + 10 * k  # the stub leaves the node's bottom left of the real edges
                w, h = item.size()
                placer.place(item, [(anchor - w + 6, y + k * 12), (anchor - w + 6, y + (k + 1) * 12 + 6),
                                    (anchor - w + 6, y + k * 12 - 8)], avoid_texts=True)
                out.append(item)
        hooks = hook_lines(call, n) + node_notes(call, n)
        if hooks:
            item = NoteItem("hook", hooks, "\n".join(hook_tips(call, n)), theme, n.id, False)
            w, h = item.size()
            placer.place(item, [(box.x + box.w - 10, box.y - h + 4), (box.x + box.w + 4, box.y),
                                (box.x - w - 4, box.y)])
            out.append(item)
        if values and n.kind == "accumulate_grad" and n.variable:
            lines = leaf_value_lines(call, n)
            if lines:
                item = NoteItem("value", lines, "the leaf's data, and its .grad after this call: the sum of "
                                "the gradients on its incoming edges (plus what earlier calls left there)",
                                theme, n.id, False)
                w, h = item.size()
                cy = box.y + box.h / 2 - h / 2
                placer.place(item, [(box.x + box.w + 4, cy), (box.x - w - 4, cy),
                                    (box.x + box.w / 2 - w / 2, box.y + box.h + 4),
                                    (box.x + box.w + 4, box.y + box.h + 4), (box.x - w - 4, box.y + box.h + 4)])
                out.append(item)
    edges = {(e.src, e.slot): e for e in layout.edges}
    if slots:
        for e in layout.edges:
            n, dst = call.node(e.src), call.node(e.dst)
            if n is None or dst is None or e.count > 1:
                continue
            item = NoteItem("slot", [f"next[{e.slot}] = ({dst.name}, {e.input_nr})"],
                            f"{n.name}.next_functions[{e.slot}] is ({dst.name}, {e.input_nr}): the gradient for "
                            f"input {e.slot} goes to output {e.input_nr} of {dst.name}", theme, n.id, False)
            (x0, y0), (x1, y1) = e.points[0], e.points[min(1, len(e.points) - 1)]
            w, h = item.size()
            placer.place(item, [(x0 + 4, y0 + 2), (x0 - w - 4, y0 + 2), (x0 + 4, y0 + h + 2), (x0 - w - 4, y0 + h + 2)])
            out.append(item)
    for n in shown:  # edges leave only from nodes drawn as their own boxes
        grads = call.edge_grads.get(n.id) if values else None
        for slot, g in enumerate(grads or ()):
            edge = edges.get((n.id, slot))
            if g is None or edge is None:
                continue
            src = call.node(n.next[slot].node) if n.next[slot] is not None else None
            item = NoteItem("grad", [edge_grad_text(g)], f"the gradient {n.name} sent to "
                            f"{src.name if src else 'this input'} in this call", theme, n.id, False)
            x, y = _middle(edge.points)
            w, h = item.size()
            placer.place(item, [(x - w - 4, y - h / 2), (x + 4, y - h / 2), (x - w - 4, y - h - 4), (x + 4, y + 4)])
            out.append(item)
        for mark in n.edge_marks or ():
            edge = edges.get((n.id, mark["input"]))
            if edge is None:
                continue
            tip = edge_mark_tip(mark)
            item = NoteItem("mark", [mark_text(mark)], tip, theme, n.id, False)
            x, y = _middle(edge.points)
            w, h = item.size()
            placer.place(item, [(x + 6, y - h / 2), (x - w - 6, y - h / 2), (x + 6, y + h), (x - w - 6, y + h)])
            out.append(item)
    if values and call.api != "unreached":
        for rid in call.roots:
            box = layout.nodes.get(members.get(rid, ""))
            node = call.node(rid)
            if box is None or node is None:
                continue
            item = NoteItem("value", [seed_text(call, node)], "the gradient backward starts from", theme, rid, False)
            item.setPos(box.x + box.w / 2 - item.size()[0] / 2, box.y - item.size()[1] - 4)
            placer.taken.append(item.sceneBoundingRect())
            out.append(item)
    for item in out:
        item.setVisible(show)
        scene.addItem(item)
    return out


def _middle(points) -> tuple[float, float]:
    """The point halfway along a polyline."""
    import math

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
    if getattr(view, "_show_slots", False) == show:
        return
    view._show_slots = show
    if view._layout is not None and not view._pending:
        view._add_marks()


def set_show_values(view, show: bool) -> None:
    """The Values toggle of a GraphView: leaf data and .grad, and root seeds, on the graph."""
    if getattr(view, "_show_values", False) == show:
        return
    view._show_values = show
    if view._layout is not None and not view._pending:
        view._add_marks()
