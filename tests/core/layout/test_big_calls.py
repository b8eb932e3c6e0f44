"""A huge flat call opens on the part nearest the loss; module paths past MAX_DEPTH are cut."""

from core.layout.groups import MAX_DEPTH, PAGE_MARK, group_info
from core.layout.opening import opening_layout
from tests.big_calls import chain, deep_modules, fan_in

AREA = (1000, 700)


def _page_boxes(layout) -> list[str]:
    return sorted((v for v in layout.nodes if v.startswith("group:" + PAGE_MARK)), key=lambda v: int(v[7:]))


def test_a_100k_chain_opens_on_the_thousand_nodes_nearest_the_loss():
    call = chain(100_000)
    collapsed, layout = opening_layout(call, AREA)
    pages = _page_boxes(layout)
    assert pages == [f"group:{PAGE_MARK}{k}" for k in range(2, 101)]
    assert len(layout.nodes) == 1_000 + 99
    assert {f"n{i}" for i in range(1_000)} <= set(layout.nodes) and "n1000" not in layout.nodes
    assert layout.nodes[pages[0]].label.startswith("farther from the loss (2 of 100)\n1,000 nodes")
    info = group_info(call)
    assert all(info.is_drawn(g) for g in info.pages)  # each page is a convex part: it folds and opens
    assert info.module["n1000"] == f"{PAGE_MARK}2" and info.module["n0"] is None


def test_a_node_with_100k_inputs_opens_with_its_first_inputs_drawn():
    call = fan_in(100_000)
    _, layout = opening_layout(call, AREA)
    assert len(_page_boxes(layout)) == 100 and len(layout.nodes) == 1_000 + 100
    assert "n0" in layout.nodes and "n999" in layout.nodes and "n1000" not in layout.nodes
    edges = {(e.src, e.dst) for e in layout.edges}
    assert ("n0", f"group:{PAGE_MARK}2") in edges and ("n0", f"group:{PAGE_MARK}101") in edges


def test_smaller_flat_calls_are_not_paged():
    assert group_info(chain(5_000)).pages == {}


def test_module_paths_past_max_depth_are_drawn_at_that_depth():
    call = deep_modules(3_000)
    info = group_info(call)
    assert max(len(chain) for chain in info.ancestors.values()) == MAX_DEPTH == 64
    deepest = ".".join(f"m{k}" for k in range(MAX_DEPTH))
    assert info.module["n59"] == deepest
    assert info.title(deepest, deepest.rsplit(".", 1)[0]) == "m63 (and 2,936 deeper levels, not drawn)"
    _, layout = opening_layout(call, AREA)
    assert layout.nodes and len(layout.groups) <= MAX_DEPTH
