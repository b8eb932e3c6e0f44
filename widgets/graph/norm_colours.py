"""Colour by Gradient Norm: each edge of the graph in the colour of ‖g‖₂ of the gradient it
carried in the call, each leaf (AccumulateGrad) in the colour of its ‖grad‖₂, on the Gradients
heatmap's log scale and palette (``widgets.panels.grad_health``), with the exact norm in the
tooltip. The norms are ``core.model.edge_norms``'; this module only tints the items (their theme
with ``edge`` or ``leaf_fill`` replaced, so a theme change keeps the colours) and undoes it.

An edge merged from several (a collapsed group's) keeps its colour: one norm cannot stand for
several gradients. A call without edge gradients (over 300 nodes, a loop's summary) colours its
leaves only; the scale overlay (``widgets.graph.overlays.NormScale``) says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QLinearGradient, QPainter, QPen
from PySide6.QtWidgets import QGraphicsItem, QStyleOptionGraphicsItem

from core.model.edge_norms import WHY_NO_EDGES, CallNorms, call_norms, norm_text
from core.model.trace import CallInfo
from widgets.graph.items import EdgeItem, NodeItem
from widgets.graph.minimap import paint_overlay_frame
from widgets.graph.painting import color, font, text_width
from widgets.graph.scene import tooltip
from widgets.panels.grad_health import NAN_COLOR, STOPS, shade_color
from widgets.theme import Theme

EDGE_WIDTH = 2.2  # a coloured edge is drawn wider: a thin line shows little of its colour
SCALE_TITLE = "Gradient norm ‖g‖₂"
SCALE_WIDTH = 236.0


def norm_color(norms: CallNorms, value: float) -> QColor:
    """The heatmap's colour of ``value`` on the call's scale; grey for nan."""
    shade = norms.shade(value)
    return QColor(NAN_COLOR) if shade is None else shade_color(shade)


def _readable_on(fill: QColor) -> tuple[str, str]:
    """(text, muted text) colours readable on ``fill``: white on viridis' dark end, black on its light end."""
    luma = 0.2126 * fill.redF() + 0.7152 * fill.greenF() + 0.0722 * fill.blueF()
    return ("#ffffff", "#e0e0e0") if luma < 0.45 else ("#000000", "#303030")


@dataclass
class NormColouring:
    """What one scene had coloured, so that switching off gives every item back its own look."""

    norms: CallNorms
    edges: dict[int, tuple[EdgeItem, float]] = field(default_factory=dict)  # id(item) -> (item, norm)
    leaves: dict[str, tuple[NodeItem, float]] = field(default_factory=dict)  # node id -> (item, norm)
    tips: list[tuple[EdgeItem, str]] = field(default_factory=list)  # edges' tooltips before

    def undo(self, tips: bool = True) -> None:
        """Each item in its theme's colours again; ``tips`` False where the edges' tooltips were
        just made anew (a rebuild of the marks writes every edge's)."""
        for item, _ in self.edges.values():
            item.set_tint({})
        for item, tip in self.tips if tips else ():
            item.setToolTip(tip)
        for item, _ in self.leaves.values():
            item.set_tint({})
            item.setToolTip("")  # made again on hover (``GraphView.viewportEvent``)


def edge_tip(call: CallInfo, edge: EdgeItem, value: float) -> str:
    src = call.node(edge.edge.src)
    nxt = src.next[edge.edge.slot] if src is not None and edge.edge.slot < len(src.next) else None
    dst = call.node(nxt.node) if nxt is not None else None
    who = f"{src.name} sent to {dst.name}" if src is not None and dst is not None else "this edge carried"
    return f"‖grad‖₂ = {norm_text(value)}: the gradient {who} in this call"


def leaf_tip(value: float, name: str) -> str:
    return f"‖{name or 'leaf'}.grad‖₂ = {norm_text(value)} after this call"


def colour_by_norm(call: CallInfo, nodes: dict[str, NodeItem], edges: list[EdgeItem]) -> NormColouring:
    """Tint the edges and leaves of a built scene by their gradient norms."""
    norms = call_norms(call)
    out = NormColouring(norms)
    for e in edges:
        value = norms.edges.get((e.edge.src, e.edge.slot)) if e.edge.count == 1 else None
        if value is None:
            continue
        out.edges[id(e)] = (e, value)
        e.set_tint({"edge": norm_color(norms, value).name(), "line_width": EDGE_WIDTH})
        base = e.toolTip()
        out.tips.append((e, base))
        tip = edge_tip(call, e, value)
        e.setToolTip(f"{tip}\n\n{base}" if base else tip)
    for node_id, (value, name) in norms.leaves.items():
        item = nodes.get(node_id)
        if item is None:
            continue  # folded into a group box
        out.leaves[node_id] = (item, value)
        fill = norm_color(norms, value)
        text, muted = _readable_on(fill)
        item.set_tint({"leaf_fill": fill.name(), "leaf_border": fill.darker(150).name(), "text": text,
                       "muted_text": muted})
        item.setToolTip(f"{leaf_tip(value, name)}\n\n{tooltip(call, node_id)}")
    return out


# -- the colour scale ----------------------------------------------------------------------------


def scale_labels(norms: CallNorms) -> tuple[str, str] | None:
    """The smallest and the largest norm the scale spans; None when no norm is finite and positive."""
    span = norms.log_range
    if span is None:
        return None
    return norm_text(10 ** span[0]), norm_text(10 ** span[1])


def scale_note(norms: CallNorms) -> str:
    """What the scale colours: edges and leaves, or leaves only (and why); nan in grey."""
    note = "edges and leaves, log scale" if norms.has_edges else WHY_NO_EDGES
    return note + (" · grey: nan" if norms.has_nan else "")


def scale_size(theme: Theme, norms: CallNorms) -> tuple[float, float]:
    """The scale panel's width and height: title, bar, its ends' norms, the note (one or two lines)."""
    lines = 1 if text_width(scale_note(norms), theme.font_family, theme.small_font_px, False) <= SCALE_WIDTH - 20 else 2
    return SCALE_WIDTH, 24 + 12 + (theme.small_font_px + 4) * (1 + lines) + 6


def paint_norm_scale(p: QPainter, rect: QRectF, theme: Theme, norms: CallNorms) -> None:
    """The heatmap's colour bar as an overlay panel: title, bar, smallest and largest norm, note."""
    paint_overlay_frame(p, rect, theme, SCALE_TITLE)
    bar = QRectF(rect.left() + 10, rect.top() + 26, rect.width() - 20, 12)
    gradient = QLinearGradient(bar.topLeft(), bar.topRight())
    for k, c in enumerate(STOPS):
        gradient.setColorAt(k / (len(STOPS) - 1), c)
    p.setPen(QPen(color(theme.overlay_border), 0.8))
    p.setBrush(gradient)
    p.drawRect(bar)
    p.setFont(font(theme.font_family, theme.small_font_px))
    p.setPen(color(theme.text))
    row = theme.small_font_px + 4
    under = QRectF(bar.left(), bar.bottom() + 2, bar.width(), row)
    labels = scale_labels(norms)
    if labels is not None:
        p.drawText(under, Qt.AlignLeft | Qt.AlignVCenter, labels[0])
        p.drawText(under, Qt.AlignRight | Qt.AlignVCenter, labels[1])
    else:
        p.drawText(under, Qt.AlignHCenter | Qt.AlignVCenter, "no finite norm")
    p.setPen(color(theme.muted_text))
    note = QRectF(bar.left(), under.bottom(), bar.width(), rect.bottom() - under.bottom() - 4)
    p.drawText(note, Qt.AlignLeft | Qt.AlignTop | Qt.TextWordWrap, scale_note(norms))


class NormScaleItem(QGraphicsItem):
    """The colour scale in the scene, for exports (on screen it is an overlay of the view)."""

    def __init__(self, norms: CallNorms, theme: Theme):
        super().__init__()
        self.norms, self.theme = norms, theme
        self._rect = QRectF(0, 0, *scale_size(theme, norms))

    def boundingRect(self) -> QRectF:
        return self._rect

    def paint(self, p: QPainter, option: QStyleOptionGraphicsItem, widget=None) -> None:
        paint_norm_scale(p, self._rect, self.theme, self.norms)


SCALE_GAP = 16.0  # scene units between the graph (with its marks) and the scale under it


def add_norm_scale(view) -> NormScaleItem | None:
    """Put the colour scale in ``view``'s scene, under the graph's right end, when the view colours
    by norm (an export draws the scene, not the view's overlays); None when it does not."""
    colouring, layout = view.norm_colouring, view.graph_layout()
    if colouring is None or layout is None:
        return None
    item = NormScaleItem(colouring.norms, view.theme())
    rect = QRectF(0, 0, layout.width, layout.height).united(view.marks.bounds())
    item.setPos(max(rect.left(), rect.right() - item.boundingRect().width()), rect.bottom() + SCALE_GAP)
    view.scene().addItem(item)
    return item


# -- the view's toggle ---------------------------------------------------------------------------


class NormColoursMixin:
    """GraphView's Colour by Gradient Norm: applied to each scene the marks are built for."""

    _colour_by_norm = False
    norm_colouring: NormColouring | None = None  # what the shown scene had coloured

    def set_colour_by_norm(self, on: bool) -> None:
        """Colour edges and leaves by their gradient norms (the scale shown over the view), or not."""
        if bool(on) == self._colour_by_norm:
            return
        self._colour_by_norm = bool(on)
        self._colour_norms(rebuilt=False)

    def colours_by_norm(self) -> bool:
        return self._colour_by_norm

    def _colour_norms(self, rebuilt: bool = True) -> None:
        """(Re)colour the scene: after its marks were (re)built (``rebuilt``), or on the toggle."""
        old, self.norm_colouring = self.norm_colouring, None
        if old is not None:
            old.undo(tips=not rebuilt)
        call = self.state.call
        if self._colour_by_norm and call is not None and self.state.layout is not None:
            self.norm_colouring = colour_by_norm(call, self.node_items, self.edge_items)
        self.overlays.scale.set_norms(self.norm_colouring.norms if self.norm_colouring is not None else None)
        self.overlays.place()
