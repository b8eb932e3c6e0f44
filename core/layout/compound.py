"""Layout of a call's grad_fn graph: root (the loss) on top, leaves below. Qt-free.

Module groups (``NodeInfo.module`` paths, like Model Explorer's namespaces) are laid out as
a compound graph: an expanded group is laid out on its own and then placed as one box in
its parent's layout, so group rectangles never cut through other nodes; edges cross a
group's border at ports on its top and bottom rows. A collapsed group is one box
(``group:<path>``) with its edges merged. Only groups whose nodes form a convex part of the
graph (no path leaves the group and comes back) get a box: a ModuleList whose residual
additions live in the parent would otherwise be a box drawn over unrelated nodes.
The boxes and their sizes are in ``core.layout.boxes``, what is drawn at a fold in
``core.layout.visible``; this module places them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from core.layout.boxes import (
    CHAR_W,
    DIRECTIONS,
    GROUP_BOTTOM,
    GROUP_LABEL,
    GROUP_PAD,
    LABEL_COLUMN_GAP,
    LABEL_ROW_GAP,
    LABELS,
    MARGIN,
    PAD_Y,
    ROOMY,
    SAVED_GAP,
    SAVED_H,
    SMALL_CHAR_W,
    EdgePath,
    GroupBox,
    Layout,
    NodeBox,
    SavedBox,
    Spacing,
    group_id,
    spacing_of,
    text_size,
)
from core.layout.dot import dot_available, layout_dot
from core.layout.groups import group_info
from core.layout.layered import layered
from core.layout.visible import Visible, build_visible
from core.model.anatomy import device_changes
from core.model.edge_marks import mark_text
from core.model.trace import CallInfo, paused_gc

log = logging.getLogger(__name__)


def layout_call(
    call: CallInfo,
    *,
    collapsed: frozenset[str] = frozenset(),
    show_saved: bool = False,
    engine: str = "auto",
    direction: str = "TB",
) -> Layout:
    """Lay out ``call``; ``engine`` is "auto"/"layered" (built in), "compact" or "compact-gaps"
    (built in, with the ``COMPACT`` or ``COMPACT_GAPS`` spacing of a slide) or "dot" (Graphviz, if
    installed); any of them with
    ``+labels`` when values are written along the edges (``Spacing.labels``: left to right, the
    built-in engine leaves them room).

    ``direction``: "TB" (the loss on top, arrows the way gradients flow), "LR" (the loss on the
    left) or "forward" (inputs on top, the loss at the bottom, arrows the way tensors flow, as
    forward diagrams draw them; the built-in engine only)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown direction {direction!r}: use one of {', '.join(DIRECTIONS)}")
    start = time.perf_counter()
    with paused_gc():
        vis = build_visible(call, frozenset(collapsed), show_saved)
        room = spacing_of(engine)
        if engine.removesuffix(LABELS) == "dot" and direction == "TB":
            if dot_available():
                return layout_dot(call, vis)
            log.warning("Graphviz dot is not installed; using the built-in layout")
        if room.pad_y != PAD_Y:
            vis.size = {v: text_size(vis.label[v], vis.kind[v], room.pad_y) for v in vis.ids}
        if direction == "LR":
            vis.saved = {}  # saved-tensor tabs sit beside nodes only in the top-down drawing
            vis.size = {v: (h, w) for v, (w, h) in vis.size.items()}
            lr_room = replace(room, layer_gap=_lr_gap(call, room),
                              node_gap=max(room.node_gap, LABEL_ROW_GAP) if room.labels else room.node_gap)
            out = _transposed(_compound(call, vis, lr=True, room=lr_room))
        elif direction == "forward":
            out = _forward(_compound(call, vis, top=GROUP_BOTTOM, bottom=GROUP_LABEL, room=room))
        else:
            out = _compound(call, vis, room=room)
    log.debug("layout of %d boxes in %.3f s", len(vis.ids), time.perf_counter() - start)
    return out


def _footprint(vis: Visible, v: str) -> tuple[tuple[float, float], tuple[float, float, float] | None]:
    w, h = vis.size[v]
    boxes = vis.saved.get(v)
    if not boxes:
        return (w, h), None
    sw = max(len(b[2]) * SMALL_CHAR_W + 12 for b in boxes)
    sh = len(boxes) * (SAVED_H + 3) - 3
    fw = w + SAVED_GAP + sw
    return (fw, max(h, sh)), (w / 2 - fw / 2, w, h)


def _is_port(x, side: str) -> bool:
    return isinstance(x, tuple) and x[0] == side


def _lr_gap(call: CallInfo, room: Spacing = ROOMY) -> float:
    """Left to right, labels sit above or below the edges that cross the gap between two columns:
    the gap is as wide as the widest label the call puts on an edge (broadcast, dtype and device
    marks), so that it fits between the columns instead of over a box; with values written along
    the edges (``room.labels``), at least ``LABEL_COLUMN_GAP``."""
    texts = [mark_text(m) for n in call.nodes if n.edge_marks for m in n.edge_marks]
    texts += [c.text for c in device_changes(call)]
    widest = max(map(len, texts), default=0) * SMALL_CHAR_W + 28
    return max(room.layer_gap, widest, LABEL_COLUMN_GAP if room.labels else 0.0)


def _compound(call: CallInfo, vis: Visible, lr: bool = False, top: float = GROUP_LABEL,
              bottom: float = GROUP_BOTTOM, room: Spacing = ROOMY) -> Layout:
    info = group_info(call)
    containers: list[str | None] = [None] + vis.groups
    chain: dict[str | None, tuple[str | None, ...]] = {None: (None,)}
    for g in vis.groups:
        chain[g] = chain[info.drawn_parent(g)] + (g,)

    def item_in(c, x):
        cx = vis.container[x]
        return x if cx == c else ("block", chain[cx][len(chain[c])])

    # Local edges per container and, for each visible edge, its segments in order.
    local: dict[str | None, dict[tuple, int]] = {c: {} for c in containers}
    segments: list[list[tuple]] = []
    seen: dict[tuple[str, str], int] = {}
    for u, v, _nr, _slot, _c in vis.edges:
        dup = seen[(u, v)] = seen.get((u, v), -1) + 1  # parallel edges (x * x) get their own routes
        cu, cv = chain[vis.container[u]], chain[vis.container[v]]
        k = 0
        while k < min(len(cu), len(cv)) and cu[k] == cv[k]:
            k += 1
        lca = cu[k - 1]
        # Each edge crosses a group's border at its own port.
        out, inp = ("out", u, v, dup), ("in", u, v, dup)
        segs = []
        for g in reversed(cu[k:]):
            a = item_in(g, u)
            segs.append((g, a, out if isinstance(a, tuple) else None, out, None))
        a, b = item_in(lca, u), item_in(lca, v)
        segs.append((lca, a, out if isinstance(a, tuple) else dup, b, inp if isinstance(b, tuple) else None))
        for g in cv[k:]:
            b = item_in(g, v)
            segs.append((g, inp, None, b, inp if isinstance(b, tuple) else None))
        for key in segs:
            local[key[0]].setdefault(key[1:], len(local[key[0]]))
        segments.append(segs)

    members_of: dict[str | None, list[str]] = {c: [] for c in containers}
    for x in vis.ids:
        members_of[vis.container[x]].append(x)
    child_blocks: dict[str | None, list] = {c: [] for c in containers}
    for g in vis.groups:
        child_blocks[info.drawn_parent(g)].append(("block", g))
    blocks: dict[str, dict] = {}  # drawn group -> size, ports, local result
    memo: dict[tuple, object] = {}
    fast = len(vis.ids) > 1500
    results: dict[str | None, tuple] = {}
    crossings = 0
    for c in reversed(containers):
        items: list = list(members_of[c]) + child_blocks[c]
        ports_in = sorted({k[0] for k in local[c] if _is_port(k[0], "in")}, key=str)
        ports_out = sorted({k[2] for k in local[c] if _is_port(k[2], "out")}, key=str)
        if c is None:
            ports_in, ports_out = [], []
        order = items + ports_in + ports_out
        index = {x: i for i, x in enumerate(order)}
        sizes, anchors = [], []
        for x in order:
            if isinstance(x, tuple):
                sizes.append(blocks[x[1]]["size"] if x[0] == "block" else (0.0, 0.0))
                anchors.append(None)
            else:
                s, a = _footprint(vis, x)
                sizes.append(s)
                anchors.append(a)
        keys = sorted(local[c], key=local[c].get)
        edges, so, do = [], [], []
        for a, ap, b, bp in keys:
            edges.append((index[a], index[b]))
            so.append(blocks[a[1]]["ports"][ap] if isinstance(ap, tuple) else None)
            do.append(blocks[b[1]]["ports"][bp] if bp is not None else None)
        # Repeated blocks (the layers of a network) share one layout.
        args = (tuple(sizes), tuple(edges), tuple(index[p] for p in ports_in), tuple(index[p] for p in ports_out))
        key = args + (tuple(so), tuple(do), tuple(anchors))
        res = memo.get(key)
        if res is None:
            res = memo[key] = layered(
                *args[:2], sources=args[2], sinks=args[3], src_off=so, dst_off=do, anchors=anchors, fast=fast,
                gap=room.layer_gap, node_gap=room.node_gap,
            )
        crossings += res.crossings
        results[c] = (order, index, keys, res)
        if c is not None:
            parent = info.drawn_parent(c)
            text = info.title(c, parent)
            if info.class_of(c):
                text += f" \u00b7 {info.class_of(c)}"
            tw = len(text) * CHAR_W + 2 * GROUP_PAD
            if lr:  # layout space is the drawing transposed: the title band is on the left here
                bw, bh = res.width + GROUP_LABEL + GROUP_BOTTOM, max(res.height + 2 * GROUP_PAD, tw)
                dx, dy = GROUP_LABEL, (bh - res.height) / 2
            else:
                bw, bh = max(res.width + 2 * GROUP_PAD, tw), res.height + top + bottom
                dx, dy = (bw - res.width) / 2, top
            ports = {p: res.xs[index[p]] + dx - bw / 2 for p in ports_in + ports_out}
            blocks[c] = {"size": (bw, bh), "ports": ports, "dx": dx, "dy": dy, "label": text}

    # Place containers top-down: content offset of each.
    offset: dict[str | None, tuple[float, float]] = {None: (MARGIN, MARGIN)}
    rect: dict[str, tuple[float, float, float, float]] = {}
    for c in containers:
        order, index, keys, res = results[c]
        ox, oy = offset[c]
        for x in order:
            if isinstance(x, tuple) and x[0] == "block":
                bw, bh = blocks[x[1]]["size"]
                cx, cy = ox + res.xs[index[x]], oy + res.ys[index[x]]
                rect[x[1]] = (cx - bw / 2, cy - bh / 2, bw, bh)
                offset[x[1]] = (cx - bw / 2 + blocks[x[1]]["dx"], cy - bh / 2 + blocks[x[1]]["dy"])

    nodes_xywh: dict[str, tuple[float, float, float, float]] = {}
    saved_boxes: list[SavedBox] = []
    for c in containers:
        order, index, keys, res = results[c]
        ox, oy = offset[c]
        for x in order:
            if isinstance(x, tuple):
                continue
            (fw, fh), _ = _footprint(vis, x)
            w, h = vis.size[x]
            left = ox + res.xs[index[x]] - fw / 2
            cy = oy + res.ys[index[x]]
            nodes_xywh[x] = (left, cy - h / 2, w, h)
            boxes = vis.saved.get(x, [])
            sy = cy - (len(boxes) * (SAVED_H + 3) - 3) / 2
            for name, tensor, text, state in boxes:
                sw = len(text) * SMALL_CHAR_W + 12
                saved_boxes.append(SavedBox(x, name, tensor, left + w + SAVED_GAP, sy, sw, SAVED_H, text, state))
                sy += SAVED_H + 3

    rows = sorted({round(y + h / 2, 1) for (_, y, _, h) in nodes_xywh.values()})
    row_of = {y: i for i, y in enumerate(rows)}
    nodes = {
        v: NodeBox(v, x, y, w, h, row_of[round(y + h / 2, 1)], vis.label[v], vis.kind[v])
        for v in vis.ids
        for (x, y, w, h) in (nodes_xywh[v],)
    }

    edges: list[EdgePath] = []
    for (u, v, nr, slot, count), segs in zip(vis.edges, segments):
        pts: list[tuple[float, float]] = []
        for c, a, ap, b, bp in segs:
            order, index, keys, res = results[c]
            ox, oy = offset[c]
            route = [(x + ox, y + oy) for x, y in res.routes[local[c][(a, ap, b, bp)]]]
            if c is not None and a[0] == "in":
                route.insert(0, (route[0][0], rect[c][1]))
            if c is not None and b[0] == "out":
                route.append((route[-1][0], rect[c][1] + rect[c][3]))
            for p in route:
                if not pts or abs(pts[-1][0] - p[0]) > 0.01 or abs(pts[-1][1] - p[1]) > 0.01:
                    pts.append(p)
        edges.append(EdgePath(u, v, nr, pts, slot, count))

    groups = [GroupBox(g, *rect[g], False, info.count[g], blocks[g]["label"], len(chain[g]) - 2) for g in vis.groups]
    for path, count in vis.collapsed.items():
        x, y, w, h = nodes_xywh[group_id(path)]
        depth = len(chain[vis.container[group_id(path)]]) - 1
        groups.append(GroupBox(path, x, y, w, h, True, count, path, depth))
    _, _, _, root = results[None]
    width = root.width + 2 * MARGIN
    height = root.height + 2 * MARGIN
    return Layout(nodes, edges, groups, width, height, saved_boxes, vis.members, "layered", crossings)


def _transposed(lay: Layout) -> Layout:
    """A layout made with swapped box sizes, turned into left-to-right (x and y swap back)."""
    nodes = {}
    for v, b in lay.nodes.items():
        w, h = b.h, b.w  # the real size; the layout space held it transposed
        cx, cy = b.y + b.h / 2, b.x + b.w / 2
        nodes[v] = replace(b, x=cx - w / 2, y=cy - h / 2, w=w, h=h)
    edges = [replace(e, points=[(y, x) for x, y in e.points]) for e in lay.edges]
    groups = [replace(g, x=g.y, y=g.x, w=g.h, h=g.w) for g in lay.groups]
    return replace(lay, nodes=nodes, edges=edges, groups=groups, width=lay.height, height=lay.width,
                   direction="LR")


def _forward(lay: Layout) -> Layout:
    """Leaves on top, the loss at the bottom, points running from input to consumer."""
    H = lay.height
    nodes = {v: replace(b, y=H - b.y - b.h) for v, b in lay.nodes.items()}
    edges = [replace(e, points=[(x, H - y) for x, y in reversed(e.points)]) for e in lay.edges]
    groups = [replace(g, y=H - g.y - g.h) for g in lay.groups]
    saved = [replace(sv, y=H - sv.y - sv.h) for sv in lay.saved]
    return replace(lay, nodes=nodes, edges=edges, groups=groups, saved=saved, direction="forward")
