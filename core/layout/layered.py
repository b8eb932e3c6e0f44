"""The layered (Sugiyama) engine on a plain graph of sized boxes: no trace, no Qt.

``layered()`` places one level of the compound layout in ``core.layout.compound``: boxes are trace
nodes, collapsed groups or whole expanded groups; ports are the points where edges cross
the border of the group being laid out. Steps: break cycles, longest-path layering (sources
on top), dummy points on long edges, barycenter sweeps that keep the ordering with the
fewest crossings, then x by weighted isotonic regression per layer (nodes pulled towards
their neighbours, never closer than their widths allow). Nodes in one layer never overlap
and layers are separate bands, so no two boxes overlap.
"""

from __future__ import annotations

from dataclasses import dataclass

LAYER_GAP = 46.0  # vertical space between layer bands; edge curves and shape texts live here
PORT_GAP = 18.0  # between a group's port row and its first / last layer
NODE_GAP = 26.0
LANE_GAP = 12.0  # between parallel edges passing through a layer
MIXED_GAP = 18.0


@dataclass
class LayeredResult:
    xs: list[float]  # centres, content coordinates (top-left of the content is 0, 0)
    ys: list[float]
    layers: list[int]
    routes: list[list[tuple[float, float]]]  # per edge, from the source's border to the target's
    width: float
    height: float
    crossings: int


def layered(
    sizes: list[tuple[float, float]],
    edges: list[tuple[int, int]],
    *,
    sources: tuple[int, ...] | list[int] = (),
    sinks: tuple[int, ...] | list[int] = (),
    src_off: list[float | None] | None = None,
    dst_off: list[float | None] | None = None,
    anchors: list[tuple[float, float, float] | None] | None = None,
    fast: bool = False,
    gap: float = LAYER_GAP,
    node_gap: float = NODE_GAP,
) -> LayeredResult:
    """Lay out boxes ``sizes[i] = (w, h)`` joined by directed ``edges``.

    ``sources`` are pinned to the top row and ``sinks`` to the bottom row (a group's ports).
    ``src_off``/``dst_off`` fix where an edge leaves / enters a box (x offset from its
    centre; None spreads the edges of a box over its border). ``anchors[i] = (dx, w, h)``
    is the part of a box that edges attach to, when that is not the whole box. ``fast`` runs
    fewer sweeps (big graphs, where nobody reads every crossing). ``gap``: the space between
    layers (wider where labels must fit beside edges that cross it); ``node_gap``: between two
    boxes of a layer.
    """
    n = len(sizes)
    m = len(edges)
    src_off = src_off or [None] * m
    dst_off = dst_off or [None] * m
    if n == 0:
        return LayeredResult([], [], [], [], 0.0, 0.0, 0)
    dag, flipped = _acyclic(n, edges, sources)
    layer = _layering(n, dag, sources, sinks)
    nl = max(layer) + 1

    # Proper graph: dummy points on edges longer than one layer.
    w = [s[0] for s in sizes]
    h = [s[1] for s in sizes]
    is_port = [False] * n
    for p in list(sources) + list(sinks):
        is_port[p] = True
    up: list[list[int]] = [[] for _ in range(n)]
    down: list[list[int]] = [[] for _ in range(n)]
    # x of where an edge attaches, relative to the box centre: neighbours pull on these points
    up_d: list[list[float]] = [[] for _ in range(n)]
    down_d: list[list[float]] = [[] for _ in range(n)]
    adx = [a[0] if a is not None else 0.0 for a in anchors] if anchors is not None else [0.0] * n
    chains: list[list[int]] = []
    for e, (a, b) in enumerate(dag):
        oa, ob = (dst_off[e], src_off[e]) if flipped[e] else (src_off[e], dst_off[e])
        if oa is not None and ob is not None:
            # Box to box (two groups): align centres. Aligning ports would make a chain of
            # identical blocks drift sideways by the same offset at every step.
            oa = ob = 0.0
        oa = adx[a] if oa is None else oa
        ob = adx[b] if ob is None else ob
        chain = [a]
        for lay in range(layer[a] + 1, layer[b]):
            d = len(w)
            w.append(0.0)
            h.append(0.0)
            layer.append(lay)
            is_port.append(True)
            for lst in (up, down, up_d, down_d):
                lst.append([])
            chain.append(d)
        chain.append(b)
        last = len(chain) - 2
        for i, (u, v) in enumerate(zip(chain, chain[1:])):
            ou = oa if i == 0 else 0.0
            ov = ob if i == last else 0.0
            down[u].append(v)
            down_d[u].append(ov - ou)
            up[v].append(u)
            up_d[v].append(ou - ov)
        chains.append(chain)
    total = len(w)
    is_dummy = [i >= n or is_port[i] for i in range(total)]

    rows = _initial_order(total, nl, layer, down, sources)
    fast = fast or total > 12000
    rows, crossings = _reduce_crossings(rows, up, down, 2 if fast else 6)

    xs = _assign_x(rows, (up, up_d), (down, down_d), w, is_dummy, 2 if fast else 5, node_gap)
    ys, height = _assign_y(rows, h, nl, bool(sources), bool(sinks), gap)
    left = min(xs[v] - w[v] / 2 for v in range(total))
    xs = [x - left for x in xs]
    width = max(xs[v] + w[v] / 2 for v in range(total))

    band = [0.0] * nl
    for lay, row in enumerate(rows):
        band[lay] = max((h[v] for v in row), default=0.0)
    routes = _routes(chains, flipped, xs, ys, w, h, layer, band, src_off, dst_off, anchors, n)
    return LayeredResult(xs[:n], ys[:n], layer[:n], routes, width, height, crossings)


def _acyclic(n, edges, sources) -> tuple[list[tuple[int, int]], list[bool]]:
    """Edges in a direction that makes the graph acyclic; flipped[i] marks reversed ones."""
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for a, b in edges:
        succ[a].append(b)
        indeg[b] += 1
    deg = indeg[:]
    stack = [v for v in range(n) if deg[v] == 0]
    seen = 0
    while stack:
        v = stack.pop()
        seen += 1
        for u in succ[v]:
            deg[u] -= 1
            if deg[u] == 0:
                stack.append(u)
    if seen == n:
        return list(edges), [False] * len(edges)
    # Depth-first search; an edge into a node still on the stack closes a cycle.
    state = [0] * n  # 0 new, 1 on stack, 2 done
    rank = [0] * n
    counter = 0
    starts = list(sources) + [v for v in range(n) if indeg[v] == 0] + list(range(n))
    for s in starts:
        if state[s]:
            continue
        state[s] = 1
        it_stack = [(s, iter(succ[s]))]
        while it_stack:
            v, it = it_stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[v] = 2
                rank[v] = counter
                counter += 1
                it_stack.pop()
            elif state[nxt] == 0:
                state[nxt] = 1
                it_stack.append((nxt, iter(succ[nxt])))
    # Reverse postorder is a topological order once back edges are turned round.
    dag, flipped = [], []
    for a, b in edges:
        back = rank[a] <= rank[b] and a != b
        dag.append((b, a) if back else (a, b))
        flipped.append(back)
    return dag, flipped


def _layering(n, dag, sources, sinks) -> list[int]:
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for a, b in dag:
        succ[a].append(b)
        indeg[b] += 1
    base = 1 if sources else 0
    layer = [base] * n
    for s in sources:
        layer[s] = 0
    stack = [v for v in range(n) if indeg[v] == 0]
    while stack:
        v = stack.pop()
        for u in succ[v]:
            if layer[v] + 1 > layer[u]:
                layer[u] = layer[v] + 1
            indeg[u] -= 1
            if indeg[u] == 0:
                stack.append(u)
    if sinks:
        sink_set = set(sinks)
        bottom = max((layer[v] for v in range(n) if v not in sink_set), default=0) + 1
        for s in sinks:
            layer[s] = bottom
    return layer


def _initial_order(total, nl, layer, down, sources) -> list[list[int]]:
    """Depth-first preorder from the top: children appear in the order of next_functions."""
    pre = [-1] * total
    counter = 0
    starts = list(sources) + sorted((v for v in range(total) if layer[v] == 0), key=lambda v: v)
    starts += [v for v in range(total)]
    for s in starts:
        if pre[s] >= 0:
            continue
        stack = [s]
        while stack:
            v = stack.pop()
            if pre[v] >= 0:
                continue
            pre[v] = counter
            counter += 1
            for u in reversed(down[v]):
                if pre[u] < 0:
                    stack.append(u)
    rows: list[list[int]] = [[] for _ in range(nl)]
    for v in sorted(range(total), key=pre.__getitem__):
        rows[layer[v]].append(v)
    return rows


def _reduce_crossings(rows, up, down, iterations) -> tuple[list[list[int]], int]:
    pos = [0] * len(up)
    for row in rows:
        for i, v in enumerate(row):
            pos[v] = i
    best = [r[:] for r in rows]
    best_c = _count_crossings(rows, down, pos)
    stale = 0
    for it in range(iterations):
        if best_c == 0:
            break
        for rng, nbrs in ((range(1, len(rows)), up), (range(len(rows) - 2, -1, -1), down)):
            for lay in rng:
                row = rows[lay]
                if len(row) < 2:
                    continue
                keys = {}
                for v in row:
                    nb = nbrs[v]
                    keys[v] = (sum(pos[u] for u in nb) / len(nb), pos[v]) if nb else (pos[v], pos[v])
                row.sort(key=keys.__getitem__)
                for i, v in enumerate(row):
                    pos[v] = i
        c = _count_crossings(rows, down, pos)
        if c < best_c:
            best, best_c, stale = [r[:] for r in rows], c, 0
        else:
            stale += 1
            if stale >= 2:
                break
    return best, best_c


def _count_crossings(rows, down, pos) -> int:
    """Crossings between adjacent layers, counted as inversions with a Fenwick tree."""
    total = 0
    for lay in range(len(rows) - 1):
        row, below = rows[lay], rows[lay + 1]
        if len(row) < 2 or len(below) < 2:
            continue
        targets = []
        for v in row:
            targets.extend(sorted(pos[u] for u in down[v]))
        size = len(below)
        tree = [0] * (size + 1)
        seen = 0
        for t in targets:
            # edges already seen whose target lies right of t cross this one
            i, le = t + 1, 0
            while i > 0:
                le += tree[i]
                i -= i & -i
            total += seen - le
            i = t + 1
            while i <= size:
                tree[i] += 1
                i += i & -i
            seen += 1
    return total


def _assign_x(rows, up, down, w, is_dummy, iterations, node_gap: float = NODE_GAP) -> list[float]:
    total = len(w)
    xs = [0.0] * total
    seps: list[list[float]] = []
    for row in rows:
        sep = []
        for a, b in zip(row, row[1:]):
            da, db = is_dummy[a], is_dummy[b]
            gap = LANE_GAP if da and db else (node_gap if not (da or db) else min(MIXED_GAP, node_gap))
            sep.append((w[a] + w[b]) / 2 + gap)
        seps.append(sep)
        x = 0.0
        for i, v in enumerate(row):
            if i:
                x += sep[i - 1]
            xs[v] = x
        shift = x / 2
        for v in row:
            xs[v] -= shift
    weight_of = [2.0 if d else 1.0 for d in is_dummy]
    nrows = len(rows)
    for step in range(2 * iterations):
        if step % 2 == 0:
            moved = _pass(rows, range(1, nrows), up, xs, weight_of, seps)
        else:
            moved = _pass(rows, range(nrows - 2, -1, -1), down, xs, weight_of, seps)
            if moved < 0.5:
                break
    both = ([a + b for a, b in zip(up[0], down[0])], [a + b for a, b in zip(up[1], down[1])])
    _pass(rows, range(nrows), both, xs, weight_of, seps)
    return xs


def _pass(rows, lays, nbrs, xs, weight_of, seps) -> float:
    """Move each node of each layer towards the mean of its neighbours; returns the largest move.

    ``nbrs`` is (neighbours, deltas): a neighbour u pulls v's centre towards xs[u] + delta.
    """
    moved = 0.0
    nb_all, d_all = nbrs
    for lay in lays:
        row = rows[lay]
        want, wt = [], []
        for v in row:
            nb = nb_all[v]
            if nb:
                if len(nb) == 1:
                    want.append(xs[nb[0]] + d_all[v][0])
                else:
                    want.append(sum(xs[u] + d for u, d in zip(nb, d_all[v])) / len(nb))
                wt.append(weight_of[v] * len(nb))
            else:
                want.append(xs[v])
                wt.append(0.05)
        new = want if len(row) == 1 else _isotonic(want, wt, seps[lay])
        for v, x in zip(row, new):
            d = abs(x - xs[v])
            if d > moved:
                moved = d
            xs[v] = x
    return moved


def _isotonic(want, wt, sep) -> list[float]:
    """Weighted least-squares positions near ``want`` keeping x[i+1] - x[i] >= sep[i]."""
    k = len(want)
    if k == 1:
        return want
    off = [0.0] * k
    for i in range(1, k):
        off[i] = off[i - 1] + sep[i - 1]
    # pool adjacent violators on y = x - off, which must be non-decreasing
    vals, wts, cnt = [], [], []
    for i in range(k):
        vals.append(want[i] - off[i])
        wts.append(wt[i])
        cnt.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            w2 = wts[-2] + wts[-1]
            vals[-2] = (vals[-2] * wts[-2] + vals[-1] * wts[-1]) / w2
            wts[-2] = w2
            cnt[-2] += cnt[-1]
            vals.pop()
            wts.pop()
            cnt.pop()
    out = []
    i = 0
    for val, c in zip(vals, cnt):
        for _ in range(c):
            out.append(val + off[i])
            i += 1
    return out


def _assign_y(rows, h, nl, has_sources, has_sinks, gap: float = LAYER_GAP) -> tuple[list[float], float]:
    ys = [0.0] * len(h)
    y = 0.0
    prev_h = None
    for lay, row in enumerate(rows):
        band = max((h[v] for v in row), default=0.0)
        if prev_h is not None:
            port_row = (lay == 1 and has_sources) or (lay == nl - 1 and has_sinks)
            y += prev_h / 2 + (PORT_GAP if port_row else gap) + band / 2
        for v in row:
            ys[v] = y
        prev_h = band
    top = ys[rows[0][0]] - max(h[v] for v in rows[0]) / 2 if rows and rows[0] else 0.0
    for i in range(len(ys)):
        ys[i] -= top
    return ys, y - top + (prev_h or 0.0) / 2


def _routes(chains, flipped, xs, ys, w, h, layer, band, src_off, dst_off, anchors, n):
    """Polylines: straight down through layer bands, free only in the gaps between them."""
    # Where each edge leaves the bottom of its upper box and enters the top of its lower box.
    out_x: dict[int, float] = {}
    in_x: dict[int, float] = {}
    leaving: dict[int, list[int]] = {}
    entering: dict[int, list[int]] = {}
    for e, chain in enumerate(chains):
        a, b = chain[0], chain[-1]
        so, do = (dst_off[e], src_off[e]) if flipped[e] else (src_off[e], dst_off[e])
        if so is not None:
            out_x[e] = xs[a] + so
        else:
            leaving.setdefault(a, []).append(e)
        if do is not None:
            in_x[e] = xs[b] + do
        else:
            entering.setdefault(b, []).append(e)
    for groups, target, end in ((leaving, out_x, 1), (entering, in_x, -2)):
        for v, es in groups.items():
            cx, bw, bh = xs[v], w[v], h[v]
            if anchors is not None and v < n and anchors[v] is not None:
                dx, bw, bh = anchors[v]
                cx += dx
            if len(es) == 1:
                target[es[0]] = cx
                continue
            es.sort(key=lambda e: xs[chains[e][end]])
            span = min(0.6 * bw, max(bw - bh, 0.3 * bw))
            for k, e in enumerate(es):
                target[e] = cx - span / 2 + span * (k + 0.5) / len(es)
    routes = []
    for e, chain in enumerate(chains):
        a, b = chain[0], chain[-1]
        ha = h[a] if anchors is None or a >= n or anchors[a] is None else anchors[a][2]
        hb = h[b] if anchors is None or b >= n or anchors[b] is None else anchors[b][2]
        pts = [(out_x[e], ys[a] + ha / 2)]
        if band[layer[a]] > ha:
            pts.append((out_x[e], ys[a] + band[layer[a]] / 2))
        for d in chain[1:-1]:
            half = band[layer[d]] / 2
            pts.append((xs[d], ys[d] - half))
            if half > 0:
                pts.append((xs[d], ys[d] + half))
        if band[layer[b]] > hb:
            pts.append((in_x[e], ys[b] - band[layer[b]] / 2))
        pts.append((in_x[e], ys[b] - hb / 2))
        if flipped[e]:
            pts.reverse()
        routes.append(pts)
    return routes
