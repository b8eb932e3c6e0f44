"""Colour by Gradient Norm: edges and leaves in the Gradients heatmap's colours on a log scale, the
scale over the view with the call's smallest and largest norm, the norm in each tooltip; off,
every item is drawn in its theme's colours again."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QRectF
from PySide6.QtGui import QColor, QImage, QPainter

from core.model.trace import GradInfo, Values
from tests.fixtures_graphs import call as make_call
from tests.fixtures_graphs import leaf, node, tensor
from widgets.panels.grad_health import STOPS, shade_color

VIEW_SIZE = (900, 700)


def norm_call():
    """``loss = (w * b).sum()``: SumBackward0 sends a gradient of norm 2 to MulBackward0, which sends
    0.02 to ``w`` and 200 to ``b``; the log scale runs from 0.02 to 200, so 2 is its middle."""
    tensors = [tensor("t_w", "w", [40]), tensor("t_b", "b", [40]),
               tensor("t_m", "m", [40], is_leaf=False, grad_fn="n1"),
               tensor("t_loss", "loss", [], is_leaf=False, grad_fn="n0")]
    nodes = [node("n0", "SumBackward0", ["n1"], label="loss", tensor_id="t_loss"),
             node("n1", "MulBackward0", ["n2", "n3"], label="m", tensor_id="t_m"),
             leaf("n2", "t_w", "w"), leaf("n3", "t_b", "b")]
    sample = Values(numel=40, sample=[0.1] * 8, min=0.1, max=0.1, mean=0.1)  # a sample: only .norm is exact

    def g(norm):
        return GradInfo(shape=[40], values=sample, norm=norm)

    params = {"w": {"module": "w", "grad": 0.02, "param": 1.0, "ratio": 0.02},
              "b": {"module": "b", "grad": 200.0, "param": 1.0, "ratio": 200.0}}
    return replace(make_call(nodes, tensors, ["n0"]), edge_grads={"n0": [g(2.0)], "n1": [g(0.02), g(200.0)]},
                   grad_norms={"params": params, "modules": {"w": 0.02, "b": 200.0}})


def edge(view, src, slot):
    return next(e for e in view.edge_items if (e.edge.src, e.edge.slot) == (src, slot))


def pixel(view, item, dx=4.0) -> QColor:
    """The colour drawn inside ``item``'s box, just inside its left end at mid height (no text there)."""
    r = item.sceneBoundingRect().adjusted(10, 10, -10, -10)  # the box (its bounds hold a 10 px margin)
    image = QImage(int(r.width()) + 40, int(r.height()) + 40, QImage.Format_ARGB32)
    image.fill(QColor("white"))
    p = QPainter(image)
    view.scene().render(p, QRectF(0, 0, image.width(), image.height()), r.adjusted(-20, -20, 20, 20))
    p.end()
    return image.pixelColor(int(20 + r.height() / 2 + dx), int(20 + r.height() / 2))


def test_edges_and_leaves_take_the_heatmaps_colours_and_off_gives_theirs_back(view, qtbot):
    call = norm_call()
    view.set_call(call, sync=True)
    w_leaf, b_leaf = view.node_items["n2"], view.node_items["n3"]
    plain = {id(e): tinted_edge(e) for e in view.edge_items}
    plain_fill = pixel(view, w_leaf)
    assert view.overlays.scale.isHidden()

    view.set_colour_by_norm(True)
    assert view.colours_by_norm()
    assert edge(view, "n1", 0).tint["edge"] == STOPS[0].name() == "#440154"  # 0.02: the smallest
    assert edge(view, "n1", 1).tint["edge"] == STOPS[-1].name() == "#fde725"  # 200: the largest
    assert edge(view, "n0", 0).tint["edge"] == shade_color(0.5).name()  # 2: log-halfway
    assert w_leaf.tint["leaf_fill"] == "#440154" and b_leaf.tint["leaf_fill"] == "#fde725"
    assert w_leaf.tint["text"] == "#ffffff" and b_leaf.tint["text"] == "#000000"  # readable on each
    assert pixel(view, w_leaf).name() == "#440154" and pixel(view, b_leaf).name() == "#fde725"

    scale = view.overlays.scale
    qtbot.waitUntil(scale.isVisible, timeout=5000)
    assert scale.labels() == ("0.02", "200")
    assert scale.note() == "edges and leaves, log scale"
    assert edge(view, "n0", 0).toolTip().startswith(
        "‖grad‖₂ = 2: the gradient SumBackward0 sent to MulBackward0 in this call")
    assert w_leaf.toolTip().startswith("‖w.grad‖₂ = 0.02 after this call\n\n")
    assert b_leaf.toolTip().startswith("‖b.grad‖₂ = 200 after this call")

    view.set_theme("print")  # the colours stay in the print theme
    assert pixel(view, b_leaf).name() == "#fde725"
    view.set_theme("light")

    view.set_colour_by_norm(False)
    assert all(not e.tint for e in view.edge_items) and not w_leaf.tint and not b_leaf.tint
    assert {id(e): tinted_edge(e) for e in view.edge_items} == plain
    assert pixel(view, w_leaf) == plain_fill
    assert "‖" not in edge(view, "n0", 0).toolTip() and not w_leaf.toolTip()
    assert scale.isHidden()


def tinted_edge(e) -> str:
    """The colour the edge is drawn in."""
    return e.tint.get("edge", e.theme.edge)


def test_a_call_without_edge_gradients_colours_its_leaves_and_says_so(view, qtbot):
    call = replace(norm_call(), edge_grads={})
    view.set_colour_by_norm(True)  # on before the call: each new scene is coloured
    view.set_call(call, sync=True)
    assert all(not e.tint for e in view.edge_items)
    assert view.node_items["n2"].tint["leaf_fill"] == "#440154"
    assert view.node_items["n3"].tint["leaf_fill"] == "#fde725"
    scale = view.overlays.scale
    qtbot.waitUntil(scale.isVisible, timeout=5000)
    assert scale.note() == "no edge gradients in this call (recorded up to 300 nodes): leaves only"
    assert scale.labels() == ("0.02", "200")


def test_the_window_has_the_toggle_in_the_view_menu_with_its_key(window):
    act = window.act_norm_colours
    assert act.isCheckable() and act.shortcut().toString() == "Ctrl+Shift+G"
    view_menu = next(a.menu() for a in window.menuBar().actions() if a.text() == "&View")
    assert act in view_menu.actions()
    others = [a for a in window.findChildren(type(act)) if a is not act and a.shortcut() == act.shortcut()]
    assert others == []
    act.setChecked(True)
    assert window.graph.colours_by_norm()
