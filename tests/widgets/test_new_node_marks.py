"""The nodes made since a forward pause's last pause glow on the graph, through folds and relayouts."""

from __future__ import annotations

from PySide6.QtCore import QPointF
from PySide6.QtGui import QColor

from tests.fixtures_graphs import mlp_call
from widgets.graph.new_nodes import NEW_COLOURS, NewGlowItem, NewNodeMarks, NewTagItem


def _pixel(view, scene_point: QPointF) -> QColor:
    image = view.viewport().grab().toImage()
    p = view.mapFromScene(scene_point)
    return QColor(image.pixel(p.x(), p.y()))


def _greenish(c: QColor) -> bool:
    """The light theme's new colour #0ca678, or a blend of it over the background."""
    return c.green() > c.red() + 40 and c.green() > c.blue()


def test_only_the_new_nodes_glow_with_a_new_tag(qtbot, view):
    view.set_call(mlp_call(), sync=True)
    view.fit()
    qtbot.wait(50)
    new, old = view.node_items["n1"].box, view.node_items["n7"].box
    beside_new, beside_old = QPointF(new.x - 2, new.y + new.h / 2), QPointF(old.x - 2, old.y + old.h / 2)
    before = _pixel(view, beside_new).name(), _pixel(view, beside_old).name()
    assert not _greenish(QColor(before[0]))
    marks = NewNodeMarks(view)
    marks.set_nodes({"n0", "n1"}, tip="Made since the last pause (2 nodes added since the last pause)")
    assert marks.boxes() == ["n0", "n1"]
    glows = [i for i in view.scene().items() if isinstance(i, NewGlowItem)]
    tags = [i for i in view.scene().items() if isinstance(i, NewTagItem)]
    assert sorted(g.box_id for g in glows) == ["n0", "n1"] and sorted(t.box_id for t in tags) == ["n0", "n1"]
    for glow in glows:
        box = view.node_items[glow.box_id].box
        assert glow.rect.getRect() == (box.x, box.y, box.w, box.h)
        assert glow.zValue() < view.node_items[glow.box_id].zValue()  # behind the box: its text stays clear
        assert glow.toolTip() == "Made since the last pause (2 nodes added since the last pause)"
    # Pixels: just left of a new box the glow; left of an old one what was there before.
    qtbot.wait(50)
    assert _greenish(_pixel(view, beside_new))
    assert _pixel(view, beside_old).name() == before[1]
    assert QColor(NEW_COLOURS["light"]).name() == "#0ca678"


def test_a_new_node_in_a_folded_module_marks_the_module_and_survives_relayouts(qtbot, view):
    view.set_call(mlp_call(), sync=True)
    marks = NewNodeMarks(view)
    marks.set_nodes({"n7", "n9"})  # fc1's AddmmBackward0 and TBackward0
    assert marks.boxes() == ["n7", "n9"]
    view.set_collapsed({"fc1"}, sync=True)
    assert view.box_of("n7") == "group:fc1"
    assert marks.boxes() == ["group:fc1"]  # one mark for the folded module, drawn on the new scene
    view.set_collapsed(set(), sync=True)
    assert marks.boxes() == ["n7", "n9"]
    marks.clear()
    assert marks.boxes() == [] and not [i for i in view.scene().items() if isinstance(i, NewGlowItem)]
