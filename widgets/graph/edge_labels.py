"""Edge labels of a scene placed, and placed again when their texts or the notes they avoid change.

The glue between the scene's items and ``widgets.graph.labels``' placer: what a label must keep off
(node and saved boxes, frame titles, notes, tags, the banner, arrowheads) and one placer per scene,
kept so that a step re-places only the labels whose text changed. Notes and tags are told apart by
their ``label_obstacle()`` (the rectangle of the text they draw), so this module needs neither
``teaching`` nor ``marks``, which build on it.
"""

from __future__ import annotations

import weakref

from PySide6.QtCore import QRectF
from PySide6.QtWidgets import QGraphicsSimpleTextItem

from widgets.graph.items import EdgeItem, GroupBoxItem, NodeItem, SavedItem
from widgets.graph.labels import LabelPlacer

_PLACERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # scene -> (edges, LabelPlacer)


def label_obstacles(scene) -> list[tuple[float, float, float, float]]:
    """What an edge label must not cover: node and saved boxes, module frame titles, notes, tags,
    sharing links (their storage names and dashed lines) and the banner (scene rectangles)."""
    out = []
    for item in scene.items():
        if isinstance(item, NodeItem):
            b = item.box
            out.append((b.x, b.y, b.x + b.w, b.y + b.h))
        elif isinstance(item, SavedItem):
            b = item.saved
            out.append((b.x, b.y, b.x + b.w, b.y + b.h))
        elif isinstance(item, GroupBoxItem):
            r = item.title_rect()
            if not r.isNull():
                out.append((r.left(), r.top(), r.right(), r.bottom()))
        elif hasattr(item, "label_obstacle"):  # notes, tags and link pills: the text they draw
            r = item.label_obstacle()
            out.append((r.left(), r.top(), r.right(), r.bottom()))
            if hasattr(item, "line_obstacles"):  # a sharing link's dashed line
                out.extend(item.line_obstacles())
        elif isinstance(item, QGraphicsSimpleTextItem):
            r = item.sceneBoundingRect()
            out.append((r.left(), r.top(), r.right(), r.bottom()))
    return out


def place_edge_labels(scene, edges: list[EdgeItem]) -> None:
    """Place every edge label of the scene anew (see ``widgets.graph.labels``): after the notes
    and tags, which they keep off."""
    if scene is None:
        return
    labelled = [e for e in edges if e.label_size()[0]]
    if not labelled:
        _PLACERS.pop(scene, None)
        return
    lines = {e: e.line_points() for e in edges}
    heads = [e.arrow_rect() for e in edges]
    placer = LabelPlacer(lines, label_obstacles(scene) + [(r.left(), r.top(), r.right(), r.bottom()) for r in heads],
                         horizontal=bool(edges) and edges[0].horizontal())
    _PLACERS[scene] = (edges, placer)
    # Short edges first: they have the fewest spots, long ones can go elsewhere along their line.
    labelled.sort(key=lambda e: _length(lines[e]))
    for e in labelled:
        e.set_label_at(*placer.place(e, e.label_sizes()))
    _repair(placer, labelled)
    hold_labels(scene, labelled)


def _repair(placer: LabelPlacer, labelled: list[EdgeItem]) -> None:
    """One repair round: a label that found no clear spot goes first, the labels around it after;
    kept only when that breaks fewer rules."""
    for e in [e for e in labelled if placer.faults.get(e)]:
        if not placer.faults.get(e):
            continue
        saved = {o: (placer.rects[o], placer.faults[o]) for o in [e, *placer.placed_near(e, 60.0)]}
        for o in saved:
            placer.release(o)
        spots = {o: placer.place(o, o.label_sizes()) for o in saved}
        if sum(placer.faults[o] for o in saved) < sum(bad for _, bad in saved.values()):
            for o, spot in spots.items():
                o.set_label_at(*spot)
            continue
        for o, (rect, bad) in saved.items():
            placer.release(o)
            placer.keep(o, rect, bad)


def hold_labels(scene, edges) -> None:
    """Grow the scene rect to hold the labels of ``edges`` that were placed past it (beside an
    edge on the graph's side), so that they can be scrolled to; it never shrinks here."""
    rect = scene.sceneRect()
    grown = rect
    for e in edges:
        if e.label_size()[0]:
            grown = grown.united(e.label_rect().adjusted(-6, -6, 6, 6))
    if grown != rect:
        scene.setSceneRect(grown)


def _length(line) -> float:
    return sum(abs(x1 - x0) + abs(y1 - y0) for (x0, y0), (x1, y1) in zip(line, line[1:]))


def note_grew(scene, rect: QRectF) -> None:
    """A note's text now fills ``rect`` (a leaf's chip while stepping): the labels it covers move."""
    found = _PLACERS.get(scene) if scene is not None else None
    if found is None:
        return
    placer = found[1]
    moved = placer.add_fixed((rect.left(), rect.top(), rect.right(), rect.bottom()))
    for e in moved:
        e.set_label_at(*placer.place(e, e.label_sizes()))
    hold_labels(scene, moved)


def replace_edge_labels(scene, edges: list[EdgeItem], changed: list[EdgeItem]) -> None:
    """Place again the labels of ``changed`` edges (their text changed), the others staying put:
    O(changed) once the scene's labels were placed."""
    if scene is None or not changed:
        return
    found = _PLACERS.get(scene)
    if found is None or found[0] is not edges:
        place_edge_labels(scene, edges)
        return
    placer = found[1]
    for e in changed:
        if e.label_size()[0]:
            e.set_label_at(*placer.place(e, e.label_sizes()))
        else:
            placer.release(e)
    hold_labels(scene, changed)
