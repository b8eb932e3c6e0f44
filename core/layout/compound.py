"""Layout of a call's grad_fn graph: root (the loss) on top, leaves below. Qt-free.

Module groups (``NodeInfo.module`` paths, like Model Explorer's namespaces) are laid out as
a compound graph: an expanded group is laid out on its own and then placed as one box in
its parent's layout, so group rectangles never cut through other nodes; edges cross a
group's border at ports on its top and bottom rows. A collapsed group is one box
(``group:<path>``) with its edges merged. Only groups whose nodes form a convex part of the
graph (no path leaves the group and comes back) get a box: a ModuleList whose residual
additions live in the parent would otherwise be a box drawn over unrelated nodes.
Sizes are estimated from character counts (7 px a character at an 11 px font).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace

from core.model.attrs import saved_label, shown_value, tensor_words
from core.layout.groups import GroupInfo, default_collapsed, group_info, node_index, paused_gc  # noqa: F401 - public API
from core.layout.layered import LAYER_GAP, layered
from core.model.nesting import nested_lines
from core.model.trace import CallInfo, NodeInfo

log = logging.getLogger(__name__)

CHAR_W = 7.0
SMALL_CHAR_W = 5.8
LINE_H = 15.0
PAD_X = 12.0
PAD_Y = 8.0
MIN_W = 64.0
SAVED_H = 17.0
SAVED_GAP = 8.0
GROUP_PAD = 12.0
GROUP_LABEL = 22.0
GROUP_BOTTOM = 12.0
MARGIN = 24.0
DIRECTIONS = ("TB", "LR", "forward")


@dataclass(frozen=True)
class NodeBox:
    """A drawn box; x, y is the top-left corner. ``layer`` is the row counted from the top."""

    id: str
    x: float
    y: float
    w: float
    h: float
    layer: int
    label: str
    kind: str  # a NodeInfo kind, or "group" for a collapsed group


@dataclass(frozen=True)
class EdgePath:
    """An edge from a node to one of its next_functions; points run from src to dst."""

    src: str
    dst: str
    input_nr: int
    points: list[tuple[float, float]]
    slot: int = 0  # index in the source's ``next`` list
    count: int = 1  # trace edges merged into this one (collapsed groups)


@dataclass(frozen=True)
class GroupBox:
    path: str
    x: float
    y: float
    w: float
    h: float
    collapsed: bool
    count: int  # trace nodes inside
    label: str = ""  # the path relative to the enclosing drawn group
    depth: int = 0  # nesting depth among drawn groups


@dataclass(frozen=True)
class SavedBox:
    """A tensor saved for backward, drawn beside its node."""

    node: str
    name: str
    tensor: str | None
    x: float
    y: float
    w: float
    h: float
    label: str
    state: str = "saved"  # "saved", "freed" or "stale"


@dataclass(frozen=True)
class Layout:
    nodes: dict[str, NodeBox]
    edges: list[EdgePath]
    groups: list[GroupBox]
    width: float
    height: float
    saved: list[SavedBox] = field(default_factory=list)
    members: dict[str, str] = field(default_factory=dict)  # trace node id -> drawn box id
    engine: str = "layered"
    crossings: int = 0
    direction: str = "TB"  # "TB", "LR" or "forward" (edge points then run from input to consumer)


def format_shape(shape) -> str:
    if shape is None:
        return ""
    return "scalar" if len(shape) == 0 else "[" + ", ".join(str(s) for s in shape) + "]"


def node_label(call: CallInfo, node: NodeInfo) -> str:
    """``MulBackward0`` (with the script's tensor name below when known); leaves: name and shape."""
    if node.kind == "accumulate_grad":
        t = call.tensor(node.variable)
        name = (t.name if t is not None and t.name else None) or node.label or "leaf"
        shape = format_shape(t.shape) if t is not None else ""
        return f"{name}\n{shape}" if shape else name
    lines = [node.name, node.label] if node.label else [node.name]
    return "\n".join(lines + nested_lines(call, node))  # a checkpoint node lists the backward run inside it


IO_CHARS = 44  # the in/out line of a folded group is cut to this many characters


def edge_shapes(call: CallInfo) -> dict[str, str]:
    """Shape of the tensor each node produced: the gradient flowing into it has that shape.
    Kept on the call (it is immutable): every fold of a big graph asks again."""
    cached = call.__dict__.get("_edge_shapes")
    if cached is None:
        cached = _edge_shapes(call)
        object.__setattr__(call, "_edge_shapes", cached)
    return cached


def _edge_shapes(call: CallInfo) -> dict[str, str]:
    out: dict[str, str] = {}
    text: dict[tuple, str] = {}
    for t in call.tensors:
        if t.grad_fn is not None and t.grad_fn not in out:
            key = tuple(t.shape)
            out[t.grad_fn] = text.get(key) or text.setdefault(key, format_shape(t.shape))
    tensors = call.tensor_map()
    for n in call.nodes:
        t = tensors.get(n.variable or n.tensor)
        if t is not None:
            key = tuple(t.shape)
            out[n.id] = text.get(key) or text.setdefault(key, format_shape(t.shape))
    return out


def _tensor_words(call: CallInfo, node: NodeInfo, shapes: dict[str, str]) -> str:
    """``x [8, 64]``: the script's name of the tensor ``node`` produced (when known) and its shape."""
    name = node.label
    if node.kind == "accumulate_grad":
        t = call.tensor(node.variable)
        name = (t.name if t is not None else None) or name
    if name and len(name) > 16:  # transformer.wte.weight -> …wte.weight
        tail = name.split(".")[-1]
        for part in reversed(name.split(".")[:-1]):
            if len(part) + len(tail) >= 15:
                break
            tail = part + "." + tail
        name = "\u2026" + tail[-15:]
    return " ".join(s for s in (name, shapes.get(node.id, "")) if s)


def _listed(words: list[str]) -> str:
    """The first two known tensors, then "+N" for the rest (unknown ones only counted)."""
    known = [w for w in words if w]
    if not known:
        return f"{len(words)} tensor{'s' if len(words) != 1 else ''}"
    return ", ".join(known[:2]) + (f" +{len(words) - 2}" if len(words) > 2 else "")


def boundary_line(call: CallInfo, g: str) -> str:
    """``in: x [8, 64] · out: [8, 64]``: the tensors that cross the border of the folded group ``g``
    in the forward sense (at most two each, then "+N"), from its cached border edges (kept)."""
    info = group_info(call)
    hit = info.lines.get(g)
    if hit is None:
        hit = info.lines[g] = _boundary_line(call, info, g)
    return hit


PREPARE_FROM = 2000  # smaller calls fold fast without preparing


def prepare_folds(call: CallInfo, collapsed, stop=None) -> int:
    """Compute ahead what the next fold or unfold of ``call`` (folded at ``collapsed``) will need:
    its groups' borders, members and folded-box texts. Meant for the layout thread, right after
    a layout is shown and before the user folds; ``stop()`` true ends it early. Returns how many
    groups it prepared."""
    if len(call.nodes) < PREPARE_FROM:
        return 0
    with paused_gc():
        groups = group_info(call).prepare(collapsed, stop=stop)
        edge_shapes(call)
        for i, g in enumerate(groups):
            if stop is not None and i % 64 == 0 and stop():
                return i
            boundary_line(call, g)
    return len(groups)


def _boundary_line(call: CallInfo, info: GroupInfo, g: str) -> str:
    nodes, shapes, index = call.nodes, edge_shapes(call), node_index(call)
    ins: dict[str, None] = {}  # outside nodes the group reads, in node order
    for i, slot in info.leaving(g):
        ins.setdefault(nodes[i].next[slot].node)
    outs: dict[str, None] = {}  # inside nodes read from outside
    for i, slot in info.entering(g):
        outs.setdefault(nodes[i].next[slot].node)
    parts = []
    if ins:
        parts.append("in: " + _listed([_tensor_words(call, nodes[index[n]], shapes) for n in ins]))
    if outs:
        parts.append("out: " + _listed([_tensor_words(call, nodes[index[n]], shapes) for n in outs]))
    text = " \u00b7 ".join(parts) or "no inputs or outputs"
    return text if len(text) <= IO_CHARS else text[: IO_CHARS - 1] + "\u2026"


def group_id(path: str) -> str:
    return "group:" + path


def text_size(label: str, kind: str) -> tuple[float, float]:
    lines = label.split("\n")
    w = max(MIN_W, max(len(s) for s in lines) * CHAR_W + 2 * PAD_X)
    h = len(lines) * LINE_H + 2 * PAD_Y
    if kind == "accumulate_grad":
        w += h * 0.5  # rounded ends
    return w, h


# -- the visible graph ------------------------------------------------------------------------


@dataclass
class Visible:
    """What is drawn: boxes, merged edges and the container (drawn group) of each box."""

    ids: list[str]
    kind: dict[str, str]
    label: dict[str, str]
    size: dict[str, tuple[float, float]]
    container: dict[str, str | None]
    edges: list[tuple[str, str, int, int, int]]  # src, dst, input_nr, slot, count
    members: dict[str, str]
    groups: list[str]  # expanded drawn groups, parents before children
    collapsed: dict[str, int]  # collapsed group path -> trace nodes inside
    saved: dict[str, list[tuple[str, str | None, str, str]]]  # node -> (name, tensor, label, state)


def build_visible(call: CallInfo, collapsed: frozenset[str], show_saved: bool) -> Visible:
    """Walks the module tree from the top and stops at collapsed groups: a fold costs what it
    shows (its boxes and the edges that cross folded groups' borders), not the call's size."""
    info = group_info(call)
    nodes = call.nodes
    members: dict[str, str] = {}
    container: dict[str, str | None] = {}
    kind: dict[str, str] = {}
    label: dict[str, str] = {}
    coll: dict[str, int] = {}
    units: list[tuple[int, int, str]] = []  # (first node index, 0 node / 1 box, module or group)
    open_nodes: list[int] = []
    stack: list[tuple[str | None, str | None]] = [(None, None)]  # (group, its container)
    children = info.children
    while stack:
        g, outer = stack.pop()
        if g is not None and g in collapsed:
            vid = "group:" + g
            members.update(info.member_map(g))
            container[vid] = outer
            kind[vid] = "group"
            coll[g] = info.count[g]
            cls = info.class_of(g)
            held = info.count[g]
            label[vid] = f"{info.title(g)}\n{cls + ' · ' if cls else ''}{held:,} node{'s' if held != 1 else ''}\n{boundary_line(call, g)}"
            units.append((info.first(g), 1, g))
            continue
        inner = g if g is not None and info.is_drawn(g) else outer
        for i in info.own.get(g, ()):
            n = nodes[i]
            members[n.id] = n.id
            container[n.id] = inner
            kind[n.id] = n.kind
            label[n.id] = node_label(call, n)
            open_nodes.append(i)
        stack.extend((c, inner) for c in children.get(g, ()))
    units.extend((i, 0, "") for i in open_nodes)
    units.sort()
    ids = [nodes[i].id if box == 0 else "group:" + g for i, box, g in units]
    # Edges in node order: the open nodes' own, and those leaving each folded group.
    sources = [(i, s) for i in open_nodes for s in range(len(nodes[i].next))]
    for g in coll:
        sources.extend(info.leaving(g))
    sources.sort()
    edges: list[tuple[str, str, int, int, int]] = []
    merged: dict[tuple[str, str], int] = {}
    boxes = {"group:" + g for g in coll}
    for i, slot in sources:
        n = nodes[i]
        e = n.next[slot]
        if e is None:
            continue
        u, v = members[n.id], members[e.node]
        if u == v:
            continue
        if u in boxes or v in boxes:
            k = merged.get((u, v))
            if k is not None:
                s, d, nr, sl, c = edges[k]
                edges[k] = (s, d, nr, sl, c + 1)
                continue
            merged[(u, v)] = len(edges)
        edges.append((u, v, e.input_nr, slot, 1))
    used: set[str] = set()
    for c in container.values():
        while c is not None and c not in used:
            used.add(c)
            c = info.drawn_parent(c)
    groups = sorted(used, key=lambda g: (len(info.ancestors[g]), g))  # parents first
    saved = _saved_boxes(call, kind) if show_saved else {}
    size = {v: text_size(label[v], kind[v]) for v in ids}
    return Visible(ids, kind, label, size, container, edges, members, groups, coll, saved)


def open_nodes(call: CallInfo, layout) -> list:
    """The nodes drawn as their own boxes in ``layout`` (not folded into a group), in call order:
    what a fold draws marks for, without walking the whole call."""
    index = node_index(call)
    found = sorted(index[v] for v in layout.nodes if v in index)
    return [call.nodes[i] for i in found]


def _saved_boxes(call: CallInfo, kind: dict[str, str]) -> dict[str, list]:
    out: dict[str, list] = {}
    for nid, k in kind.items():
        if k == "group":
            continue
        n = call.node(nid)
        boxes = []
        for s in n.saved:
            if s.tensor is not None:
                t = call.tensor(s.tensor)
                text = f"{s.name} = {t.name}" if t is not None and t.name else \
                    f"{s.name} = {tensor_words(t)}" if t is not None and t.grad_fn_name else \
                    f"{s.name} {format_shape(t.shape) if t else ''}".strip()
                boxes.append((s.name, s.tensor, text, "saved"))
            elif shown_value(s):
                boxes.append((s.name, None, saved_label(call, s), "value"))
            elif s.freed:
                boxes.append((s.name, None, f"{s.name} freed", "freed"))
            elif s.value == "stale":
                boxes.append((s.name, None, f"{s.name} stale", "stale"))
        if boxes:
            out[n.id] = boxes
    return out


# -- the compound layered layout --------------------------------------------------------------


def layout_call(
    call: CallInfo,
    *,
    collapsed: frozenset[str] = frozenset(),
    show_saved: bool = False,
    engine: str = "auto",
    direction: str = "TB",
) -> Layout:
    """Lay out ``call``; ``engine`` is "auto"/"layered" (built in) or "dot" (Graphviz, if installed).

    ``direction``: "TB" (the loss on top, arrows the way gradients flow), "LR" (the loss on the
    left) or "forward" (inputs on top, the loss at the bottom, arrows the way tensors flow, as
    forward diagrams draw them; the built-in engine only)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown direction {direction!r}: use one of {', '.join(DIRECTIONS)}")
    start = time.perf_counter()
    with paused_gc():
        vis = build_visible(call, frozenset(collapsed), show_saved)
        if engine == "dot" and direction == "TB":
            from core.layout.dot import dot_available, layout_dot

            if dot_available():
                return layout_dot(call, vis)
            log.warning("Graphviz dot is not installed; using the built-in layout")
        if direction == "LR":
            vis.saved = {}  # saved-tensor tabs sit beside nodes only in the top-down drawing
            vis.size = {v: (h, w) for v, (w, h) in vis.size.items()}
            out = _transposed(_compound(call, vis, lr=True, gap=_lr_gap(call)))
        elif direction == "forward":
            out = _forward(_compound(call, vis, top=GROUP_BOTTOM, bottom=GROUP_LABEL))
        else:
            out = _compound(call, vis)
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


def _lr_gap(call: CallInfo) -> float:
    """Left to right, labels sit above or below the edges that cross the gap between two columns:
    the gap is as wide as the widest label the call puts on an edge (broadcast, dtype and device
    marks), so that it fits between the columns instead of over a box."""
    from core.model.anatomy import device_changes
    from core.model.edge_marks import mark_text

    texts = [mark_text(m) for n in call.nodes if n.edge_marks for m in n.edge_marks]
    texts += [c.text for c in device_changes(call)]
    widest = max(map(len, texts), default=0) * SMALL_CHAR_W + 28
    return max(LAYER_GAP, widest)


def _compound(call: CallInfo, vis: Visible, lr: bool = False, top: float = GROUP_LABEL,
              bottom: float = GROUP_BOTTOM, gap: float = LAYER_GAP) -> Layout:
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
                *args[:2], sources=args[2], sinks=args[3], src_off=so, dst_off=do, anchors=anchors, fast=fast, gap=gap
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
