"""Folding module groups: merged edges, the levels a call opens at, stacked blocks, the tensors
crossing a folded group's border, and the folds the layout thread prepares ahead."""

from __future__ import annotations

from dataclasses import replace

import pytest

from core.layout.compound import layout_call
from core.layout.groups import default_collapsed, group_info
from core.layout.opening import opening_layout
from core.layout.visible import boundary_line, build_visible, prepare_folds
from tests.core.layout.geometry import node_boxes, overlaps
from tests.fixtures_graphs import call, leaf, mlp_call, node, residual_mlp_call, tensor, transformer_call


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
    assert labels == {"transformer.wte\n2 nodes\nout: \u2026wte.weight 500×64", "transformer.wpe\n2 nodes\nout: 1 tensor",
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


def test_folded_group_shows_the_tensors_crossing_its_border():
    c = mlp_call()
    lay = layout_call(c, collapsed=frozenset({"fc2"}))
    assert lay.nodes["group:fc2"].label.split("\n")[-1] == "in: s 4×8 \u00b7 out: out 4×2"
    lay = layout_call(c, collapsed=frozenset({"act"}))
    assert lay.nodes["group:act"].label.split("\n")[-1] == "in: 1 tensor \u00b7 out: h 4×8"
    box = lay.nodes["group:act"]
    assert box.w >= max(len(s) for s in box.label.split("\n")) * 7.0  # the line fits the box
    # A stack of 800 blocks: one tensor leaves it (x needs no grad, so nothing enters).
    big = residual_mlp_call(800, "blocks")
    vis = build_visible(big, frozenset({"blocks"}), False)
    assert vis.label["group:blocks"] == "blocks \u00d7 800\n4,800 nodes\nout: 1 tensor"
    # Long names are cut at the front, at a dot.
    t = transformer_call(2)
    line = boundary_line(t, "lm_head")
    assert line == "in: \u2026wte.weight 500×64 \u00b7 out: 1 tensor"


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
    assert boundary_line(c, "attn") == "in: x 2×8 \u00b7 out: q 2×4, k 2×4 +1"


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
    c = residual_mlp_call(400, "blocks")
    info = group_info(c)
    runs = frozenset(info.children["blocks"])
    asked = []
    assert prepare_folds(c, runs, stop=lambda: asked.append(1) or len(asked) > 2) < 3 * 58
    assert len(info._maps) < len(runs) * 58  # not every block of the 7 runs
    assert prepare_folds(c, runs) == 7 + 400  # the runs and their blocks
