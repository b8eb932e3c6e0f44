"""The legend and the minimap keep off the node boxes in view, at 1280 x 800, on bundled examples.

Each overlay takes a corner (or a free stretch of the bottom or top edge) that no node box
reaches, or folds into a small tab; the user can open a folded one again with a click or its
key (L, M). The box of the node backward is at and the selected node's box are never covered.
Rectangles are compared in viewport pixels: a node box is its item's scene bounds mapped to the
viewport, an overlay its geometry less the viewport's offset in the view.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, QRect, QSize, Qt
from PySide6.QtTest import QTest

VIEW_SIZE = (1280, 800)  # the shared ``view`` fixture (tests/conftest.py) at this size

EXAMPLES = Path(__file__).resolve().parents[2] / "resources" / "examples"


@pytest.fixture(scope="module")
def calls():
    """The first backward call of three bundled examples, captured in this process."""
    capture = pytest.importorskip("core.worker.capture.recorder")
    return {name: capture.capture_script(str(EXAMPLES / f"{name}.py")).calls[0]
            for name in ("13_mlp_classifier", "40_model_small_cnn", "41_model_build")}


def node_boxes(view) -> dict[str, QRect]:
    """Viewport rectangles of the node boxes that show in the viewport."""
    vp = view.viewport().rect()
    out = {}
    for nid, item in view.node_items.items():
        r = view.mapFromScene(item.sceneBoundingRect()).boundingRect()
        if item.isVisible() and r.intersects(vp):
            out[nid] = r
    return out


def overlay_rects(view) -> dict[str, QRect]:
    """Viewport rectangles of the overlays shown: the legend (open or as its tab), the minimap, its tab."""
    offset = view.viewport().pos()
    shown = {"legend": view.legend, "minimap": view.minimap, "minimap tab": view.overlays.minimap_tab}
    return {name: w.geometry().translated(-offset) for name, w in shown.items() if w.isVisible()}


def covered(view) -> list[tuple[str, str]]:
    """(overlay, node) for each node box an overlay overlaps."""
    boxes = node_boxes(view)
    return [(name, nid) for name, r in overlay_rects(view).items() for nid, box in boxes.items() if r.intersects(box)]


def centre_on(view, node_id: str) -> None:
    view.centerOn(view.node_items[node_id].sceneBoundingRect().center())


def backward_order(call) -> list[str]:
    """Node ids in an order backward may run them (each node after all its consumers)."""
    users = {n.id: 0 for n in call.nodes}
    for n in call.nodes:
        for e in n.next:
            if e is not None:
                users[e.node] += 1
    ready, order = list(call.roots), []
    while ready:
        nid = ready.pop(0)
        order.append(nid)
        for e in call.node(nid).next:
            if e is not None:
                users[e.node] -= 1
                if users[e.node] == 0:
                    ready.append(e.node)
    return order


def test_fit_and_centring_on_each_node_leave_every_box_clear(view, calls):
    view.set_call(calls["13_mlp_classifier"], sync=True)
    view.fit()
    assert view.zoom_percent() == 73 and not view.minimap.isVisible()
    # the whole graph beside the legend, which stays open in its own corner
    assert overlay_rects(view) == {"legend": QRect(8, 694, 227, 96)}
    assert covered(view) == []
    view.set_zoom(300)
    for nid in view.node_items:
        centre_on(view, nid)
        assert covered(view) == [], nid
    # on fc2.bias the graph reaches the bottom right corner: the minimap moves to the top right
    centre_on(view, "n3")
    assert view.node_items["n3"].box.label.startswith("fc2.bias")
    assert overlay_rects(view) == {"legend": QRect(8, 694, 227, 96), "minimap": QRect(1199, 8, 71, 158)}
    # on fc2.weight the graph reaches the bottom left corner too: the legend takes the bottom right
    centre_on(view, "n10")
    assert overlay_rects(view) == {"legend": QRect(1043, 694, 227, 96), "minimap": QRect(1199, 8, 71, 158)}


@pytest.mark.parametrize("name, nodes, last", [("13_mlp_classifier", 11, "fc1.weight"),
                                               ("40_model_small_cnn", 16, "conv1.bias")])
def test_stepping_never_covers_the_current_node_or_the_selection(view, calls, name, nodes, last):
    call = calls[name]
    view.set_call(call, sync=True)
    view.set_zoom(300)
    order = backward_order(call)
    assert len(order) == nodes and view.node_items[order[-1]].box.label.startswith(last)
    current_covered, others_covered = [], []
    for k, nid in enumerate(order):
        change = {nid: "current"}
        if k:
            change[order[k - 1]] = "executed"
        view.update_step(change, {})
        view.ensure_visible(nid)  # as the stepping session does at each pause
        assert [n for n, st in view.node_states().items() if st == "current"] == [nid]
        box = node_boxes(view)[nid]
        if any(r.intersects(box) for r in overlay_rects(view).values()):
            current_covered.append(nid)
        others_covered += [(nid, hit) for hit in covered(view) if hit[1] != nid]
    assert current_covered == [] and others_covered == []
    for nid in order:  # each node selected in turn, brought into view
        view.show_selection(nid)
        assert view.shown_selection() == nid
        assert covered(view) == [], nid


def test_a_legend_with_no_free_corner_folds_and_opens_again(view, calls, qtbot):
    call = calls["41_model_build"]
    view.set_call(call, sync=True)
    view.set_zoom(300)
    layout = view.graph_layout()
    with qtbot.assertNotEmitted(view.legend.sig_folded):  # folding for room is not the user's choice
        view.centerOn(layout.width * 0.45, layout.height * 0.75)
    # every corner and every stretch of the edges wide enough for the open legend meets a node box
    assert view.legend.tucked and not view.legend.folded
    rects = overlay_rects(view)
    assert rects["legend"] == QRect(8, 766, 90, 24)  # its title tab, in the bottom left corner
    # the minimap leaves the bottom right corner to the "✂ example_input" cut note
    assert rects["minimap"] == QRect(8, 31, 66, 158)  # below the breadcrumbs
    note = next(i for i in view.marks.tags if getattr(i, "kind", "") == "cut")
    assert note.lines[0].startswith("\u2702 example_input")
    shown = view.mapFromScene(note.text_rect()).boundingRect()
    assert shown.intersects(QRect(1204, 632, 66, 158)) and not shown.intersects(rects["minimap"])
    assert covered(view) == []
    # a click on the tab opens it; it stays open (over other boxes) but off the selected node
    view.show_selection("n5")  # AddmmBackward0, in sight already
    with qtbot.waitSignal(view.legend.sig_folded) as folded:
        QTest.mouseClick(view.legend, Qt.LeftButton, Qt.NoModifier, QPoint(20, 12))
    assert folded.args == [False]
    assert not view.legend.tucked and view.legend.pinned and view.legend.size() == QSize(227, 96)
    assert overlay_rects(view) == {"legend": QRect(8, 31, 227, 96), "minimap": QRect(8, 632, 66, 158)}
    assert covered(view) == [("legend", "n9")]  # the edge of encoder.1.weight, the fewest boxes
    view.centerOn(layout.width * 0.45, layout.height * 0.7)  # panning keeps it open, off the selection
    assert view.legend.size() == QSize(227, 96)
    assert not overlay_rects(view)["legend"].intersects(node_boxes(view)["n5"])
    # its key folds it (the user's choice, remembered) and opens it again
    view.activateWindow()
    view.setFocus()
    assert view.act_legend.shortcut().toString() == "L"
    with qtbot.waitSignal(view.legend.sig_folded) as folded:
        QTest.keyClick(view, Qt.Key_L)
    assert folded.args == [True] and view.legend.folded and view.legend.size() == QSize(90, 24)
    with qtbot.waitSignal(view.legend.sig_folded) as folded:
        QTest.keyClick(view, Qt.Key_L)
    assert folded.args == [False] and view.legend.size() == QSize(227, 96)
    # another call: the legend folds itself again when it has no room
    view.set_call(call, sync=True)
    assert not view.legend.pinned


def test_the_minimap_folds_into_a_tab_and_opens_again(view, calls):
    view.set_call(calls["13_mlp_classifier"], sync=True)
    assert view.zoom_percent() == 90  # opens at the readable scale: fc1.weight is out of sight
    assert overlay_rects(view) == {"legend": QRect(8, 694, 227, 96), "minimap": QRect(1199, 632, 71, 158)}
    assert view.act_minimap.shortcut().toString() == "M"
    view.activateWindow()
    view.setFocus()
    QTest.keyClick(view, Qt.Key_M)
    assert not view.minimap.isVisible() and view.overlays.minimap_tab.isVisible()
    assert overlay_rects(view) == {"legend": QRect(8, 694, 227, 96), "minimap tab": QRect(1187, 766, 83, 24)}
    assert covered(view) == []
    tab = view.overlays.minimap_tab
    QTest.mouseClick(tab, Qt.LeftButton, Qt.NoModifier, QPoint(10, 12))
    assert view.minimap.isVisible() and not tab.isVisible()
    assert overlay_rects(view)["minimap"] == QRect(1199, 632, 71, 158)


def test_with_no_free_corner_the_legend_takes_a_free_stretch_of_the_edge_and_stays(view, calls):
    view.set_call(calls["40_model_small_cnn"], sync=True)
    view.set_zoom(400)
    layout = view.graph_layout()
    x, y = layout.width * 0.65, layout.height * 0.7
    view.centerOn(x, y)
    # IndicesBackward0 fills the bottom left corner, the minimap the bottom right one and the
    # conv2 leaves the top: the legend opens on the bottom edge, just right of IndicesBackward0
    assert overlay_rects(view) == {"legend": QRect(518, 694, 227, 96), "minimap": QRect(1193, 632, 77, 158)}
    assert covered(view) == []
    view.centerOn(x - 8, y)  # the box moves right 32 px and pushes the legend along
    assert overlay_rects(view)["legend"] == QRect(550, 694, 227, 96) and covered(view) == []
    view.centerOn(x, y)  # back: the legend's place is still free, so it stays there
    assert overlay_rects(view)["legend"] == QRect(550, 694, 227, 96) and covered(view) == []
