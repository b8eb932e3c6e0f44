"""Tensor-anatomy marks on the graph, checked on captured examples and on hand-built calls.

In-place ops, stale saved tensors and device changes are always marked; storage-sharing links
and view tags only while ``set_show_sharing(True)``.
"""

from __future__ import annotations

import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from tests.fixtures_graphs import call as make_call
from tests.fixtures_graphs import leaf, mul_call, node, tensor
from widgets.graph.painting import color
from widgets.graph.marks import ShareLinkItem
from widgets.graph.scene import tooltip
from widgets.graph.view import GraphView
from widgets.theme import THEMES

VIEW_SIZE = (1000, 750)  # the shared ``view`` fixture (tests/conftest.py) at this size

EXAMPLES = Path(__file__).resolve().parents[2] / "resources" / "examples"

SQUARE = """\
    import torch

    a = torch.randn(3, requires_grad=True)
    b = a.sigmoid()
    c = b * b
    c.sum().backward()
    """

VIEW = """\
    import torch

    w = torch.randn(3, 4, requires_grad=True)
    b = w * 2
    bt = b.t()
    y = b.sin().sum() + bt.cos().sum()
    y.backward()
    """


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """08_inplace_error and two small scripts, captured once (torch runs in this process)."""
    pytest.importorskip("torch")
    from core.worker.capture.recorder import capture_script

    folder = tmp_path_factory.mktemp("scripts")
    out = {"08": capture_script(str(EXAMPLES / "08_inplace_error.py"))}
    for name, source in (("square", SQUARE), ("view", VIEW)):
        path = folder / f"{name}.py"
        path.write_text(textwrap.dedent(source))
        out[name] = capture_script(str(path))
    return out


def by_name(call, name: str):
    return next(n for n in call.nodes if n.name == name)


def tags(view: GraphView, kind: str) -> dict:
    return {t.target: t.text for t in view.marks.tags if t.kind == kind}


def links(view: GraphView) -> set[tuple[str, frozenset]]:
    return {(link.storage, frozenset(link.ends)) for link in view.marks.links}


def scene_links(view: GraphView) -> list[ShareLinkItem]:
    return [i for i in view.scene().items() if isinstance(i, ShareLinkItem)]


def test_stale_and_inplace_nodes_are_marked(view, traces):
    call = traces["08"].calls[0]
    view.set_call(call, sync=True)
    sigmoid, mul = by_name(call, "SigmoidBackward0"), by_name(call, "MulBackward0")
    assert tags(view, "stale") == {sigmoid.id: "\u26a0 stale: result v0 \u2192 v1"}
    assert tags(view, "inplace") == {mul.id: "\u270e in-place mul_"}
    assert view.node_items[sigmoid.id].style.stale and not view.node_items[mul.id].style.stale
    stale_tag = next(t for t in view.marks.tags if t.kind == "stale")
    assert stale_tag.toolTip() == (
        "b (saved as 'result') was saved at version 0 by SigmoidBackward0; "
        "mul_ at line 12 changed it in place (now version 1): backward will fail here."
    )
    assert tooltip(call, sigmoid.id).splitlines()[-1] == stale_tag.toolTip()
    assert "made by the in-place op mul_" in tooltip(call, mul.id).splitlines()
    inplace_tag = next(t for t in view.marks.tags if t.kind == "inplace")
    assert inplace_tag.toolTip().startswith("In-place op: mul_ at line 12 changed b in place.")
    assert "SigmoidBackward0 saved the old value: backward fails there." in inplace_tag.toolTip()
    # the tags hang from their node's bottom border
    for tag, nid in ((stale_tag, sigmoid.id), (inplace_tag, mul.id)):
        box, rect = view.node_items[nid].sceneBoundingRect(), tag.sceneBoundingRect()
        assert rect.intersects(box) and rect.bottom() > box.bottom() - 10
    assert view.legend.entries() == ["op", "leaf", "error", "stale", "inplace"]
    assert links(view) == set() and not tags(view, "view") and not tags(view, "device")


def test_stale_saved_box_is_marked(view, traces):
    call = traces["08"].calls[0]
    view.set_show_saved(True, sync=True)
    view.set_call(call, sync=True)
    sigmoid = by_name(call, "SigmoidBackward0")
    assert tags(view, "stale") == {
        sigmoid.id: "\u26a0 stale: result v0 \u2192 v1",
        ("saved", sigmoid.id, "result"): "\u26a0",
    }
    box = next(s for s in view.saved_items if s.saved.node == sigmoid.id)
    assert box.saved.state == "stale"
    assert box.toolTip().startswith("saved for backward: result\nb (saved as 'result') was saved at version 0")


def test_sharing_links_the_stale_result_to_the_tensor_changed_in_place(view, traces, tmp_path):
    call = traces["08"].calls[0]
    b = next(t for t in call.tensors if t.name == "b")
    sigmoid, mul = by_name(call, "SigmoidBackward0"), by_name(call, "MulBackward0")
    view.set_show_saved(True, sync=True)
    view.set_call(call, sync=True)
    assert scene_links(view) == []
    rect_off = view.scene().sceneRect()
    view.set_show_sharing(True)
    assert links(view) == {(b.storage, frozenset({mul.id, ("saved", sigmoid.id, "result")}))}
    assert b.storage == "s3" and len(scene_links(view)) == 1
    tip = view.marks.links[0].toolTip()
    assert tip.splitlines()[0] == "Same storage s3 (12 bytes on cpu): these tensors share one block of memory,"
    assert "b, output of MulBackward0" in tip and "b, saved as 'result' by SigmoidBackward0" in tip
    assert view.legend.entries()[-3:] == ["stale", "inplace", "sharing"]
    image = view.grab().toImage()
    assert view.grab().save(str(tmp_path / "08_saved_sharing.png"))
    found = {image.pixelColor(x, y).name() for x in range(0, image.width(), 2) for y in range(0, image.height(), 2)}
    theme = THEMES["light"]
    assert {color(theme.sharing).name(), color(theme.error).name(), color(theme.inplace).name()} <= found
    view.set_show_saved(False, sync=True)  # without saved boxes the nodes themselves are linked
    assert links(view) == {(b.storage, frozenset({mul.id, sigmoid.id}))}
    view.set_show_sharing(False)
    assert scene_links(view) == [] and "sharing" not in view.legend.entries()
    assert tags(view, "stale") and tags(view, "inplace")  # always on
    view.set_show_saved(True, sync=True)
    assert view.scene().sceneRect() == rect_off


def test_a_tensor_saved_twice_is_linked(view, traces):
    call = traces["square"].calls[0]
    b = next(t for t in call.tensors if t.name == "b")
    mul, sigmoid = by_name(call, "MulBackward0"), by_name(call, "SigmoidBackward0")
    view.set_show_sharing(True)
    view.set_call(call, sync=True)
    assert links(view) == {(b.storage, frozenset({mul.id, sigmoid.id}))}
    view.set_show_saved(True, sync=True)
    # b*b saves b as self and other; sigmoid saves its result b: three boxes, two lines
    boxes = {("saved", mul.id, "self"), ("saved", mul.id, "other"), ("saved", sigmoid.id, "result")}
    assert len(scene_links(view)) == 2
    assert {s for s, _ in links(view)} == {b.storage} and set().union(*(e for _, e in links(view))) == boxes
    assert all(link.storage == b.storage for link in view.marks.links)
    assert not tags(view, "view") and "view" not in view.legend.entries()


def test_views_are_tagged_with_their_base(view, traces):
    call = traces["view"].calls[0]
    b = next(t for t in call.tensors if t.name == "b")
    t_node, cos = by_name(call, "TBackward0"), by_name(call, "CosBackward0")
    view.set_show_saved(True, sync=True)
    view.set_call(call, sync=True)
    assert not tags(view, "view")
    view.set_show_sharing(True)
    assert tags(view, "view") == {t_node.id: "view of b", ("saved", cos.id, "self"): "view of b"}
    tip = next(t for t in view.marks.tags if t.target == t_node.id).toolTip()
    assert tip == (
        "bt is a view of b: the same storage s1 seen with shape 4×3, stride (1, 4) and offset 0; no copy was made."
    )
    # b (MulBackward0's output), sin's saved self, bt (TBackward0) and cos's saved self share b's storage
    assert {s for s, _ in links(view)} == {b.storage} and len(scene_links(view)) == 3
    assert view.legend.entries()[-2:] == ["sharing", "view"]


def device_call(second: str):
    """``y = x.to(second); loss = (y * 3).sum()``: a ToCopyBackward0 where the device changes."""
    tensors = [
        tensor("t_x", "x", [3]),
        replace(tensor("t_y", "y", [3], is_leaf=False, grad_fn="n2"), device=second),
        replace(tensor("t_loss", "loss", [], is_leaf=False, grad_fn="n0"), device=second),
    ]
    nodes = [
        replace(node("n0", "SumBackward0", ["n1"], label="loss", tensor_id="t_loss", line=4), device=second),
        replace(node("n1", "MulBackward0", ["n2", None], line=4), device=second),
        replace(node("n2", "ToCopyBackward0", ["n3"], label="y", tensor_id="t_y", line=3), device=second),
        leaf("n3", "t_x", "x"),  # AccumulateGrad: no device of its own, the leaf's
    ]
    return make_call(nodes, tensors, ["n0"])


def test_device_change_is_marked_on_its_edge(view):
    view.set_call(device_call("cuda:0"), sync=True)
    assert tags(view, "device_edge") == {("n2", "n3"): "cuda:0 \u2192 cpu"}  # the way the gradient goes
    accented = [e.key for e in view.edge_items if e.accent]
    assert accented == [("n2", "n3")]
    tip = next(t for t in view.marks.tags if t.kind == "device_edge").toolTip()
    assert tip.startswith("Device change: the forward pass moved data from cpu to cuda:0 here")
    assert tags(view, "device") == {"n0": "cuda:0", "n1": "cuda:0", "n2": "cuda:0", "n3": "cpu"}
    assert view.legend.entries()[-1] == "device"
    view.set_theme("print")
    assert all(t.theme.name == "print" for t in view.marks.tags)


def test_one_device_draws_nothing_extra(view):
    view.set_call(device_call("cpu"), sync=True)
    assert view.marks.tags == [] and view.marks.links == []
    assert not any(e.accent for e in view.edge_items)
    assert "device" not in view.legend.entries()


def test_saved_leaves_are_linked_to_their_leaf(view):
    view.set_show_saved(True, sync=True)
    view.set_call(mul_call(), sync=True)
    assert view.marks.items() == []
    assert view.legend.entries() == ["op", "leaf", "saved"]
    view.set_show_sharing(True)  # MulBackward0 saved a and b themselves: no copies
    assert links(view) == {
        ("s_t_a", frozenset({("saved", "n0", "self"), "n1"})),
        ("s_t_b", frozenset({("saved", "n0", "other"), "n2"})),
    }
    assert view.legend.entries() == ["op", "leaf", "saved", "sharing"]
    c = mul_call()  # c made a view of a: its node is tagged
    viewed = replace(c.tensors[2], is_view=True, base="t_a", storage="s_t_a")
    view.set_call(replace(c, tensors=[*c.tensors[:2], viewed]), sync=True)
    assert tags(view, "view") == {"n0": "view of a"}
    assert len(links(view)) == 2


def test_a_failed_op_mark_has_its_legend_entry(view, tmp_path):
    """The red pill of the op a forward pass raised in is explained in the legend, on screen and
    in the SVG export, with a pill like it as its sample."""
    import re

    from tests.widgets.test_forward_error_marks import mm_mismatch
    from widgets.export import graph_export as export
    from widgets.graph.minimap import LEGEND_ENTRIES

    view.set_call(mm_mismatch(), sync=True)
    assert view.legend.entries() == ["op", "leaf", "failed_op"]
    assert LEGEND_ENTRIES["failed_op"][0] == "failed in forward: the op the script raised in"
    texts = re.findall(r">([^<]+)</text>", export.render_svg(view, tmp_path / "failed.svg").read_text())
    assert texts[-4:] == ["leaf tensor (AccumulateGrad)", "failed", "failed in forward: the op the script raised in",
                          "arrows: gradients, from the loss to the leaves"]
    view.set_call(mul_call(), sync=True)  # a healthy graph: no such entry
    assert "failed_op" not in view.legend.entries()
