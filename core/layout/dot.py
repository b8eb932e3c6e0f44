"""Graphviz ``dot`` as an optional layout engine, for comparison and small graphs.

dot draws fine pictures but took 7-9 s on 5,000 nodes here, so it is never the default.
Module groups become dot clusters; their rectangles come from dot's ``bb``. Edge splines
are sampled into polylines (``Layout.engine == "dot"`` tells the view to draw them straight).
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess

from core.layout.boxes import (
    GROUP_PAD,
    MARGIN,
    SAVED_GAP,
    SAVED_H,
    SMALL_CHAR_W,
    EdgePath,
    GroupBox,
    Layout,
    NodeBox,
    SavedBox,
    group_id,
)
from core.layout.groups import group_info
from core.layout.visible import Visible
from core.model.trace import CallInfo

log = logging.getLogger(__name__)


def dot_available() -> bool:
    return shutil.which("dot") is not None


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def layout_dot(call: CallInfo, vis: Visible, timeout: float = 120.0) -> Layout:
    """Lay out the visible graph with ``dot -Tjson``; raises RuntimeError when dot fails."""
    info = group_info(call)
    name = {v: f"n{i}" for i, v in enumerate(vis.ids)}
    foot: dict[str, tuple[float, float]] = {}
    for v in vis.ids:
        w, h = vis.size[v]
        boxes = vis.saved.get(v, [])
        if boxes:
            sw = max(len(b[2]) * SMALL_CHAR_W + 12 for b in boxes)
            w, h = w + SAVED_GAP + sw, max(h, len(boxes) * (SAVED_H + 3) - 3)
        foot[v] = (w, h)
    children: dict[str | None, list[str]] = {}
    for g in vis.groups:
        children.setdefault(info.drawn_parent(g), []).append(g)
    members: dict[str | None, list[str]] = {}
    for v in vis.ids:
        members.setdefault(vis.container[v], []).append(v)
    lines = [
        "digraph G {",
        "graph [rankdir=TB, nodesep=0.35, ranksep=0.55, splines=spline];",
        'node [shape=box, fixedsize=true, label=""];',
        "edge [arrowhead=none];",
    ]

    def emit(container: str | None) -> None:
        for g in children.get(container, []):
            lines.append(
                f"subgraph {_q('cluster_' + g)} {{ label={_q(g)}; fontsize=10; labeljust=l; margin={GROUP_PAD:.0f};"
            )
            emit(g)
            lines.append("}")
        for v in members.get(container, []):
            w, h = foot[v]
            lines.append(f"{name[v]} [width={w / 72:.4f}, height={h / 72:.4f}];")

    emit(None)
    for u, v, *_ in vis.edges:
        lines.append(f"{name[u]} -> {name[v]};")
    lines.append("}")
    proc = subprocess.run(["dot", "-Tjson"], input="\n".join(lines), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"dot failed: {proc.stderr.strip()[:300]}")
    data = json.loads(proc.stdout)
    _, _, gw, gh = (float(x) for x in data["bb"].split(","))

    def pt(x: float, y: float) -> tuple[float, float]:
        return x + MARGIN, gh - y + MARGIN

    by_name = {v: k for k, v in name.items()}
    centres: dict[str, tuple[float, float]] = {}
    rects: dict[str, tuple[float, float, float, float]] = {}
    for obj in data.get("objects", []):
        if obj["name"] in by_name:
            x, y = (float(c) for c in obj["pos"].split(","))
            centres[by_name[obj["name"]]] = pt(x, y)
        elif obj["name"].startswith("cluster_") and "bb" in obj:
            x0, y0, x1, y1 = (float(c) for c in obj["bb"].split(","))
            (left, top), (right, bottom) = pt(x0, y1), pt(x1, y0)
            rects[obj["name"][8:]] = (left, top, right - left, bottom - top)
    nodes: dict[str, NodeBox] = {}
    saved: list[SavedBox] = []
    for v in vis.ids:
        (cx, cy), (fw, _), (w, h) = centres[v], foot[v], vis.size[v]
        left = cx - fw / 2
        nodes[v] = NodeBox(v, left, cy - h / 2, w, h, 0, vis.label[v], vis.kind[v])
        boxes = vis.saved.get(v, [])
        sy = cy - (len(boxes) * (SAVED_H + 3) - 3) / 2
        for sname, tensor, text, state in boxes:
            saved.append(
                SavedBox(
                    v, sname, tensor, left + w + SAVED_GAP, sy, len(text) * SMALL_CHAR_W + 12, SAVED_H, text, state
                )
            )
            sy += SAVED_H + 3
    rows = sorted({round(b.y + b.h / 2, 1) for b in nodes.values()})
    row_of = {y: i for i, y in enumerate(rows)}
    nodes = {
        v: NodeBox(b.id, b.x, b.y, b.w, b.h, row_of[round(b.y + b.h / 2, 1)], b.label, b.kind) for v, b in nodes.items()
    }
    splines = [_sample(e.get("pos", ""), pt) for e in sorted(data.get("edges", []), key=lambda e: e["_gvid"])]
    edges = []
    for (u, v, nr, slot, count), pts in zip(vis.edges, splines):
        if len(pts) < 2:
            a, b = nodes[u], nodes[v]
            pts = [(a.x + a.w / 2, a.y + a.h), (b.x + b.w / 2, b.y)]
        edges.append(EdgePath(u, v, nr, pts, slot, count))
    groups = []
    for g in vis.groups:
        if g in rects:
            parent = info.drawn_parent(g)
            label = info.title(g, parent)
            depth = len([a for a in info.ancestors[g][:-1] if info.is_drawn(a)])
            groups.append(GroupBox(g, *rects[g], False, info.count[g], label, depth))
    for path, count in vis.collapsed.items():
        b = nodes[group_id(path)]
        groups.append(GroupBox(path, b.x, b.y, b.w, b.h, True, count, path, 0))
    return Layout(nodes, edges, groups, gw + 2 * MARGIN, gh + 2 * MARGIN, saved, vis.members, "dot", 0)


def _sample(pos: str, pt) -> list[tuple[float, float]]:
    """dot's cubic B-spline control points, sampled into a polyline."""
    ctrl = []
    for tok in pos.split():
        if tok.startswith(("e,", "s,")):
            continue
        x, y = tok.split(",")[:2]
        ctrl.append(pt(float(x), float(y)))
    if len(ctrl) < 4:
        return ctrl
    out = [ctrl[0]]
    for i in range(0, len(ctrl) - 3, 3):
        p0, p1, p2, p3 = ctrl[i : i + 4]
        for k in range(1, 9):
            t = k / 8
            a, b, c, d = (1 - t) ** 3, 3 * t * (1 - t) ** 2, 3 * t * t * (1 - t), t**3
            out.append((a * p0[0] + b * p1[0] + c * p2[0] + d * p3[0], a * p0[1] + b * p1[1] + c * p2[1] + d * p3[1]))
    return out
