"""The graph on screen left to right and in forward order: layout, opening frame, Fit, Find,
stepping states and the legend, on synthetic calls (no torch)."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QRectF

from tests.fixtures_graphs import mlp_call, residual_mlp_call, transformer_call
from widgets.graph.direction import set_direction


def on_screen(view, item) -> QRectF:
    return QRectF(view.mapFromScene(item.sceneBoundingRect()).boundingRect())


def test_left_to_right_on_screen_keeps_folds_and_frames_the_loss(view):
    c = transformer_call(12)
    view.set_call(c, sync=True)
    folded = view.collapsed()
    assert folded  # 542 nodes open folded
    set_direction(view, "LR", sync=True)
    lay = view.graph_layout()
    assert lay.direction == "LR" and view.collapsed() == folded
    root = view.node_items[lay.members[c.roots[0]]]
    # the loss is the leftmost box and in sight; every edge runs left to right
    assert all(root.box.x <= b.x for b in lay.nodes.values())
    assert all(e.points[0][0] < e.points[-1][0] for e in lay.edges)
    assert view.viewport().rect().contains(on_screen(view, root).toRect())
    assert view.legend.entries()[-1] == "flow_backward"  # "arrows: gradients, from the loss to the leaves"
    # Find opens the folds around a node and brings it into view, left to right too
    view.sig_select_requested.connect(view.show_selection)  # the app's answer to Find
    assert view.search("c_fc.weight")
    nid = view.shown_selection()
    item = view.node_items[view.graph_layout().members[nid]]
    assert item.box.id == nid and view.viewport().rect().contains(on_screen(view, item).toRect())
    assert view.graph_layout().direction == "LR"
    # Fit shows the whole graph beside the legend
    view.fit()
    area = view._area()
    for it in view.node_items.values():
        assert area.adjusted(-1, -1, 1, 1).contains(on_screen(view, it))
    # back to top down
    set_direction(view, "TB", sync=True)
    assert view.graph_layout().direction == "TB" and "flow_backward" not in view.legend.entries()
    with pytest.raises(ValueError, match="unknown direction"):
        set_direction(view, "RL")


def test_forward_order_on_screen_steps_and_opens_on_the_loss(view):
    c = mlp_call()
    view.set_call(c, sync=True)
    set_direction(view, "forward", sync=True)
    lay = view.graph_layout()
    assert lay.direction == "forward" and view.legend.entries()[-1] == "flow_forward"
    root = lay.nodes[c.roots[0]]
    assert all(root.y >= b.y for b in lay.nodes.values())  # the loss at the bottom
    # stepping states land on the same boxes whichever way the graph is drawn
    view.set_node_states({c.roots[0]: "executed", "n1": "current"})
    assert view.node_items[c.roots[0]].state == "executed" and view.node_items["n1"].state == "current"
    # a graph too big for the view opens on the loss: at the bottom in forward order
    big = residual_mlp_call(60, "blocks")
    view.set_call(big, sync=True, collapsed=frozenset())
    box = view.node_items[big.roots[0]]
    assert view.viewport().rect().contains(on_screen(view, box).toRect())
    assert on_screen(view, box).bottom() > view.viewport().height() / 2
