"""Routes for the dashed storage links: short curves between boxes that go around other boxes.

A link leaves a box from one of its free sides (not where edges meet a node, not the side of a
saved box that carries its dotted line, not a node's right side when its saved boxes sit there),
either straight towards the other box (an S-curve between facing sides) or out to a lane clear of
other boxes and back (a bracket, both ends on the same side). The cheapest route wins: its length,
with the parts inside other boxes and tags counted many times over. Routes are tested as point
lists against a grid of rectangles, and only the winner becomes a QPainterPath: big graphs have
thousands of links.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from PySide6.QtCore import QPointF, QRectF
from PySide6.QtGui import QPainterPath

STEP = 12.0  # spacing of the points a route is tested at
MIN_RUN = 16.0  # facing sides closer than this make a curve too short to see
LANE_GAP = 16.0  # how far a bracket runs out from the boxes it joins, at least
CROSSING = 25.0  # cost of a route per unit of length inside another box, against 1 outside
CELL = 64.0
SLACK = 1.25  # a clear route within this factor of the shortest conceivable one is taken

Rect = tuple[float, float, float, float]  # x0, y0, x1, y1
Point = tuple[float, float]


@dataclass(frozen=True)
class LinkEnd:
    """A box a link may join: a node or a saved box, as scene coordinates (x0, y0, x1, y1)."""

    rect: Rect
    saved: bool = False
    right_free: bool = True  # False for a node whose saved boxes sit on its right


class Obstacles:
    """Rectangles links should not cross, in a grid for quick lookups near a route."""

    def __init__(self, rects=()):
        self._cells: dict[tuple[int, int], list[Rect]] = {}
        for r in rects:
            self.add(r)

    def add(self, r: Rect) -> None:
        for key in self._keys(r):
            self._cells.setdefault(key, []).append(r)

    def _keys(self, r: Rect):
        for i in range(int(r[0] // CELL), int(r[2] // CELL) + 1):
            for j in range(int(r[1] // CELL), int(r[3] // CELL) + 1):
                yield i, j

    def near(self, r: Rect, skip=()) -> list[Rect]:
        found = {x for key in self._keys(r) for x in self._cells.get(key, ())}
        return [x for x in found if x not in skip and x[0] <= r[2] and r[0] <= x[2] and x[1] <= r[3] and r[1] <= x[3]]

    def at(self, x: float, y: float) -> list[Rect]:
        """The rectangles that may contain the point (those in its grid cell)."""
        return self._cells.get((int(x // CELL), int(y // CELL)), [])


def anchors(end: LinkEnd) -> list[tuple[str, Point, Point]]:
    """(side, point, outward normal) where a link may leave ``end``."""
    x0, y0, x1, y1 = end.rect
    cx, cy, w = (x0 + x1) / 2, (y0 + y1) / 2, x1 - x0
    # Edges meet a node in the middle of its top and bottom: links use the quarter points.
    xs = (cx,) if end.saved else (x0 + w / 4, x1 - w / 4)
    out = [("top", (x, y0), (0.0, -1.0)) for x in xs] + [("bottom", (x, y1), (0.0, 1.0)) for x in xs]
    if end.right_free:
        out.append(("right", (x1, cy), (1.0, 0.0)))
    if not end.saved:
        out.append(("left", (x0, cy), (-1.0, 0.0)))
    return out


def _facing(pa: Point, na: Point, pb: Point, nb: Point, dist: float) -> list[Point]:
    """Control points of an S-curve leaving ``pa`` along ``na`` and entering ``pb`` against ``nb``."""
    k = max(12.0, min(60.0, 0.45 * dist))
    return [pa, (pa[0] + na[0] * k, pa[1] + na[1] * k), (pb[0] + nb[0] * k, pb[1] + nb[1] * k), pb]


def _bezier(c: list[Point], n: int) -> list[Point]:
    (x0, y0), (x1, y1), (x2, y2), (x3, y3) = c
    out = []
    for i in range(n + 1):
        t = i / n
        u = 1 - t
        a, b, cc, d = u * u * u, 3 * u * u * t, 3 * u * t * t, t * t * t
        out.append((a * x0 + b * x1 + cc * x2 + d * x3, a * y0 + b * y1 + cc * y2 + d * y3))
    return out


def _bracket(pa: Point, pb: Point, n: Point, skip, obstacles: Obstacles) -> list[Point]:
    """Corners of a route out from both ends on the same side to a lane clear of other boxes."""
    axis = 0 if n[0] else 1  # the lane runs across this axis
    sign = n[axis]
    outer = max(pa[axis], pb[axis]) if sign > 0 else min(pa[axis], pb[axis])
    lane = outer + sign * LANE_GAP
    lo, hi = sorted((pa[1 - axis], pb[1 - axis]))
    for _ in range(8):
        strip = (lane - 1, lo, lane + 1, hi) if axis == 0 else (lo, lane - 1, hi, lane + 1)
        hit = obstacles.near(strip, skip)
        if not hit:
            break
        lane = max(r[axis + 2] for r in hit) + 10 if sign > 0 else min(r[axis] for r in hit) - 10
    corner = (lambda p: (lane, p[1])) if axis == 0 else (lambda p: (p[0], lane))
    return [pa, corner(pa), corner(pb), pb]


def _along(corners: list[Point]) -> list[Point]:
    out = [corners[0]]
    for (x0, y0), (x1, y1) in zip(corners, corners[1:]):
        n = max(1, int(math.hypot(x1 - x0, y1 - y0) / STEP))
        out += [(x0 + (x1 - x0) * i / n, y0 + (y1 - y0) * i / n) for i in range(1, n + 1)]
    return out


def _cost(points: list[Point], skip, obstacles: Obstacles) -> float:
    """Length of a route, with the parts inside other boxes counted ``CROSSING`` times."""
    cost, at, hypot = 0.0, obstacles.at, math.hypot
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        x, y = (x0 + x1) / 2, (y0 + y1) / 2
        hit = any(r[0] < x < r[2] and r[1] < y < r[3] and r not in skip for r in at(x, y))
        cost += hypot(x1 - x0, y1 - y0) * (CROSSING if hit else 1.0)
    return cost


def link_route(a: LinkEnd, b: LinkEnd, obstacles: Obstacles | None) -> tuple[str, list[Point]]:
    """The cheapest route: ("curve", 4 Bézier control points) or ("bracket", 4 corners).

    Without ``obstacles`` (thousands of links) the shortest conceivable route is taken as is.
    """
    skip = (a.rect, b.rect)
    candidates = []
    for sa, pa, na in anchors(a):
        for sb, pb, nb in anchors(b):
            dx, dy = pb[0] - pa[0], pb[1] - pa[1]
            dist = math.hypot(dx, dy)
            if dist < MIN_RUN:
                continue
            if na[0] * dx + na[1] * dy > 0 and -(nb[0] * dx + nb[1] * dy) > 0:
                candidates.append((dist, "curve", pa, na, pb, nb))
            elif sa == sb:
                candidates.append((dist + 2 * LANE_GAP, "bracket", pa, na, pb, nb))
    candidates.sort(key=lambda c: c[0])
    best: tuple[float, str, list[Point]] | None = None
    for low, kind, pa, na, pb, nb in candidates:
        if best is not None and low * SLACK >= best[0]:
            break  # no route left is much cheaper: a route is never shorter than its lower bound
        if obstacles is None:
            points = _facing(pa, na, pb, nb, low) if kind == "curve" else _bracket(pa, pb, na, skip, Obstacles())
            return kind, points
        if kind == "curve":
            points = _facing(pa, na, pb, nb, low)
            cost = _cost(_bezier(points, max(6, int(low / STEP))), skip, obstacles)
        else:
            points = _bracket(pa, pb, na, skip, obstacles)
            cost = _cost(_along(points), skip, obstacles)
        if best is None or cost < best[0]:
            best = (cost, kind, points)
    if best is None:  # the two boxes touch: a straight line
        ca = ((a.rect[0] + a.rect[2]) / 2, (a.rect[1] + a.rect[3]) / 2)
        cb = ((b.rect[0] + b.rect[2]) / 2, (b.rect[1] + b.rect[3]) / 2)
        return "bracket", [ca, cb]
    return best[1], best[2]


def route_path(kind: str, points: list[Point], radius: float = 8.0) -> QPainterPath:
    """The drawn path of a route: the Bézier curve, or the bracket with its corners rounded."""
    pts = [QPointF(*p) for p in points]
    path = QPainterPath(pts[0])
    if kind == "curve":
        path.cubicTo(pts[1], pts[2], pts[3])
        return path
    for prev, corner, nxt in zip(pts, pts[1:], pts[2:]):
        a, b = corner - prev, nxt - corner
        la, lb = math.hypot(a.x(), a.y()), math.hypot(b.x(), b.y())
        r = min(radius, la / 2, lb / 2)
        if r < 0.5:
            path.lineTo(corner)
            continue
        path.lineTo(corner - a * (r / la))
        path.quadTo(corner, corner + b * (r / lb))
    path.lineTo(pts[-1])
    return path


def label_spot(kind: str, points: list[Point], size: tuple[float, float], skip, obstacles: Obstacles | None) -> QPointF:
    """Where along a route its label goes: the middle, or the point nearest it that hides nothing."""
    line = _bezier(points, 24) if kind == "curve" else _along(points)
    lengths = [math.hypot(x1 - x0, y1 - y0) for (x0, y0), (x1, y1) in zip(line, line[1:])]
    total = sum(lengths)
    w, h = size
    for fraction in (0.5, 0.4, 0.6, 0.3, 0.7, 0.2, 0.8):
        x, y = _point_at(line, lengths, total * fraction)
        if obstacles is None or not obstacles.near((x - w / 2, y - h / 2, x + w / 2, y + h / 2), skip):
            return QPointF(x, y)
    return QPointF(*_point_at(line, lengths, total / 2))


def _point_at(line: list[Point], lengths: list[float], at: float) -> Point:
    for ((x0, y0), (x1, y1)), seg in zip(zip(line, line[1:]), lengths):
        if at <= seg and seg > 0:
            return x0 + (x1 - x0) * at / seg, y0 + (y1 - y0) * at / seg
        at -= seg
    return line[-1]


def rect_tuple(r: QRectF) -> Rect:
    return r.left(), r.top(), r.right(), r.bottom()


def spanning_pairs(centres: list[Point]) -> list[tuple[int, int]]:
    """Index pairs of a minimum spanning tree over points (n points, n - 1 pairs), by Prim's algorithm."""

    def dist(i: int, j: int) -> float:
        return abs(centres[i][0] - centres[j][0]) + abs(centres[i][1] - centres[j][1])

    best = {i: (dist(i, 0), 0) for i in range(1, len(centres))}
    pairs = []
    while best:
        i = min(best, key=lambda j: (best[j][0], j))
        pairs.append((best.pop(i)[1], i))
        for j, (d, _) in best.items():
            dj = dist(i, j)
            if dj < d:
                best[j] = (dj, i)
    return pairs
