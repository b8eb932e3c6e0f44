"""Where edge labels go: on their own edge, or just beside it, joined to it by a short leader line.

A label is only true if a reader can tell which edge it belongs to. So a spot is taken only when
the label's box is nearer its own edge's drawn line than any other edge's line (by a margin), and
covers no node box, module frame title, arrowhead, note, tag or label placed before it. Candidate
spots run along the edge from its middle out: beside the line across the axis the layers are spread
on (left or right of it top down, above or below it left to right), on the side the edge leans to
first, then centred on it, then further out with a leader line. The first clear one wins; when none
is, a shorter form of the label is tried (see ``EdgeItem.label_forms``), and at last the spot that
breaks the fewest rules is taken.

Hand-written, in plain geometry, rather than a general label-placement library: the rules are few
and specific to this picture (own edge nearest, nothing covered), the inputs are rectangles and
sampled lines, and stepping re-places a few labels per step while a Continue on a graph of
thousands of nodes labels thousands of edges at once. Everything is looked up through grids, so
placing n labels costs O(n) (times a constant number of candidates), never O(n^2).
"""

from __future__ import annotations

import math

Rect = tuple[float, float, float, float]  # x0, y0, x1, y1
Point = tuple[float, float]

CELL = 64.0  # grid of boxes and placed labels
LINE_CELL = 32.0  # grid of line pieces: finer, as dense graphs run many lines through a cell
COARSE = 256.0  # grid of whole lines, from which a fine cell's pieces are found
MARGIN = 3.0  # a label's box must be this much nearer its own edge than any other
PAD = 1.0  # labels keep this far from what they must not cover
GAPS = (3.0, 0.0, 10.0, 18.0, 28.0, 40.0)  # off the line (0: centred on it); beyond 6 a leader line joins them
ALONG = (0.5, 0.4, 0.6, 0.3, 0.7, 0.22, 0.78, 0.15, 0.85)
LEADER_FROM = 6.0


def sample_path(points: list[Point], curved: bool, horizontal: bool, steps: int = 10) -> list[Point]:
    """The drawn line of an edge (``widgets.graph.items.edge_path``) as a polyline: straight runs,
    and the S-curves across gaps sampled at ``steps`` points."""
    out = [points[0]]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        bent = abs(y1 - y0) >= 0.5 if horizontal else abs(x1 - x0) >= 0.5
        if not curved or not bent:
            out.append((x1, y1))
            continue
        if horizontal:
            mx = (x0 + x1) / 2
            c1, c2 = (mx, y0), (mx, y1)
        else:
            my = (y0 + y1) / 2
            c1, c2 = (x0, my), (x1, my)
        for i in range(1, steps + 1):
            t = i / steps
            u = 1 - t
            a, b, c, d = u * u * u, 3 * u * u * t, 3 * u * t * t, t * t * t
            out.append((a * x0 + b * c1[0] + c * c2[0] + d * x1, a * y0 + b * c1[1] + c * c2[1] + d * y1))
    return out


def _cells(r: Rect, size: float = CELL):
    for i in range(int(r[0] // size), int(r[2] // size) + 1):
        for j in range(int(r[1] // size), int(r[3] // size) + 1):
            yield i, j


def _overlap(a: Rect, b: Rect) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def point_rect_distance(x: float, y: float, r: Rect) -> float:
    dx = max(r[0] - x, 0.0, x - r[2])
    dy = max(r[1] - y, 0.0, y - r[3])
    return math.hypot(dx, dy)


def _point_segment(px: float, py: float, s: Rect) -> float:
    x0, y0, x1, y1 = s
    dx, dy = x1 - x0, y1 - y0
    n = dx * dx + dy * dy
    t = 0.0 if n == 0 else max(0.0, min(1.0, ((px - x0) * dx + (py - y0) * dy) / n))
    return math.hypot(px - x0 - t * dx, py - y0 - t * dy)


def _crosses(s: Rect, r: Rect) -> bool:
    """Whether segment ``s`` passes through rectangle ``r`` (Liang-Barsky clipping)."""
    x0, y0, x1, y1 = s
    dx, dy = x1 - x0, y1 - y0
    lo, hi = 0.0, 1.0
    for p, q in ((-dx, x0 - r[0]), (dx, r[2] - x0), (-dy, y0 - r[1]), (dy, r[3] - y0)):
        if p == 0:
            if q < 0:
                return False
        else:
            t = q / p
            if p < 0:
                lo = max(lo, t)
            else:
                hi = min(hi, t)
            if lo > hi:
                return False
    return True


def segment_rect_distance(s: Rect, r: Rect) -> float:
    """The distance between a segment and a rectangle (0 when it touches or crosses it)."""
    if _crosses(s, r):
        return 0.0
    x0, y0, x1, y1 = s
    return min(point_rect_distance(x0, y0, r), point_rect_distance(x1, y1, r),
               *(_point_segment(cx, cy, s) for cx in (r[0], r[2]) for cy in (r[1], r[3])))


class LabelPlacer:
    """Places the labels of ``paths`` (sampled edge lines, one per edge key) clear of ``fixed``
    rectangles and of each other; ``place`` again when a label's text changes."""

    def __init__(self, paths: dict, fixed: list[Rect], horizontal: bool = False):
        self.paths = paths
        self.horizontal = horizontal  # layers run left to right: labels go above or below their edge
        # Line pieces by fine grid cell, found when a cell is first asked about (through a coarse
        # grid of whole lines): the first label of a step on a big graph need not index them all.
        self._segs: dict[tuple[int, int], list[tuple[object, Rect, Rect]]] = {}
        self._own: dict = {}  # key -> its line's (segment, bounding box) pieces, made when needed
        self._lines: dict[tuple[int, int], list] = {}  # coarse cell -> keys of the lines crossing it
        self._filled: set[tuple[int, int]] = set()  # coarse cells whose fine cells are indexed
        for key, line in paths.items():
            xs, ys = [p[0] for p in line], [p[1] for p in line]
            for cell in _cells((min(xs), min(ys), max(xs), max(ys)), COARSE):
                self._lines.setdefault(cell, []).append(key)
        self._fixed: dict[tuple[int, int], list[Rect]] = {}
        for r in fixed:
            for cell in _cells(r):
                self._fixed.setdefault(cell, []).append(r)
        self._placed: dict[tuple[int, int], dict] = {}  # cell -> key -> rect
        self.rects: dict = {}  # key -> the rect its label took
        self.faults: dict = {}  # key -> how badly its spot breaks the rules (0: not at all)

    def _pieces(self, key) -> list:
        own = self._own.get(key)
        if own is None:
            line = self.paths[key]
            own = self._own[key] = [((x0, y0, x1, y1), (min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)))
                                    for (x0, y0), (x1, y1) in zip(line, line[1:])]
        return own

    def _cell_pieces(self, cell: tuple[int, int]) -> list:
        found = self._segs.get(cell)
        if found is None:
            coarse = (int(cell[0] * LINE_CELL // COARSE), int(cell[1] * LINE_CELL // COARSE))
            if coarse in self._filled:
                return ()
            self._filled.add(coarse)  # index the pieces of every line through it, in its fine cells
            n = int(COARSE // LINE_CELL)
            i0, j0 = coarse[0] * n, coarse[1] * n
            for key in self._lines.get(coarse, ()):
                for s, box in self._pieces(key):
                    i1, j1 = min(i0 + n - 1, int(box[2] // LINE_CELL)), min(j0 + n - 1, int(box[3] // LINE_CELL))
                    for i in range(max(i0, int(box[0] // LINE_CELL)), i1 + 1):
                        for j in range(max(j0, int(box[1] // LINE_CELL)), j1 + 1):
                            self._segs.setdefault((i, j), []).append((key, s, box))
            found = self._segs.get(cell, ())
        return found

    def add_fixed(self, r: Rect) -> list:
        """Something new to keep off (a note grew): returns the keys of the labels it now covers."""
        for cell in _cells(r):
            self._fixed.setdefault(cell, []).append(r)
        return list({k: None for cell in _cells(r) for k, p in self._placed.get(cell, {}).items() if _overlap(r, p)})

    def release(self, key) -> None:
        """Forget ``key``'s label (its text was removed)."""
        r = self.rects.pop(key, None)
        self.faults.pop(key, None)
        if r is not None:
            for cell in _cells(r):
                self._placed.get(cell, {}).pop(key, None)

    def place(self, key, sizes: list[tuple[float, float]]) -> tuple[Rect, Point | None, Point | None, int]:
        """A label for edge ``key``, in the first of its forms (``sizes``: w x h of each, longest
        first) that finds a clear spot, else where the first breaks the fewest rules: (its rect,
        the two ends of its leader line or None, the form's index)."""
        self.release(key)
        best = None
        for form, (w, h) in enumerate(sizes):
            for rect, anchor, gap in self._candidates(key, w, h):
                bad = self._faults(key, rect)
                if best is None or bad < best[0] or (bad == best[0] and form > best[4]):  # no room: shortest
                    best = (bad, rect, anchor, gap, form)
                if bad == 0:
                    break
            if best[0] == 0:
                break
        bad, rect, anchor, gap, form = best
        for cell in _cells(rect):
            self._placed.setdefault(cell, {})[key] = rect
        self.rects[key] = rect
        self.faults[key] = bad
        if gap <= LEADER_FROM:
            return rect, None, None, form
        x = min(max(anchor[0], rect[0]), rect[2])
        y = min(max(anchor[1], rect[1]), rect[3])
        return rect, anchor, (x, y), form

    def keep(self, key, rect: Rect, bad: int = 0) -> None:
        """Hold ``rect`` for ``key``'s label, as placed before."""
        for cell in _cells(rect):
            self._placed.setdefault(cell, {})[key] = rect
        self.rects[key] = rect
        self.faults[key] = bad

    def placed_near(self, key, reach: float) -> list:
        """Keys of the labels placed within ``reach`` of ``key``'s line."""
        line = self.paths[key]
        xs, ys = [p[0] for p in line], [p[1] for p in line]
        area = (min(xs) - reach, min(ys) - reach, max(xs) + reach, max(ys) + reach)
        found = {}
        for cell in _cells(area):
            for other, r in self._placed.get(cell, {}).items():
                if other != key and _overlap(area, r):
                    found[other] = None
        return list(found)

    def _candidates(self, key, w: float, h: float):
        line = self.paths[key]
        lengths = [math.hypot(x1 - x0, y1 - y0) for (x0, y0), (x1, y1) in zip(line, line[1:])]
        total = sum(lengths)
        spots = [_at(line, lengths, total * t) for t in ALONG]
        # the side the edge leans to first (the outside of a fan of edges, away from its siblings)
        lean_x, lean_y = line[-1][0] - line[0][0], line[-1][1] - line[0][1]
        across = (1, -1) if lean_x > 1 else (-1, 1)
        updown = (1, -1) if lean_y > 1 else (-1, 1)
        for gap in GAPS:
            for (x, y), (tx, ty) in spots:
                if gap == 0:
                    yield (x - w / 2, y - h / 2, x + w / 2, y + h / 2), (x, y), gap
                    continue
                # Beside the line across the axis layers are spread on (left or right of it top down,
                # above or below it left to right), so a label never slides into the next row of boxes.
                if not self.horizontal:
                    run = abs(tx) / max(abs(ty), 1e-6) * h / 2
                    off = gap + min(run, w)
                    for side in across:
                        x0 = x + off if side > 0 else x - off - w
                        yield (x0, y - h / 2, x0 + w, y + h / 2), (x, y), gap
                else:  # above or below it, centred on the point or running off either way
                    rise = abs(ty) / max(abs(tx), 1e-6) * w / 2
                    off = gap + min(rise, 3 * h)
                    for side in updown:
                        y0 = y - off - h if side < 0 else y + off
                        # further out, a leader line joins it: it may also run well past the point
                        far = (x + 24, x - 24 - w) if gap > LEADER_FROM else ()
                        for x0 in (x - w / 2, x - 8, x + 8 - w, *far):
                            yield (x0, y0, x0 + w, y0 + h), (x, y), gap

    def _faults(self, key, r: Rect) -> int:
        """How badly a label at ``r`` breaks the rules: 0 when it covers nothing and is nearer its
        own edge than any other. A spot that covers something is not measured further."""
        pad = (r[0] - PAD, r[1] - PAD, r[2] + PAD, r[3] + PAD)
        bad = 0
        seen = set()
        for cell in _cells(pad):
            for f in self._fixed.get(cell, ()):
                if id(f) not in seen and _overlap(pad, f):
                    seen.add(id(f))
                    bad += 4
            for other, p in self._placed.get(cell, {}).items():
                if other != key and other not in seen and _overlap(pad, p):
                    seen.add(other)
                    bad += 4
        if bad:
            return bad + 3
        own = math.inf
        for s, box in self._pieces(key):
            if own > 0 and max(box[0] - r[2], r[0] - box[2], box[1] - r[3], r[1] - box[3]) < own:
                own = min(own, segment_rect_distance(s, r))
        near = own + MARGIN
        for cell in _cells((r[0] - near, r[1] - near, r[2] + near, r[3] + near), LINE_CELL):
            for k, s, box in self._cell_pieces(cell):
                if k == key or box[0] - r[2] > near or r[0] - box[2] > near or box[1] - r[3] > near \
                        or r[1] - box[3] > near:
                    continue
                if segment_rect_distance(s, r) <= near:
                    return 3
        return 0


def _at(line: list[Point], lengths: list[float], at: float) -> tuple[Point, Point]:
    """The point ``at`` along a polyline, and the unit direction of the piece it lies on."""
    for ((x0, y0), (x1, y1)), seg in zip(zip(line, line[1:]), lengths):
        if at <= seg and seg > 0:
            k = at / seg
            return (x0 + (x1 - x0) * k, y0 + (y1 - y0) * k), ((x1 - x0) / seg, (y1 - y0) / seg)
        at -= seg
    (x0, y0), (x1, y1) = line[-2], line[-1]
    n = math.hypot(x1 - x0, y1 - y0) or 1.0
    return line[-1], ((x1 - x0) / n, (y1 - y0) / n)
