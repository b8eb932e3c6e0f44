"""The visible graph of a call: which boxes are drawn at a given fold, their labels, sizes,
containers and merged edges, and the in/out line of each folded group. Qt-free.

A fold costs what it shows: ``build_visible`` walks the module tree from the top and stops at
collapsed groups. ``prepare_folds`` computes ahead what the next fold will need.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.layout.boxes import text_size
from core.layout.groups import GroupInfo, group_info, node_index, short_label
from core.model.attrs import saved_label, shown_value, tensor_words
from core.model.nesting import nested_lines
from core.model.trace import CallInfo, NodeInfo, paused_gc
from core.model.values import format_shape


def node_label(call: CallInfo, node: NodeInfo) -> str:
    """``MulBackward0`` (with the script's tensor name below when known); leaves: name and shape."""
    if node.kind == "accumulate_grad":
        t = call.tensor(node.variable)
        name = short_label((t.name if t is not None and t.name else None) or node.label or "leaf")
        shape = format_shape(t.shape) if t is not None else ""
        return f"{name}\n{shape}" if shape else name
    lines = [short_label(node.name), short_label(node.label)] if node.label else [short_label(node.name)]
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
    """``x 8×64``: the script's name of the tensor ``node`` produced (when known) and its shape
    (``shape 8×64`` when unnamed)."""
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
    shape = shapes.get(node.id, "")
    return " ".join(s for s in (name, shape.removeprefix("shape ") if name else shape) if s)


def _listed(ids: list[str], words) -> str:
    """The first two known ``words(id)`` of ``ids``, then "+N" for the rest (unknown ones only
    counted); only those shown are named, as a folded part of a call can have 100,000 inputs."""
    known = []
    for n in ids:
        w = words(n)
        if w:
            known.append(w)
            if len(known) == 2:
                break
    if not known:
        return f"{len(ids)} tensor{'s' if len(ids) != 1 else ''}"
    return ", ".join(known) + (f" +{len(ids) - 2}" if len(ids) > 2 else "")


def boundary_line(call: CallInfo, g: str) -> str:
    """``in: x 8×64 · out: shape 8×64``: the tensors that cross the border of the folded group ``g``
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
        parts.append("in: " + _listed(list(ins), lambda n: _tensor_words(call, nodes[index[n]], shapes)))
    if outs:
        parts.append("out: " + _listed(list(outs), lambda n: _tensor_words(call, nodes[index[n]], shapes)))
    text = " \u00b7 ".join(parts) or "no inputs or outputs"
    return text if len(text) <= IO_CHARS else text[: IO_CHARS - 1] + "\u2026"


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
