"""Graphviz DOT source for a call's graph, drawn as the graph view draws it. Qt-free.

The boxes, labels, merged edges and module clusters come from ``core.layout.visible.build_visible``,
so a DOT export matches the view (collapsed groups are one box, only convex module groups
get a cluster). Kinds differ by shape and line style, so a greyscale print still tells
them apart; the palettes repeat the Qt themes' colours because ``core`` never imports Qt.
"""

from __future__ import annotations

from core.model.causes import blamed_nodes
from core.layout.groups import group_info
from core.layout.visible import build_visible
from core.model.step_state import box_states
from core.model.trace import CallInfo

_COMMON = {
    "font": "DejaVu Sans",
    "edge_width": 1.2,
}

PALETTES: dict[str, dict[str, str]] = {
    "print": {
        "background": "#ffffff", "text": "#000000", "muted_text": "#444444",
        "op_fill": "#ffffff", "op_border": "#000000", "leaf_fill": "#e6e6e6", "leaf_border": "#000000",
        "custom_fill": "#ffffff", "custom_border": "#000000", "other_fill": "#f2f2f2", "other_border": "#000000",
        "no_grad_fill": "#ffffff", "no_grad_border": "#666666", "group_fill": "#d9d9d9", "group_border": "#000000",
        "group_box_fill": "#f7f7f7", "group_box_border": "#888888", "group_text": "#000000",
        "edge": "#333333", "edge_text": "#000000", "error": "#000000", "error_fill": "#bfbfbf",
        "executed_fill": "#d0d0d0", "current": "#000000", "frontier": "#444444", "failed": "#000000",
    },
    "light": {
        "background": "#fbfbf8", "text": "#1f2328", "muted_text": "#5b636e",
        "op_fill": "#dde9f8", "op_border": "#3a6ea5", "leaf_fill": "#dcf0d5", "leaf_border": "#3f8a36",
        "custom_fill": "#efe3f7", "custom_border": "#7b4fa6", "other_fill": "#eeeeee", "other_border": "#6e6e6e",
        "no_grad_fill": "#f4f4f2", "no_grad_border": "#9a9a9a", "group_fill": "#f7ecd3", "group_border": "#a87b2c",
        "group_box_fill": "#f3efe6", "group_box_border": "#c8b999", "group_text": "#7a5a1e",
        "edge": "#6b7785", "edge_text": "#3d4650", "error": "#c62828", "error_fill": "#fde4e2",
        "executed_fill": "#e3e3e3", "current": "#e8590c", "frontier": "#1971c2", "failed": "#c62828",
    },
    "dark": {
        "background": "#1e1f22", "text": "#e6e6e6", "muted_text": "#a0a6ad",
        "op_fill": "#263a52", "op_border": "#79a8e0", "leaf_fill": "#243d27", "leaf_border": "#7cc46f",
        "custom_fill": "#3a2b4a", "custom_border": "#b894dc", "other_fill": "#333333", "other_border": "#9a9a9a",
        "no_grad_fill": "#2a2a2a", "no_grad_border": "#808080", "group_fill": "#45391f", "group_border": "#d4a948",
        "group_box_fill": "#26251f", "group_box_border": "#5f5a48", "group_text": "#d9bb75",
        "edge": "#8c96a3", "edge_text": "#c2c8cf", "error": "#ff6b6b", "error_fill": "#4a2426",
        "executed_fill": "#3a3a3a", "current": "#ff922b", "frontier": "#74c0fc", "failed": "#ff6b6b",
    },
}

LEGEND_TEXT = {
    "backward": "backward op",
    "accumulate_grad": "leaf tensor (AccumulateGrad)",
    "custom": "custom Function",
    "other": "other node",
    "group": "collapsed module",
    "no_grad": "does not require grad",
    "error": "raised an error",
    "executed": "executed",
    "current": "running now",
    "frontier": "ready to run",
    "failed": "failed",
}


def quote(text: str) -> str:
    """A DOT double-quoted string; newlines become centred line breaks."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _attrs(**kw) -> str:
    parts = []
    for key, value in kw.items():
        if value is None:
            continue
        parts.append(f"{key}={value if isinstance(value, (int, float)) else quote(str(value))}")
    return "[" + ", ".join(parts) + "]"


def _node_attrs(kind: str, pal: dict, *, no_grad=False, error=False, state=None) -> dict:
    """Shape, style and colours for one box; line style and shape carry the kind, colour repeats it."""
    shape, style = "box", ["rounded", "filled"]
    fill, border = pal["op_fill"], pal["op_border"]
    width = 1.0
    if kind == "accumulate_grad":
        shape, style = "ellipse", ["filled"]
        fill, border = pal["leaf_fill"], pal["leaf_border"]
    elif kind == "custom":
        style.append("dashed")
        fill, border = pal["custom_fill"], pal["custom_border"]
    elif kind == "group":
        shape, style = "box3d", ["filled"]
        fill, border = pal["group_fill"], pal["group_border"]
        width = 1.4
    elif kind != "backward":
        style = ["filled"]
        fill, border = pal["other_fill"], pal["other_border"]
    font = pal["text"]
    if no_grad:
        fill, border, font = pal["no_grad_fill"], pal["no_grad_border"], pal["muted_text"]
        style.append("dotted")
    peripheries = None
    if state == "executed":
        fill, font = pal["executed_fill"], pal["muted_text"]
    elif state == "current":
        border, width = pal["current"], 3.0
    elif state == "frontier":
        border, peripheries = pal["frontier"], 2
    if error or state == "failed":
        border, fill, width = pal["failed" if state == "failed" else "error"], pal["error_fill"], 2.5
        style.append("bold")
    return {
        "shape": shape,
        "style": ",".join(style),
        "fillcolor": fill,
        "color": border,
        "fontcolor": font,
        "penwidth": width,
        "peripheries": peripheries,
    }


def call_to_dot(
    call: CallInfo,
    *,
    title: str | None = None,
    collapsed: frozenset[str] = frozenset(),
    states: dict[str, str] | None = None,
    edge_texts: dict[tuple[str, str], str] | None = None,
    theme: str = "print",
    legend: bool = True,
) -> str:
    """Graphviz source: one node per drawn box (trace ids, ``group:<path>`` for collapsed
    groups), every edge from a node to its ``next`` entries (the way gradients flow, root on
    top), module clusters, a legend cluster and ``title`` as the graph label."""
    pal = PALETTES.get(theme, PALETTES["print"])
    vis = build_visible(call, frozenset(collapsed or ()), False)
    info = group_info(call)
    states = states or {}
    blamed = blamed_nodes(call)
    failed_call = call.error is not None and blamed is None
    font = _COMMON["font"]
    out = [f"digraph {quote('call_' + str(call.index))} {{"]
    graph = {"rankdir": "TB", "bgcolor": pal["background"], "fontname": font, "fontcolor": pal["text"],
             "nodesep": 0.3, "ranksep": 0.45}
    if title:
        graph.update(label=title, labelloc="t", labeljust="c", fontsize=18)
    out.append("  graph " + _attrs(**graph) + ";")
    out.append("  node " + _attrs(fontname=font, fontsize=11, margin="0.15,0.06", height=0.4) + ";")
    out.append("  edge " + _attrs(color=pal["edge"], fontcolor=pal["edge_text"], fontname=font, fontsize=9,
                                  arrowsize=0.7, penwidth=_COMMON["edge_width"]) + ";")

    box_state = box_states(states, vis.members, {"group:" + g: c for g, c in vis.collapsed.items()})
    texts = {(vis.members.get(s, s), vis.members.get(d, d)): text for (s, d), text in (edge_texts or {}).items()}
    present: dict[str, None] = {}
    lines: dict[str | None, list[str]] = {}
    for vid in vis.ids:
        kind = vis.kind[vid]
        no_grad = error = False
        if kind == "group":
            error = failed_call
        else:
            node = call.node(vid)
            t = call.tensor(node.variable or node.tensor)
            no_grad = t is not None and not t.requires_grad
            error = node.stale is not None or failed_call or (blamed is not None and node.id in blamed)
        state = box_state.get(vid)
        present[kind if kind in LEGEND_TEXT else "other"] = None
        for flag, key in ((no_grad, "no_grad"), (error, "error"), (state is not None, state)):
            if flag:
                present[key] = None
        attrs = _node_attrs(kind, pal, no_grad=no_grad, error=error, state=state)
        lines.setdefault(vis.container[vid], []).append(f"{quote(vid)} {_attrs(label=vis.label[vid], **attrs)};")

    _write_clusters(out, vis, info, lines, pal)

    inputs: dict[str, set[int]] = {}
    for _u, v, nr, _slot, _count in vis.edges:
        inputs.setdefault(v, set()).add(nr)
    for u, v, nr, _slot, count in vis.edges:
        parts = []
        if len(inputs[v]) > 1:
            parts.append(f"#{nr}")
        if count > 1:
            parts.append(f"\u00d7{count}")
        text = texts.get((u, v))
        if text:
            parts.append(text)
        attrs = {"label": "  ".join(parts) if parts else None}
        if count > 1:
            attrs["penwidth"] = round(_COMMON["edge_width"] * (1 + 0.35 * min(count - 1, 3)), 2)
        out.append(f"  {quote(u)} -> {quote(v)}" + (" " + _attrs(**attrs) if any(attrs.values()) else "") + ";")

    if legend and present:
        _write_legend(out, list(present), pal)
    out.append("}")
    return "\n".join(out) + "\n"


def _write_clusters(out: list[str], vis, info, lines: dict, pal: dict) -> None:
    """Nested ``subgraph cluster_N`` blocks, one per expanded drawn module group."""
    children: dict[str | None, list[str]] = {}
    for g in vis.groups:
        children.setdefault(info.drawn_parent(g), []).append(g)
    names = {g: f"cluster_{i}" for i, g in enumerate(vis.groups)}
    stack: list[tuple[str | None, int, bool]] = [(None, 1, False)]
    while stack:
        g, depth, closing = stack.pop()
        pad = "  " * depth
        if closing:
            out.append(pad + "}")
            continue
        if g is not None:
            parent = info.drawn_parent(g)
            label = g if parent is None else g[len(parent) + 1:]
            out.append(f"{pad}subgraph {names[g]} {{")
            attrs = _attrs(label=label, style="rounded,filled", fillcolor=pal["group_box_fill"],
                           color=pal["group_box_border"], fontcolor=pal["group_text"], fontsize=10,
                           labeljust="l", id=g)
            out.append(f"{pad}  graph {attrs};")
            stack.append((g, depth, True))
        inner = "  " * (depth + (g is not None))
        for line in lines.get(g, []):
            out.append(inner + line)
        for child in reversed(children.get(g, [])):
            stack.append((child, depth + (g is not None), False))


def _write_legend(out: list[str], keys: list[str], pal: dict) -> None:
    out.append("  subgraph cluster_legend {")
    out.append("    " + _attrs(label="Legend", style="rounded", color=pal["group_box_border"],
                                fontcolor=pal["text"], fontsize=10, labeljust="l").join(("graph ", ";")))
    order = [k for k in LEGEND_TEXT if k in keys]
    for key in order:
        kind = key if key in ("backward", "accumulate_grad", "custom", "other", "group") else "backward"
        state = key if key in ("executed", "current", "frontier", "failed") else None
        attrs = _node_attrs(kind, pal, no_grad=key == "no_grad", error=key == "error", state=state)
        out.append(f"    {quote('legend:' + key)} {_attrs(label=LEGEND_TEXT[key], fontsize=9, **attrs)};")
    for a, b in zip(order, order[1:]):  # one column, top to bottom
        out.append(f"    {quote('legend:' + a)} -> {quote('legend:' + b)} [style=invis];")
    out.append("  }")


