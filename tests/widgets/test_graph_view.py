"""GraphView built straight from synthetic calls, checked through its items and pixels."""

from __future__ import annotations

from dataclasses import replace

import pytest
from PySide6.QtCore import QEvent, QPoint, QPointF, QRect, Qt
from PySide6.QtGui import QColor, QHelpEvent, QWheelEvent
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from tests.fixtures_graphs import edge_count, mlp_call, mul_call, residual_mlp_call
from widgets.graph.items import EdgeItem, NodeItem
from widgets.graph.painting import color
from core.layout.groups import group_info
from widgets.graph.view import OVERVIEW_LOD, GraphView
from widgets.theme import THEMES

VIEW_SIZE = (900, 700)  # the shared ``view`` fixture (tests/conftest.py) at this size


def centre_of(view: GraphView, node_id: str) -> QPoint:
    return view.mapFromScene(view.node_items[node_id].sceneBoundingRect().center())


def pixel(view: GraphView, pos: QPoint) -> QColor:
    return view.viewport().grab().toImage().pixelColor(pos)


def distinct_colors(image, step: int = 7) -> int:
    return len({image.pixel(x, y) for x in range(0, image.width(), step) for y in range(0, image.height(), step)})


def test_one_item_per_node_and_edge(view):
    c = mlp_call()
    view.set_call(c, sync=True)
    assert set(view.node_items) == {n.id for n in c.nodes}
    assert len(view.edge_items) == edge_count(c) == 10
    scene_items = view.scene().items()
    assert sum(isinstance(i, NodeItem) for i in scene_items) == 11
    assert sum(isinstance(i, EdgeItem) for i in scene_items) == 10
    assert {(e.edge.src, e.edge.dst) for e in view.edge_items} == {(n.id, e.node) for n in c.nodes for e in n.next if e}
    assert set(view.group_items) == {"fc1", "fc2", "act"}
    styles = {i: item.style for i, item in view.node_items.items()}
    assert styles["n0"].shape == "op" and styles["n10"].shape == "leaf" and styles["n5"].shape == "custom"
    assert styles["n6"].retained and not styles["n0"].retained


def hover_tooltip(view: GraphView, node_id: str) -> str:
    pos = centre_of(view, node_id)
    QApplication.sendEvent(view.viewport(), QHelpEvent(QEvent.ToolTip, pos, view.viewport().mapToGlobal(pos)))
    return view.node_items[node_id].toolTip()


@pytest.mark.qt_log_ignore("This plugin does not support raise")  # the tooltip window, offscreen
def test_tooltips_describe_the_node(view):
    view.set_call(mlp_call(), sync=True)
    assert view.node_items["n10"].toolTip() == ""  # built on first hover
    tip = hover_tooltip(view, "n10")
    assert tip.splitlines() == [
        "torch::autograd::AccumulateGrad",
        "kind: leaf (AccumulateGrad)",
        "tensor: fc1.weight  shape 8×3  float32",
        "module fc1",
    ]
    tip = hover_tooltip(view, "n7")
    assert "AddmmBackward0" in tip and "line 6" in tip and "module fc1" in tip


def test_legend_lists_what_the_graph_shows(view):
    view.set_call(mlp_call(), sync=True)
    assert view.legend.isVisible()
    assert view.legend.entries() == ["op", "leaf", "custom", "frame", "retained"]
    view.set_node_states({"n0": "executed", "n1": "current"})
    assert view.legend.entries()[-2:] == ["executed", "current"]
    # drawn in the bottom-left corner, over the viewport; it does not scroll with the scene, it
    # only moves to another corner when boxes come under it
    geo, vp = view.legend.geometry(), view.viewport().geometry()
    assert geo.left() == vp.left() + 8 and geo.bottom() == vp.bottom() - 8
    view.set_zoom(300)
    bar = view.verticalScrollBar()
    assert bar.maximum() > 0
    before, node_before = view.legend.geometry(), centre_of(view, "n0")
    bar.setValue(bar.maximum())
    after = view.legend.geometry()
    assert centre_of(view, "n0") != node_before
    # zoomed in, boxes filled the bottom left corner: the legend sat in the bottom right one;
    # scrolled to the end, below the graph, it is back in its own corner
    assert before == QRect(vp.right() - 8 - 226, vp.bottom() - 8 - 183, 227, 184)
    assert after == QRect(vp.left() + 8, vp.bottom() - 8 - 183, 227, 184)
    boxes = [view.mapFromScene(i.sceneBoundingRect()).boundingRect().translated(vp.topLeft())
             for i in view.node_items.values()]
    assert not any(b.intersects(after) for b in boxes)


def test_async_layout_emits_scene_ready(view, qtbot):
    c = mul_call()
    with qtbot.waitSignal(view.sig_scene_ready, timeout=10000) as blocker:
        view.set_call(c)
        assert view.is_pending()
    assert blocker.args == [c.id]
    assert set(view.node_items) == {"n0", "n1", "n2"}


def test_only_the_latest_call_is_shown(view, qtbot):
    first, second = mlp_call(), replace(mul_call(), id="c-second")
    shown = []
    view.sig_scene_ready.connect(shown.append)
    with qtbot.waitSignal(view.sig_scene_ready, timeout=10000):
        view.set_call(first)
        view.set_call(second)
    qtbot.wait(50)
    assert shown == ["c-second"]
    assert set(view.node_items) == {"n0", "n1", "n2"}


def test_search_finds_a_variable_and_selects_it(view, qtbot):
    view.set_call(mlp_call(), sync=True)
    with qtbot.waitSignal(view.sig_select_requested, timeout=1000) as blocker:
        assert view.search("FC1.weight") == ["n10"]
    assert blocker.args == ["n10"]
    assert view.shown_selection() is None  # a request: the selection is the app's to make
    view.sig_select_requested.connect(view.show_selection)  # the app's answer
    assert view.search("FC1.weight") == ["n10"]
    assert view.shown_selection() == "n10"
    assert view.node_items["n10"].highlighted and view.node_items["n10"].selected
    assert not view.node_items["n4"].highlighted
    assert view.search("tbackward") == ["n3", "n9"]
    assert view.shown_selection() == "n3"
    assert view.next_match() == "n9" and view.next_match() == "n3"
    assert view.search("h") and view.node_items["n6"].highlighted  # tensor name h
    assert view.search("no such thing") == [] and view.next_match() is None
    assert not any(i.highlighted for i in view.node_items.values())


def test_click_asks_to_select_and_show_selection_does_not_echo(view, qtbot):
    view.set_call(mlp_call(), sync=True)
    with qtbot.waitSignal(view.sig_select_requested, timeout=1000) as blocker:
        QTest.mouseClick(view.viewport(), Qt.LeftButton, Qt.NoModifier, centre_of(view, "n6"))
    assert blocker.args == ["n6"]
    assert not view.node_items["n6"].selected  # not until the app says so
    view.show_selection("n6")
    assert view.node_items["n6"].selected
    active = {e.key for e in view.edge_items if e.active}
    assert active == {("n5", "n6"), ("n6", "n7")}
    with qtbot.assertNotEmitted(view.sig_select_requested):
        view.show_selection("n2")
    assert view.shown_selection() == "n2" and not view.node_items["n6"].selected


def test_states_change_what_is_drawn(view):
    view.set_call(mul_call(), sync=True)
    item = view.node_items["n1"]
    r = item.sceneBoundingRect()
    probe = view.mapFromScene(r.center().x(), r.top() + 13)  # inside the box, above the text
    before = pixel(view, probe)
    assert before == color(THEMES["light"].leaf_fill)
    view.set_node_states({"n1": "executed", "n0": "current", "n2": "failed"})
    assert (item.state, view.node_items["n0"].state, view.node_items["n2"].state) == ("executed", "current", "failed")
    assert pixel(view, probe) == color(THEMES["light"].executed_fill)
    view.clear_states()
    assert all(i.state is None for i in view.node_items.values())
    assert pixel(view, probe) == before


def test_grab_is_a_real_picture(view, tmp_path):
    view.set_call(mlp_call(), sync=True)
    image = view.grab().toImage()
    assert image.width() == 900 and distinct_colors(image) >= 8
    theme = THEMES["light"]
    found = {image.pixelColor(x, y).name() for x in range(0, 900, 3) for y in range(0, 700, 3)}
    assert {color(theme.op_fill).name(), color(theme.leaf_fill).name(), color(theme.custom_fill).name()} <= found


def test_double_click_folds_and_unfolds_a_group(view, qtbot):
    view.set_call(mlp_call(), sync=True)
    frame = view.group_items["fc1"]
    corner = view.mapFromScene(frame.sceneBoundingRect().topLeft()) + QPoint(6, 30)
    with (
        qtbot.waitSignal(view.sig_group_toggled, timeout=1000) as toggled,
        qtbot.waitSignal(view.sig_scene_ready, timeout=10000),
    ):
        QTest.mouseDClick(view.viewport(), Qt.LeftButton, Qt.NoModifier, corner)
    assert toggled.args == ["fc1"]
    assert view.collapsed() == frozenset({"fc1"})
    assert "group:fc1" in view.node_items and "n7" not in view.node_items
    assert {e.key for e in view.edge_items if "group:fc1" in e.key} == {("n6", "group:fc1")}
    view.toggle_group("fc1", sync=True)
    assert "n7" in view.node_items and view.collapsed() == frozenset()


def test_saved_boxes_and_shape_texts(view):
    view.set_call(mlp_call(), sync=True)
    assert view.saved_items == []
    view.set_show_saved(True, sync=True)
    assert sorted(s.saved.label for s in view.saved_items) == [
        "mat1 = s",
        "mat1 = x",
        "result = h",
        "self = out",
        "target = target",
    ]
    assert {s.saved.label for s in view.saved_items if s.no_grad} == {"mat1 = x", "target = target"}
    assert "saved" in view.legend.entries() and "no_grad" in view.legend.entries()
    view.set_show_shapes(True)
    texts = {e.key: e.label_text() for e in view.edge_items}
    assert texts[("n1", "n3")] == "" and texts[("n3", "n4")] == "shape 2×8" and texts[("n0", "n1")] == "shape 4×2"
    view.set_edge_texts({("n3", "n4"): "grad = 0.25"})  # one label: the shape, then its value
    assert view.edge_items[[e.key for e in view.edge_items].index(("n3", "n4"))].label_text() == "shape 2×8 = 0.25"


def test_error_call_marks_the_culprit(view):
    view.set_call(mlp_call(error=True), sync=True)
    assert view.node_items["n6"].style.error and not view.node_items["n0"].style.error
    assert "error" in view.legend.entries()
    assert view.scene().sceneRect().top() < 0  # the banner above the graph


def test_zoom_and_fit(view):
    view.set_call(mlp_call(), sync=True)
    assert view.zoom_percent() == 90  # too tall to fit readably: opens readable, on the loss
    QTest.keyClick(view, Qt.Key_0, Qt.ControlModifier)
    fitted = view.zoom_percent()
    assert fitted < 90
    view.zoom_in()
    assert view.zoom_percent() > fitted
    QTest.keyClick(view, Qt.Key_0, Qt.ControlModifier)
    assert view.zoom_percent() == fitted
    QTest.keyClick(view, Qt.Key_Minus, Qt.ControlModifier)
    assert view.zoom_percent() < fitted
    QTest.keyClick(view, Qt.Key_Equal, Qt.ControlModifier)
    assert view.zoom_percent() == pytest.approx(fitted, abs=1)


def test_wheel_zooms_around_the_mouse(view):
    view.set_call(mlp_call(), sync=True)
    view.set_zoom(250)  # the scene is larger than the view both ways: the anchor can hold
    view.centerOn(view.node_items["n9"])
    pos = centre_of(view, "n9") + QPoint(40, 10)
    scene_point = view.mapToScene(pos)
    before = view.zoom_percent()
    wheel = QWheelEvent(
        QPointF(pos),
        QPointF(view.viewport().mapToGlobal(pos)),
        QPoint(0, 0),
        QPoint(0, 240),
        Qt.NoButton,
        Qt.NoModifier,
        Qt.NoScrollPhase,
        False,
    )
    QApplication.sendEvent(view.viewport(), wheel)
    assert view.zoom_percent() > before * 1.3
    assert (view.mapFromScene(scene_point) - pos).manhattanLength() <= 2


def test_theme_switch(view):
    view.set_call(mul_call(), sync=True)
    view.set_theme("dark")
    assert view.backgroundBrush().color() == color(THEMES["dark"].background)
    assert all(i.theme.name == "dark" for i in view.node_items.values())
    assert distinct_colors(view.grab().toImage()) >= 5


def test_no_call_and_empty_call(view, qtbot):
    with qtbot.waitSignal(view.sig_scene_ready, timeout=1000):
        view.set_call(None)
    assert view.node_items == {} and view.edge_items == []
    assert not view.minimap.isVisible()


@pytest.mark.slow
def test_big_graph_switches_to_overview_when_zoomed_out(view):
    c = residual_mlp_call(833)
    view.set_call(c, sync=True, collapsed=frozenset())
    assert len(view.node_items) == 5000 and len(view.edge_items) == edge_count(c)
    assert view.zoom_percent() == 90  # too big to fit readably: opens on the root
    assert view.node_items["n0"].isVisible() and view.minimap.isVisible()
    view.fit()
    assert view.transform().m11() < OVERVIEW_LOD
    assert view.overview.isVisible() and not view.node_items["n0"].isVisible()
    image = view.grab().toImage()
    assert distinct_colors(image, 5) >= 3
    assert view.search("layers.400.fc.weight") == ["w400"]  # centres on it, back at a readable zoom later
    view.set_zoom(100)
    assert view.node_items["w400"].isVisible() and not view.overview.isVisible()
    assert (
        view.mapToScene(view.viewport().rect()).boundingRect().intersects(view.node_items["w400"].sceneBoundingRect())
    )
    with view.export_mode():
        view.fit()
        assert view.node_items["n0"].isVisible()
    assert not view.node_items["n0"].isVisible()


def test_minimap_click_moves_the_view(view, qtbot):
    view.set_call(residual_mlp_call(200), sync=True, collapsed=frozenset())
    assert view.minimap.isVisible()
    top = view.verticalScrollBar().value()
    mm = view.minimap
    QTest.mouseClick(mm, Qt.LeftButton, Qt.NoModifier, QPoint(mm.width() // 2, mm.height() - 6))
    assert view.verticalScrollBar().value() > top + 1000


def test_default_collapse_for_big_graphs(view):
    view.set_call(residual_mlp_call(833), sync=True)
    assert view.collapsed() == frozenset({"layers"}) and len(view.node_items) == 3
    assert view.node_items["group:layers"].box.label == "layers \u00d7 833\n4,998 nodes\nout: 1 tensor"
    view.select_node("w5")  # inside the folded stack: only the path to it opens
    chunks = group_info(view.call()).children["layers"]
    assert view.collapsed() == frozenset(chunks[1:]) | frozenset(f"layers.{i}" for i in range(60) if i != 5)
    assert view.node_items["w5"].selected and view.shown_selection() == "w5"
    assert "group:layers.4" in view.node_items and "w4" not in view.node_items


def test_transformer_opens_readable_and_find_opens_the_fold(view):
    from tests.fixtures_graphs import transformer_call

    view.set_call(transformer_call(12), sync=True)
    view.sig_select_requested.connect(view.show_selection)  # the app's answer to Find
    assert view.collapsed() == frozenset({"transformer", "lm_head"})
    assert view.smallest_text_px() >= 9
    assert view.search("h.7.mlp.c_fc.weight") == ["p_transformer.h.7.mlp.c_fc.weight"]
    assert "transformer.h.7.mlp" not in view.collapsed() and "transformer.h.6" in view.collapsed()
    item = view.node_items["p_transformer.h.7.mlp.c_fc.weight"]
    assert item.selected and view.shown_selection() == "p_transformer.h.7.mlp.c_fc.weight"
    shown = view.mapFromScene(item.sceneBoundingRect()).boundingRect()
    assert view.viewport().rect().contains(shown)
    assert not shown.intersects(view.legend.geometry())
    assert view.smallest_text_px() >= 9


def test_find_on_a_background_layout_scrolls_once_drawn(view, qtbot):
    c = residual_mlp_call(800, "blocks")
    view.set_call(c)
    view.sig_select_requested.connect(view.show_selection)  # the app's answer to Find
    assert view.wait_ready()
    assert view.collapsed() == frozenset({"blocks"})
    view.search("blocks.412.fc.weight")
    assert view.wait_ready()
    item = view.node_items["w412"]
    assert item.selected and view.viewport().rect().contains(view.mapFromScene(item.sceneBoundingRect()).boundingRect())
    assert len(view.node_items) < 900  # the other 799 blocks stay folded


def test_fit_leaves_the_legend_clear(view, qtbot):
    view.set_call(mlp_call(error=True), sync=True)
    assert len(view.legend.entries()) >= 5
    view.fit()
    legend = view.legend.geometry()
    for nid, item in view.node_items.items():
        box = view.mapFromScene(item.sceneBoundingRect()).boundingRect()
        assert view.viewport().rect().contains(box), nid
        assert not box.intersects(legend), nid
    with qtbot.waitSignal(view.legend.sig_folded) as folded:
        view.legend.mousePressEvent(_click())  # fold the legend: the window stores it
    assert folded.args == [True] and view.legend.folded and view.legend.height() == 24


def _click():
    from PySide6.QtGui import QMouseEvent

    return QMouseEvent(QEvent.MouseButtonPress, QPointF(5, 5), QPointF(5, 5), Qt.LeftButton, Qt.LeftButton, Qt.NoModifier)


def test_upstream_downstream_and_paths_are_marked(view):
    from tests.core.model.test_graph_query import shared_call

    view.set_call(shared_call(), sync=True)
    assert view.show_related("n2", "downstream") == {"n2", "n4", "n5"}
    assert {v for v, i in view.node_items.items() if i.highlighted} == {"n2", "n4", "n5"}
    assert {e.key for e in view.edge_items if e.accent == "highlight"} == {("n2", "n4"), ("n2", "n5")}
    view.show_related("n2", "upstream")
    assert {v for v, i in view.node_items.items() if i.highlighted} == {"n0", "n1", "n2", "n3"}
    view.show_related("n5", "paths")
    assert {e.key for e in view.edge_items if e.accent == "highlight"} == {
        ("n0", "n1"), ("n1", "n2"), ("n2", "n5"), ("n1", "n3"), ("n3", "n2")}
    assert view.related_note() == "2 paths from the loss to torch::autograd::AccumulateGrad"
    assert view.crumbs.isVisible() and "2 paths" in view.crumbs.text()
    view.clear_related()
    assert not any(i.highlighted for i in view.node_items.values())
    assert not any(e.accent for e in view.edge_items)
    menu = view.context_menu(centre_of(view, "n2"))
    assert [a.text() for a in menu.actions()][:3] == [
        "What feeds it gradient (toward the loss)", "Where its gradient flows (toward the leaves)",
        "Paths from the loss to here"]


def test_compare_two_calls_on_the_graph(view):
    a, b = residual_mlp_call(3), replace(residual_mlp_call(5), id="c1", index=1)
    view.set_peer_calls([a, b])
    view.set_call(b, sync=True)
    diff = view.show_diff(a)
    assert not diff.same_structure
    marked = {v for v, i in view.node_items.items() if i.highlighted}
    assert marked == {f"{k}{i}" for i in (3, 4) for k in ("add", "relu", "mm", "b", "t", "w")}
    assert view.related_note() == "since #0: 12 nodes added, 15 edges added, 1 edge removed"
    compare = next(a for a in view.context_menu(QPoint(2, 2)).actions() if a.text() == "Compare with call")
    assert [x.text() for x in compare.menu().actions()] == [a.title]
    view.show_diff(replace(residual_mlp_call(5), id="c2", index=2))
    assert view.related_note() == "same structure as #2 (verified node by node)"
    assert not any(i.highlighted for i in view.node_items.values())


def test_fold_depth_expand_all_and_breadcrumbs(view):
    from tests.fixtures_graphs import transformer_call

    view.set_call(transformer_call(12), sync=True)
    view.set_fold_depth(2)
    assert view.collapsed() == frozenset(f"transformer.h.{i}" for i in range(12))
    assert view.node_items["group:transformer.h.3"].box.label == "transformer.h.3\n44 nodes\nin: 1 tensor \u00b7 out: 1 tensor"
    view.toggle_group("transformer.h.3", sync=True)
    assert "transformer.h.3" not in view.collapsed() and "transformer.h.4" in view.collapsed()
    view.ensure_visible("p_transformer.h.3.mlp.c_fc.weight")
    assert view.crumbs.isVisible()
    assert view.crumbs.text().count("\u203a") == 5  # graph › transformer › h × 12 › 3 › mlp › c_fc
    assert ">h \u00d7 12<" in view.crumbs.text() and ">c_fc<" in view.crumbs.text()
    menu = view.context_menu(centre_of(view, "p_transformer.h.3.mlp.c_fc.weight"))
    assert "Collapse transformer.h.3.mlp.c_fc" in [a.text() for a in menu.actions()]
    view.crumbs.linkActivated.emit("transformer.h.3")  # frames that block
    frame = view.mapFromScene(view.group_items["transformer.h.3"].sceneBoundingRect()).boundingRect()
    assert view.viewport().rect().contains(frame)
    view.expand_all()
    assert view.collapsed() == frozenset() and len(view.node_items) == 542
    view.collapse_all()
    assert view.collapsed() == frozenset({"transformer", "lm_head"})


def test_folded_module_tooltip_says_what_goes_in_and_out():
    from tests.fixtures_graphs import transformer_call
    from widgets.graph.scene import tooltip

    c = transformer_call(12)
    assert tooltip(c, "group:transformer.h") == (
        "module transformer.h (collapsed)\n528 nodes\n12 blocks built of the same ops\n"
        "reads 1 node from outside, read by 1\ndouble-click to expand")
    assert "reads 0 nodes from outside, read by 2" in tooltip(c, "group:transformer.wte")  # tied to lm_head


def test_zoomed_out_nodes_keep_a_readable_summary(view):
    view.set_call(mlp_call(), sync=True, collapsed=frozenset())
    view.set_zoom(35)  # 11 px labels would be under 4 px: each box shows its op name at 6 px
    image = view.viewport().grab().toImage()
    item = view.node_items["n1"]  # AddmmBackward0 / out
    box = view.mapFromScene(item.sceneBoundingRect()).boundingRect().adjusted(4, 4, -4, -4)
    text = color(view.theme().text)
    dark = sum(1 for x in range(box.left(), box.right()) for y in range(box.top(), box.bottom())
               if QColor(image.pixel(x, y)).lightness() < (text.lightness() + 255) // 2)
    assert dark >= 15, dark  # glyphs, not an empty box


def test_ensure_visible_opens_folds_without_selecting(view):
    c = residual_mlp_call(800, "blocks")
    view.set_call(c, sync=True)
    assert view.ensure_visible("relu700", sync=True)
    item = view.node_items["relu700"]
    assert view.shown_selection() is None and not item.selected
    assert view.viewport().rect().contains(view.mapFromScene(item.sceneBoundingRect()).boundingRect())
    assert not view.ensure_visible("no-such-node")
