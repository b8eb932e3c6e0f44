"""Geometry of the layered layout: exact small graphs, no overlaps, every edge, groups."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace

import pytest

from core.layout.compound import layout_call
from core.layout.groups import default_collapsed, group_info
from core.layout.visible import boundary_line, build_visible, node_label
from core.layout.opening import opening_layout
from core.layout.dot import dot_available
from core.layout.layered import layered
from tests.conftest import ROOT
from tests.fixtures_graphs import call, edge_count, leaf, mlp_call, mul_call, node, residual_mlp_call, rnn_call, tensor
from tests.fixtures_graphs import transformer_call


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


def test_mul_graph_exact():
    c = mul_call()
    lay = layout_call(c)
    assert set(lay.nodes) == {"n0", "n1", "n2"}
    mul, a, b = lay.nodes["n0"], lay.nodes["n1"], lay.nodes["n2"]
    assert (mul.layer, a.layer, b.layer) == (0, 1, 1)
    assert (mul.kind, a.kind, b.kind) == ("backward", "accumulate_grad", "accumulate_grad")
    assert (mul.label, a.label, b.label) == ("MulBackward0\nc", "a\n[3]", "b\n[3]")
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


def test_node_labels():
    c = mlp_call()
    n = c.node_map()
    assert node_label(c, n["n0"]) == "MseLossBackward0\nloss"
    assert node_label(c, n["n3"]) == "TBackward0"
    assert node_label(c, n["n10"]) == "fc1.weight\n[8, 3]"
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


def test_collapsing_a_group_merges_its_edges():
    c = residual_mlp_call(20)
    lay = layout_call(c, collapsed=frozenset({"layers.5"}))
    inside_ids = {
        n.id for n in c.nodes if group_info(c).module[n.id] and group_info(c).module[n.id].startswith("layers.5")
    }
    assert len(inside_ids) == 6
    assert "group:layers.5" in lay.nodes and not inside_ids & set(lay.nodes)
    assert lay.nodes["group:layers.5"].kind == "group"
    assert all(lay.members[i] == "group:layers.5" for i in inside_ids)
    out = [e for e in lay.edges if e.src == "group:layers.5"]
    assert [(e.dst, e.count) for e in out] == [("add4", 2)]  # the skip and the fc output, merged
    into = sorted((e.src, e.count) for e in lay.edges if e.dst == "group:layers.5")
    assert into == [("add6", 1), ("mm6", 1)]
    collapsed = [g for g in lay.groups if g.collapsed]
    assert [(g.path, g.count) for g in collapsed] == [("layers.5", 6)]
    assert overlaps(node_boxes(lay)) == []
    assert len(lay.nodes) == len(c.nodes) - 5


def test_default_collapsed_opens_whole_levels():
    assert default_collapsed(mlp_call()) == frozenset()
    c = residual_mlp_call(833)
    coll = default_collapsed(c)
    assert coll == frozenset(f"layers.{i}" for i in range(833))  # 835 boxes fit in 2,000
    chunks = group_info(c).children["layers"]  # 833 blocks open as 14 runs of 59 or 60
    assert len(chunks) == 14 and chunks[0] == "layers.0\u201359" and chunks[-1] == "layers.774\u2013832"
    assert default_collapsed(c, threshold=500) == frozenset(chunks)
    assert default_collapsed(c, threshold=10) == frozenset({"layers"})
    lay = layout_call(c, collapsed=coll)
    assert len(lay.nodes) == 835
    assert overlaps(node_boxes(lay)) == []


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


def test_transformer_stacks_its_blocks_and_folds_at_any_depth():
    c = transformer_call(12)
    info = group_info(c)
    assert info.repeat == {"transformer.h": 12}  # h.0 ... h.11 are built of the same ops
    assert info.title("transformer.h", "transformer") == "h \u00d7 12"
    assert info.fold_to_depth(0) == frozenset({"transformer", "lm_head"})
    assert info.fold_to_depth(1) == frozenset({"transformer.wte", "transformer.wpe", "transformer.h", "transformer.ln_f"})
    assert info.fold_to_depth(2) == frozenset(f"transformer.h.{i}" for i in range(12))
    assert info.fold_to_depth(3) == frozenset(
        f"transformer.h.{i}.{m}" for i in range(12) for m in ("ln_1", "attn", "ln_2", "mlp"))
    lay = layout_call(c, collapsed=info.fold_to_depth(1))
    labels = {b.label for b in lay.nodes.values() if b.kind == "group"}
    assert labels == {"transformer.wte\n2 nodes\nout: \u2026wte.weight [500, 64]", "transformer.wpe\n2 nodes\nout: 1 tensor",
                      f"transformer.h \u00d7 12\n{info.count['transformer.h']:,} nodes\nin: 1 tensor \u00b7 out: 1 tensor",
                      "transformer.ln_f\n3 nodes\nin: 1 tensor \u00b7 out: 1 tensor"}
    lay = layout_call(c, collapsed=info.fold_to_depth(2))
    frames = {g.path: g.label for g in lay.groups if not g.collapsed}
    assert frames == {"transformer": "transformer", "transformer.h": "h \u00d7 12", "lm_head": "lm_head",
                      "transformer.wte": "wte", "transformer.wpe": "wpe", "transformer.ln_f": "ln_f"}
    assert overlaps(node_boxes(lay)) == []
    # Expanding the path to one weight opens only that block and that module.
    coll = info.expand_path(info.fold_to_depth(0), "p_transformer.h.7.mlp.c_fc.weight")
    assert "transformer.h.7" not in coll and "transformer.h.7.mlp" not in coll
    assert {"transformer.h.6", "transformer.h.7.attn", "transformer.wte", "lm_head"} <= coll
    assert layout_call(c, collapsed=coll).members["p_transformer.h.7.mlp.c_fc.weight"] == "p_transformer.h.7.mlp.c_fc.weight"


def test_800_block_example_opens_as_one_stack_and_fits():
    c = residual_mlp_call(800, "blocks")
    info = group_info(c)
    assert info.repeat["blocks"] == 800 and len(info.children["blocks"]) == 13  # runs of 61 or 62 blocks
    assert sum(info.repeat[k] for k in info.children["blocks"]) == 800
    assert info.title("blocks.62\u2013122", "blocks") == "62\u2013122 \u00d7 61"
    assert info.title("blocks.100", "blocks.62\u2013122") == "100"
    assert info.node_groups("mm100") == ("blocks", "blocks.62\u2013122", "blocks.100", "blocks.100.fc")
    coll, lay = opening_layout(c, (900, 600))
    assert coll == frozenset({"blocks"})
    assert sorted(b.label for b in lay.nodes.values()) == ["MeanBackward0\nloss", "PowBackward0",
                                                            "blocks \u00d7 800\n4,800 nodes\nout: 1 tensor"]
    assert lay.height * 0.9 <= 600
    # small graphs open unfolded; a transformer opens at the deepest level that fits
    assert opening_layout(mlp_call(), (300, 200))[0] == frozenset()
    coll, lay = opening_layout(transformer_call(12), (2000, 1400))
    assert coll == frozenset({"transformer.wte", "transformer.wpe", "transformer.h", "transformer.ln_f"})
    assert lay.width * 0.9 <= 2000 and lay.height * 0.9 <= 1400


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


def test_folded_group_shows_the_tensors_crossing_its_border():
    c = mlp_call()
    lay = layout_call(c, collapsed=frozenset({"fc2"}))
    assert lay.nodes["group:fc2"].label.split("\n")[-1] == "in: s [4, 8] \u00b7 out: out [4, 2]"
    lay = layout_call(c, collapsed=frozenset({"act"}))
    assert lay.nodes["group:act"].label.split("\n")[-1] == "in: 1 tensor \u00b7 out: h [4, 8]"
    box = lay.nodes["group:act"]
    assert box.w >= max(len(s) for s in box.label.split("\n")) * 7.0  # the line fits the box
    # A stack of 800 blocks: one tensor leaves it (x needs no grad, so nothing enters).
    big = residual_mlp_call(800, "blocks")
    vis = build_visible(big, frozenset({"blocks"}), False)
    assert vis.label["group:blocks"] == "blocks \u00d7 800\n4,800 nodes\nout: 1 tensor"
    # Long names are cut at the front, at a dot.
    t = transformer_call(2)
    line = boundary_line(t, "lm_head")
    assert line == "in: \u2026wte.weight [500, 64] \u00b7 out: 1 tensor"


def test_folded_group_lists_two_tensors_then_a_count():
    # ``q, k, v = split(proj(x))`` inside "attn", all three read outside: out lists two, then "+1".
    tensors = [tensor("tx", "x", [2, 8]), tensor("tq", "q", [2, 4], is_leaf=False, grad_fn="q"),
               tensor("tk", "k", [2, 4], is_leaf=False, grad_fn="k"),
               tensor("tv", "v", [2, 4], is_leaf=False, grad_fn="v")]
    nodes = [node("sum", "CatBackward0", ["q", "k", "v"]),
             node("q", "MulBackward0", ["lx"], label="q", tensor_id="tq", module="attn"),
             node("k", "MulBackward0", ["lx"], label="k", tensor_id="tk", module="attn"),
             node("v", "MulBackward0", ["lx"], label="v", tensor_id="tv", module="attn"),
             leaf("lx", "tx", "x")]
    c = call(nodes, tensors, ["sum"])
    assert boundary_line(c, "attn") == "in: x [2, 8] \u00b7 out: q [2, 4], k [2, 4] +1"


def _borders_by_walking(c, info, g):
    """Each group's border edges found the slow way: walk its members' edges and their users."""
    anc, module = info.ancestors, info.module
    index = {n.id: i for i, n in enumerate(c.nodes)}
    members = {c.nodes[i].id for i in info._members[g]}
    leaving = [(index[n.id], s) for n in c.nodes if n.id in members
               for s, e in enumerate(n.next) if e is not None and g not in anc[module[e.node]]]
    entering = [(index[n.id], s) for n in c.nodes if n.id not in members
                for s, e in enumerate(n.next) if e is not None and e.node in members]
    return leaving, entering


@pytest.mark.parametrize("make", [lambda: transformer_call(3), lambda: residual_mlp_call(150, "blocks"), mlp_call])
def test_border_edges_of_every_group_match_a_walk_of_its_members(make):
    c = make()
    info = group_info(c)
    assert len(info.count) > 2
    for g in info.count:  # runs of a long stack ("blocks.0–63") included
        assert (info.leaving(g), info.entering(g)) == _borders_by_walking(c, info, g), g
    # the 150-block stack: one tensor leaves the whole stack, and a run passes one tensor on
    if "blocks" in info.count:
        assert [c.nodes[i].id for i, _ in info.entering("blocks")] == ["n1"]  # PowBackward0 reads the stack
        assert info.boundary("blocks") == (0, 1)
        assert info.boundary("blocks.75") == (1, 2)  # reads add74; add76 and mm76 read it


def test_the_layout_thread_prepares_the_next_fold():
    from core.layout.visible import prepare_folds

    c = residual_mlp_call(400, "blocks")  # 2,402 nodes: the stack opens as 7 runs
    info = group_info(c)
    runs = info.children["blocks"]
    assert len(runs) == 7 and not info.lines
    assert prepare_folds(c, frozenset({"blocks"})) == 8  # the stack and its runs
    assert set(info.lines) == {"blocks", *runs} and set(info._maps) == {"blocks", *runs}
    assert info.member_map(runs[0])["mm0"] == "group:" + runs[0]
    ready = dict(info.lines)
    lay = layout_call(c, collapsed=frozenset(runs))  # the fold uses what was prepared
    assert {lay.nodes["group:" + r].label.split("\n")[-1] for r in runs} == {ready[r] for r in runs}
    assert lay.members["mm0"] == "group:" + runs[0] and len(lay.members) == len(c.nodes)
    assert prepare_folds(mlp_call(), frozenset({"fc1"})) == 0  # small calls fold fast unprepared


def _renamed(c, old: str, new: str):
    """``c`` with every module path and tensor name starting ``old`` starting ``new`` instead."""
    fix = lambda s: new + s[len(old):] if s and s.startswith(old) else s  # noqa: E731
    nodes = [replace(n, module=fix(n.module), label=fix(n.label)) for n in c.nodes]
    tensors = [replace(t, name=fix(t.name)) for t in c.tensors]
    return replace(c, nodes=nodes, tensors=tensors)


def test_a_run_of_numbered_blocks_among_other_children_is_stacked():
    # GPT-2 with its blocks straight under "transformer": wte, wpe, 0 … 11, ln_f, and the
    # embeddings' sum as transformer's own node.
    c = _renamed(transformer_call(12), "transformer.h.", "transformer.")
    info = group_info(c)
    run = "transformer.0\u201311"
    assert info.repeat == {run: 12}
    assert info.children["transformer"] == ["transformer.ln_f", run, "transformer.wpe", "transformer.wte"]  # call order
    assert info.children[run] == [f"transformer.{i}" for i in range(12)]
    assert info.title(run, "transformer") == "0\u201311 \u00d7 12" and info.title("transformer.7", run) == "7"
    assert info.node_groups("p_transformer.h.7.mlp.c_fc.weight") == (  # ids keep their first names
        "transformer", run, "transformer.7", "transformer.7.mlp", "transformer.7.mlp.c_fc")
    assert info.count[run] == sum(info.count[f"transformer.{i}"] for i in range(12))
    assert info.fold_to_depth(1) == frozenset({"transformer.wte", "transformer.wpe", run, "transformer.ln_f"})
    lay = layout_call(c, collapsed=info.fold_to_depth(1))
    assert f"{run} \u00d7 12\n{info.count[run]:,} nodes\nin: 1 tensor \u00b7 out: 1 tensor" in {
        b.label for b in lay.nodes.values()}
    assert overlaps(node_boxes(lay)) == []
    # Opening the run shows its 12 blocks folded; the embeddings and ln_f are untouched.
    coll = info.fold_to_depth(2)
    assert coll >= {f"transformer.{i}" for i in range(12)} and run not in coll
    # "layers.0 … 5" next to "head" in one module; 300 blocks next to a head open in runs of 60.
    small = residual_mlp_call(6, "net")
    small = replace(small, nodes=[replace(n, module="net.head") if n.id == "n1" else n for n in small.nodes])
    info = group_info(small)
    assert info.repeat == {"net.0\u20135": 6} and info.children["net"] == ["net.head", "net.0\u20135"]
    big = residual_mlp_call(300, "net")
    big = replace(big, nodes=[replace(n, module="net.head") if n.id == "n1" else n for n in big.nodes])
    info = group_info(big)
    assert info.children["net"] == ["net.head", "net.0\u2013299"]
    runs = info.children["net.0\u2013299"]
    assert runs == ["net.0\u201359", "net.60\u2013119", "net.120\u2013179", "net.180\u2013239", "net.240\u2013299"]
    assert info.title(runs[1], "net.0\u2013299") == "60\u2013119 \u00d7 60" and info.title("net.75", runs[1]) == "75"
    assert info.node_groups("mm75") == ("net", "net.0\u2013299", runs[1], "net.75", "net.75.fc")


def test_blocks_that_differ_are_not_stacked():
    # The last block has a downsample the others lack: not one stack, but 0 … 2 stack among
    # net's children; two equal blocks among other children stay apart (a run starts at three).
    c = residual_mlp_call(4, "net")
    c = replace(c, nodes=[replace(n, module="net.3.down") if n.id == "t3" else n for n in c.nodes])
    info = group_info(c)
    assert info.repeat == {"net.0\u20132": 3} and info.children["net"] == ["net.3", "net.0\u20132"]
    two = residual_mlp_call(2, "net")
    two = replace(two, nodes=[replace(n, module="net.head") if n.id == "n1" else n for n in two.nodes])
    assert group_info(two).repeat == {} and group_info(two).children["net"] == ["net.head", "net.1", "net.0"]


def test_preparing_folds_stops_when_asked():
    from core.layout.visible import prepare_folds

    c = residual_mlp_call(400, "blocks")
    info = group_info(c)
    runs = frozenset(info.children["blocks"])
    asked = []
    assert prepare_folds(c, runs, stop=lambda: asked.append(1) or len(asked) > 2) < 3 * 58
    assert len(info._maps) < len(runs) * 58  # not every block of the 7 runs
    assert prepare_folds(c, runs) == 7 + 400  # the runs and their blocks
