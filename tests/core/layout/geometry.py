"""Geometry checks shared by the layout tests: overlapping boxes, edges through boxes, containment."""

from __future__ import annotations

from collections import Counter


def overlaps(boxes) -> list[tuple[str, str]]:
    """Pairs of boxes (id, x, y, w, h) whose interiors intersect, found through a coarse grid."""
    cell = 256.0
    grid: dict[tuple[int, int], list] = {}
    hits = set()
    for b in boxes:
        bid, x, y, w, h = b
        for gx in range(int(x // cell), int((x + w) // cell) + 1):
            for gy in range(int(y // cell), int((y + h) // cell) + 1):
                for o in grid.setdefault((gx, gy), []):
                    oid, ox, oy, ow, oh = o
                    if x < ox + ow - 1e-6 and ox < x + w - 1e-6 and y < oy + oh - 1e-6 and oy < y + h - 1e-6:
                        hits.add(tuple(sorted((bid, oid))))
                grid[(gx, gy)].append(b)
    return sorted(hits)


def node_boxes(lay):
    return [(b.id, b.x, b.y, b.w, b.h) for b in lay.nodes.values()] + [
        (f"saved:{s.node}:{s.name}", s.x, s.y, s.w, s.h) for s in lay.saved
    ]


def trace_edges(c) -> Counter:
    return Counter((n.id, e.node, e.input_nr) for n in c.nodes for e in n.next if e is not None)


def inside(inner, outer) -> bool:
    x, y, w, h = inner
    ox, oy, ow, oh = outer
    return ox - 1e-6 <= x and oy - 1e-6 <= y and x + w <= ox + ow + 1e-6 and y + h <= oy + oh + 1e-6


def edges_crossing_boxes(lay) -> list[tuple[str, str, str]]:
    """(src, dst, box) for every edge segment whose bounding box enters a box it does not end at.

    Straight runs cross layer bands and curves stay inside the bounding box of their two
    end points, so a segment box that meets no node is an edge that goes around nodes."""
    cell = 256.0
    grid: dict[tuple[int, int], list] = {}
    for bid, x, y, w, h in node_boxes(lay):
        for gx in range(int(x // cell), int((x + w) // cell) + 1):
            for gy in range(int(y // cell), int((y + h) // cell) + 1):
                grid.setdefault((gx, gy), []).append((bid, x, y, w, h))
    bad = set()
    for e in lay.edges:
        for (x0, y0), (x1, y1) in zip(e.points, e.points[1:]):
            lx, hx, ly, hy = min(x0, x1), max(x0, x1), min(y0, y1), max(y0, y1)
            for gx in range(int(lx // cell), int(hx // cell) + 1):
                for gy in range(int(ly // cell), int(hy // cell) + 1):
                    for bid, x, y, w, h in grid.get((gx, gy), []):
                        if bid in (e.src, e.dst):
                            continue
                        if lx < x + w - 0.5 and x + 0.5 < hx + 1e-9 and ly < y + h - 0.5 and y + 0.5 < hy:
                            bad.add((e.src, e.dst, bid))
    return sorted(bad)
