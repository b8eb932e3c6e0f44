"""Geometry of the layered layout: exact small graphs, no overlaps, every edge, group frames, directions."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace

import pytest

from core.layout.compound import layout_call
from core.layout.dot import dot_available
from core.layout.groups import group_info
from core.layout.layered import layered
from core.layout.visible import node_label
from tests.conftest import ROOT
from tests.core.layout.geometry import edges_crossing_boxes, inside, node_boxes, overlaps, trace_edges
from tests.fixtures_graphs import call, edge_count, leaf, mlp_call, mul_call, node, residual_mlp_call, rnn_call, tensor


def test_mul_graph_exact():
    c = mul_call()
    lay = layout_call(c)
    assert set(lay.nodes) == {"n0", "n1", "n2"}
    mul, a, b = lay.nodes["n0"], lay.nodes["n1"], lay.nodes["n2"]
    assert (mul.layer, a.layer, b.layer) == (0, 1, 1)
    assert (mul.kind, a.kind, b.kind) == ("backward", "accumulate_grad", "accumulate_grad")
    assert (mul.label, a.label, b.label) == ("MulBackward0\nc", "a\nshape 3", "b\nshape 3")
    assert a.y >= mul.y + mul.h + 20  # leaves below the root, with a gap for the edges
    assert a.x + a.w < b.x  # next_functions order: input 0 on the left
    assert abs((mul.x + mul.w / 2) - (a.x + a.w / 2 + b.x + b.w / 2) / 2) < 1.0  # parent centred
    assert overlaps(node_boxes(lay)) == []
    assert sorted((e.src, e.dst, e.input_nr, e.slot) for e in lay.edges) == [("n0", "n1", 0, 0), ("n0", "n2", 0, 1)]
    for e in lay.edges:
        src, dst = lay.nodes[e.src], lay.nodes[e.dst]
        (x0, y0), (x1, y1) = e.points[0], e.points[-1]
        assert y0 == pytest.approx(src.y + src.h) and src.x <= x0 <= src.x + src.w
        assert y1 == pytest.approx(dst.y) and dst.x <= x1 <= dst.x + dst.w
    assert lay.groups == []
    assert lay.width >= b.x + b.w and lay.height >= a.y + a.h


def test_compact_spacing_keeps_the_boxes_and_their_order_on_less_room():
    """A slide's layout: the same boxes in the same places of the order, 5 units above and below
    a label instead of 8, 28 between layers instead of 46, 20 between neighbours instead of 26."""
    c = mul_call()
    roomy, compact = layout_call(c), layout_call(c, engine="compact")
    assert [(b.id, b.x, b.y, b.w, b.h) for b in roomy.nodes.values()] == [
        ("n0", 79.0, 24.0, 108.0, 46.0), ("n1", 24.0, 116.0, 96.0, 46.0), ("n2", 146.0, 116.0, 96.0, 46.0)]
    assert [(b.id, b.x, b.y, b.w, b.h) for b in compact.nodes.values()] == [
        ("n0", 73.0, 24.0, 108.0, 40.0), ("n1", 24.0, 92.0, 93.0, 40.0), ("n2", 137.0, 92.0, 93.0, 40.0)]
    assert (compact.width, compact.height, compact.engine) == (254.0, 156.0, "layered")  # edges stay curved
    lr = layout_call(c, engine="compact", direction="LR")
    assert [(b.x, b.y) for b in lr.nodes.values()] == [(24.0, 54.0), (160.0, 24.0), (160.0, 84.0)]
    big = mlp_call()
    for direction in ("TB", "LR", "forward"):
        lay = layout_call(big, engine="compact", direction=direction)
        assert overlaps(node_boxes(lay)) == [] and edges_crossing_boxes(lay) == []
        assert Counter((e.src, e.dst, e.input_nr) for e in lay.edges) == trace_edges(big)
        assert {v: b.layer for v, b in lay.nodes.items()} == {
            v: b.layer for v, b in layout_call(big, direction=direction).nodes.items()}
        module = group_info(big).module
        assert {g.path for g in lay.groups} == {"fc1", "fc2", "act"}
        for g in lay.groups:
            for b in lay.nodes.values():
                box = (b.x, b.y, b.w, b.h)
                if module[b.id] == g.path:
                    assert inside(box, (g.x, g.y, g.w, g.h)), (b.id, g.path)
                else:
                    assert overlaps([("n", *box), ("g", g.x, g.y, g.w, g.h)]) == [], (b.id, g.path)



def test_labelled_edges_get_room_left_to_right_only():
    """With values written along the edges, left to right the gap between columns holds a label
    (180 units, not 46; a slide's 28) and a column's boxes keep 40 apart (not 26; 20), so that the
    edges fanning out of a box part far enough for a label between two of them. Top down the
    labels stand beside their edges: the layout is the same."""
    c = mul_call()
    for engine, gap, row in (("auto", 46.0, 26.0), ("auto+labels", 180.0, 40.0), ("compact", 28.0, 20.0),
                             ("compact+labels", 180.0, 40.0)):
        lay = layout_call(c, engine=engine, direction="LR")
        mul, a, b = lay.nodes["n0"], lay.nodes["n1"], lay.nodes["n2"]
        assert (a.x - (mul.x + mul.w), b.y - (a.y + a.h)) == (gap, row), engine
        assert overlaps(node_boxes(lay)) == [] and lay.engine == "layered"
    for plain in ("auto", "compact"):
        for direction in ("TB", "forward"):
            boxes = [layout_call(c, engine=e, direction=direction).nodes for e in (plain, plain + "+labels")]
            assert boxes[0] == boxes[1], (plain, direction)
    assert layout_call(mlp_call(), engine="auto+labels", direction="LR").width > \
        layout_call(mlp_call(), direction="LR").width + 3 * (180 - 46)

def test_node_labels():
    c = mlp_call()
    n = c.node_map()
    assert node_label(c, n["n0"]) == "MseLossBackward0\nloss"
    assert node_label(c, n["n3"]) == "TBackward0"
    assert node_label(c, n["n10"]) == "fc1.weight\nshape 8×3"
    scalar = call([leaf("l", "t")], [tensor("t", None, [])], ["l"])
    assert node_label(scalar, scalar.nodes[0]) == "leaf\nscalar"


def test_boxes_grow_with_labels():
    lay = layout_call(mlp_call())
    short, long_ = lay.nodes["n3"], lay.nodes["n0"]  # TBackward0 vs MseLossBackward0
    assert long_.w > short.w
    assert long_.h > short.h  # two lines against one


def test_mlp_groups_are_boxes_around_their_nodes_only():
    c = mlp_call()
    lay = layout_call(c)
    frames = {g.path: g for g in lay.groups}
    assert set(frames) == {"fc1", "fc2", "act"}
    assert all(not g.collapsed for g in frames.values())
    assert (frames["fc1"].count, frames["fc2"].count, frames["act"].count) == (4, 4, 1)
    module = group_info(c).module
    for path, g in frames.items():
        for b in lay.nodes.values():
            box = (b.x, b.y, b.w, b.h)
            if module[b.id] == path:
                assert inside(box, (g.x, g.y, g.w, g.h)), (b.id, path)
            else:  # compound layout: no other node inside a group's frame
                assert overlaps([("n", *box), ("g", g.x, g.y, g.w, g.h)]) == [], (b.id, path)
    assert overlaps([(g.path, g.x, g.y, g.w, g.h) for g in frames.values()]) == []
    assert overlaps(node_boxes(lay)) == []


def test_parameter_leaves_join_their_module():
    info = group_info(mlp_call())
    assert info.module["n10"] == "fc1"  # fc1.weight, recorded with module None
    assert info.module["n5"] is None  # the custom Function ran outside any module


def test_5k_graph_no_overlaps_every_edge():
    c = residual_mlp_call(833)
    assert len(c.nodes) == 5000
    start = time.process_time()  # CPU time: other processes on the machine do not count
    lay = layout_call(c)
    took = time.process_time() - start
    assert set(lay.nodes) == {n.id for n in c.nodes}
    assert overlaps(node_boxes(lay)) == []
    assert Counter((e.src, e.dst, e.input_nr) for e in lay.edges) == trace_edges(c)
    for e in lay.edges:
        src, dst = lay.nodes[e.src], lay.nodes[e.dst]
        assert e.points[0][1] == pytest.approx(src.y + src.h)
        assert e.points[-1][1] == pytest.approx(dst.y)
        assert all(y1 >= y0 - 1e-6 for (_, y0), (_, y1) in zip(e.points, e.points[1:]))  # always downwards
    assert lay.nodes["n0"].layer == 0
    assert max(b.layer for b in lay.nodes.values()) > 2000
    # identical blocks stack in one column instead of drifting sideways
    xs = [g.x for g in lay.groups if g.path.count(".") == 1]
    assert max(xs) - min(xs) < 100
    assert took < 5.0, took  # about 0.3 s on an idle 2-core machine


def _flat_residual(blocks: int):
    """Residual adds in the parent (module None): ``layers`` is then not a convex group."""
    c = residual_mlp_call(blocks)
    nodes = [replace(n, module=None) if n.name == "AddBackward0" else n for n in c.nodes]
    return replace(c, nodes=nodes)


def test_non_convex_group_gets_no_frame_and_collapses_without_cycles_breaking_layout():
    c = _flat_residual(6)
    info = group_info(c)
    assert not info.is_drawn("layers") and info.is_drawn("layers.3")
    assert sorted(info.drawn_children(None)) == [f"layers.{i}" for i in range(6)]
    lay = layout_call(c)
    assert {g.path for g in lay.groups} == {f"layers.{i}" for i in range(6)} | {f"layers.{i}.fc" for i in range(6)}
    # collapsing it anyway makes a cyclic graph (adds <-> one box): laid out, every edge kept
    lay = layout_call(c, collapsed=frozenset({"layers"}))
    assert len(lay.nodes) == 2 + 6 + 1
    assert overlaps(node_boxes(lay)) == []
    assert {(e.src, e.dst) for e in lay.edges} >= {("group:layers", "add4"), ("add5", "group:layers")}


def test_saved_tensor_boxes_sit_beside_their_node():
    lay = layout_call(mul_call(), show_saved=True)
    mul = lay.nodes["n0"]
    assert [(s.node, s.name, s.label) for s in lay.saved] == [("n0", "other", "other = b"), ("n0", "self", "self = a")]
    for s in lay.saved:
        assert s.x >= mul.x + mul.w and s.y >= mul.y - 10 and s.y + s.h <= mul.y + mul.h + 10
    assert overlaps(node_boxes(lay)) == []
    assert layout_call(mul_call()).saved == []


@pytest.mark.parametrize(
    "make", [mlp_call, lambda: rnn_call(12), lambda: residual_mlp_call(60), lambda: _flat_residual(30)]
)
def test_edges_go_around_nodes(make):
    for show_saved in (False, True):
        lay = layout_call(make(), show_saved=show_saved)
        assert edges_crossing_boxes(lay) == []
        assert overlaps(node_boxes(lay)) == []


def test_long_edges_get_routed_through_every_layer_they_pass():
    lay = layout_call(rnn_call(12))
    w = lay.nodes["W"]
    first = next(e for e in lay.edges if e.src == "mmh11" and e.dst == "W")
    assert (lay.nodes["mmh11"].layer, lay.nodes["mmh0"].layer, w.layer) == (3, 36, 37)
    assert len(first.points) > 2 * (w.layer - lay.nodes["mmh11"].layer) - 4  # two points per band crossed


def test_repeated_input_draws_two_edges():
    c = call([node("sq", "MulBackward0", ["x", "x"]), leaf("x", "tx")], [tensor("tx", "x", [2])], ["sq"])
    lay = layout_call(c)
    assert sorted(e.slot for e in lay.edges) == [0, 1]
    assert lay.edges[0].points != lay.edges[1].points


def test_layered_engine_breaks_cycles():
    res = layered([(50, 20)] * 3, [(0, 1), (1, 2), (2, 0)])
    assert sorted(res.layers) == [0, 1, 2]
    assert len(res.routes) == 3 and all(len(r) >= 2 for r in res.routes)


def test_core_layout_never_imports_qt():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('PySide6', 'shiboken6', 'pyqtgraph', 'torch'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import core.layout.compound, core.layout.layered, core.layout.dot\n"
        "from tests.fixtures_graphs import mlp_call\n"
        "core.layout.compound.layout_call(mlp_call())\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


@pytest.mark.skipif(not dot_available(), reason="Graphviz dot is not installed")
def test_dot_engine_places_the_same_boxes():
    c = mlp_call()
    lay = layout_call(c, engine="dot")
    assert lay.engine == "dot"
    assert set(lay.nodes) == {n.id for n in c.nodes}
    assert overlaps(node_boxes(lay)) == []
    assert Counter((e.src, e.dst) for e in lay.edges) == Counter((s, d) for s, d, _ in trace_edges(c))
    assert {g.path for g in lay.groups} == {"fc1", "fc2", "act"}
    assert lay.nodes["n0"].y < lay.nodes["n10"].y


def test_edge_count_helper_matches_trace():
    assert edge_count(mlp_call()) == 10


def test_left_to_right_and_forward_directions():
    c = mlp_call()
    tb = layout_call(c)
    lr = layout_call(c, direction="LR")
    fw = layout_call(c, direction="forward")
    assert (lr.direction, fw.direction) == ("LR", "forward")
    # LR: the loss is the leftmost box and every edge runs left to right; boxes keep their sizes.
    root = lr.nodes["n0"]
    assert all(root.x < b.x for v, b in lr.nodes.items() if v != "n0")
    assert all(e.points[0][0] < e.points[-1][0] for e in lr.edges)
    assert {v: (b.w, b.h) for v, b in lr.nodes.items()} == {v: (b.w, b.h) for v, b in tb.nodes.items()}
    assert lr.width > lr.height and tb.height > tb.width
    # forward: leaves on top, the loss at the bottom, and each edge's points end at its consumer.
    assert all(fw.nodes["n0"].y > b.y for v, b in fw.nodes.items() if v != "n0")
    for e in fw.edges:
        src, dst = fw.nodes[e.src], fw.nodes[e.dst]
        assert e.points[-1][1] == pytest.approx(src.y, abs=1) and e.points[0][1] == pytest.approx(dst.y + dst.h, abs=1)
    for lay in (lr, fw):
        assert overlaps(node_boxes(lay)) == []
        for g in lay.groups:  # frames still hold their nodes
            for v, b in lay.nodes.items():
                if group_info(c).module.get(v) == g.path:
                    assert g.x <= b.x and b.x + b.w <= g.x + g.w and g.y <= b.y and b.y + b.h <= g.y + g.h
    with pytest.raises(ValueError, match="unknown direction"):
        layout_call(c, direction="RL")
