"""The op a forward pass failed in, drawn on the graph it failed on, and a failed run's export
titled by its error. The calls are the ones capture records for each error (see
tests/core/worker/test_forward_errors.py), built here without torch."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import QRectF

from app.session.opening import opening_call
from core.model.forward_errors import mark_tip
from core.model.trace import ErrorInfo, Trace
from tests.fixtures_graphs import call as make_call
from tests.fixtures_graphs import leaf, mul_call, node, tensor
from widgets.export import graph_export as export
from widgets.export.sheet import MARGIN, TITLE_WIDE
from widgets.graph.marks import FailLinkItem

SVG = "{http://www.w3.org/2000/svg}"
LEAF = "a leaf Variable that requires grad is being used in an in-place operation."
NUMPY = "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead."
MM = "mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"


def _input(position, name, shape, requires_grad, is_leaf, node_id):
    return {"position": position, "name": name, "shape": shape, "dtype": "float32", "requires_grad": requires_grad,
            "is_leaf": is_leaf, "node": node_id}


def _failed(nodes, tensors, roots, op, index=0):
    call = make_call(nodes, tensors, roots, index=index, api="unreached")
    return replace(call, line=None, options={"failed_op": op})


def leaf_inplace():
    """resources/examples/18_inplace_on_leaf.py: ``x += 1`` at line 17 on the leaf x."""
    op = {"name": "add_", "text": "x.add_(1)", "line": 17, "inputs": [_input(0, "x", [2], True, True, "n0")],
          "type": "RuntimeError", "message": LEAF}
    return _failed([leaf("n0", "t0", "x")], [tensor("t0", "x", [2])], ["n0"], op, index=1)


def numpy_on_grad():
    """``h = w * 2; a = h.numpy()`` at line 4."""
    op = {"name": "numpy", "text": "h.numpy()", "line": 4, "inputs": [_input(0, "h", [3], True, False, "n0")],
          "type": "RuntimeError", "message": NUMPY}
    nodes = [node("n0", "MulBackward0", ["n1", None], label="h", tensor_id="t1"), leaf("n1", "t0", "w")]
    tensors = [tensor("t0", "w", [3]), tensor("t1", "h", [3], is_leaf=False, grad_fn="n0")]
    return _failed(nodes, tensors, ["n0"], op)


def mm_mismatch():
    """``torch.mm(h, w)`` at line 6 with h 2×3 (h = x * 2) and w 4×5."""
    op = {"name": "mm", "text": "torch.mm(h, w)", "line": 6, "type": "RuntimeError", "message": MM,
          "inputs": [_input(0, "h", [2, 3], True, False, "n0"), _input(1, "w", [4, 5], True, True, "n2")]}
    nodes = [node("n0", "MulBackward0", ["n1", None], label="h", tensor_id="t2"), leaf("n1", "t0", "x"),
             leaf("n2", "t1", "w")]
    tensors = [tensor("t0", "x", [2, 3]), tensor("t1", "w", [4, 5]), tensor("t2", "h", [2, 3], is_leaf=False,
                                                                              grad_fn="n0")]
    return _failed(nodes, tensors, ["n0", "n2"], op)


CASES = {
    "inplace": (leaf_inplace, ("n0",),
                "x.add_(1) failed: a leaf that requires grad cannot be changed in place (line 17)",
                f"RuntimeError at line 17: {LEAF}"),
    "numpy": (numpy_on_grad, ("n0",),
              "h.numpy() failed: a tensor that requires grad has no .numpy(); call h.detach().numpy() (line 4)",
              f"RuntimeError at line 4: {NUMPY}"),
    "mm": (mm_mismatch, ("n0", "n2"),
           "torch.mm(h, w) failed: shapes 2×3 and 4×5 cannot be multiplied (3 ≠ 4) (line 6)",
           f"RuntimeError at line 6: {MM}"),
}


def _failed_marks(view):
    tags = [t for t in view.marks.tags if t.kind == "failed"]
    return tags, view.marks.failed


def _svg_texts(path: Path) -> list[str]:
    root = ET.parse(path).getroot()
    return ["".join(t.itertext()) for t in root.iter(SVG + "text")]


def _svg_title(path: Path) -> str:
    return ET.parse(path).getroot().find(SVG + "title").text


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_failed_op_is_marked_above_the_inputs_it_failed_on(view, case):
    make, boxes, text, _ = CASES[case]
    call = make()
    view.set_call(call, sync=True)
    tags, links = _failed_marks(view)
    assert [(t.text, t.target) for t in tags] == [(text, ("failed", boxes))]
    assert tags[0].toolTip() == mark_tip(call.options["failed_op"])
    mark = tags[0].sceneBoundingRect()
    layout = view.graph_layout()
    # top down, the op would consume its inputs from above: the mark sits over their boxes,
    # a dashed line from its bottom to the top middle of each
    assert len(links) == 1 and isinstance(links[0], FailLinkItem) and links[0].targets == boxes
    for (start, end), box in zip(links[0].lines, boxes):
        b = layout.nodes[box]
        assert mark.bottom() < b.y and (end.x(), end.y()) == (b.x + b.w / 2, b.y)
        assert start.y() == pytest.approx(mark.bottom() - 1, abs=1.01)
    left = min(layout.nodes[b].x for b in boxes)
    right = max(layout.nodes[b].x + layout.nodes[b].w for b in boxes)
    assert mark.center().x() == pytest.approx((left + right) / 2, abs=1.01)
    # no other node of the graph is marked as failed
    assert all(not item.style.error for item in view.node_items.values())


def test_left_to_right_the_mark_stands_left_of_the_input(view):
    view.direction = "LR"
    view.set_call(leaf_inplace(), sync=True)
    (tag,), (link,) = _failed_marks(view)
    b = view.graph_layout().nodes["n0"]
    mark = tag.sceneBoundingRect()
    assert mark.right() < b.x and b.y < mark.center().y() < b.y + b.h
    ((_, end),) = link.lines
    assert (end.x(), end.y()) == (b.x, b.y + b.h / 2)


def test_in_forward_order_the_mark_stands_below_the_input(view):
    view.direction = "forward"
    view.set_call(numpy_on_grad(), sync=True)
    (tag,), (link,) = _failed_marks(view)
    b = view.graph_layout().nodes["n0"]
    assert tag.sceneBoundingRect().top() > b.y + b.h
    ((_, end),) = link.lines
    assert (end.x(), end.y()) == (b.x + b.w / 2, b.y + b.h)


def device_mismatch_under_a_consumer():
    """resources/examples/26_device_mismatch.py: ``fine = on_meta * also_meta`` sits above
    ``on_meta = w.to("meta")``, then ``on_meta.mul(cpu_tensor)`` fails at line 16."""
    msg = "Tensor on device cpu is not on the expected device meta!"
    op = {"name": "mul", "text": "on_meta.mul(cpu_tensor)", "line": 16, "type": "RuntimeError", "message": msg,
          "inputs": [_input(0, "on_meta", [3], True, False, "n1")]}
    nodes = [node("n0", "MulBackward0", ["n1", None], label="fine", tensor_id="t2"),
             node("n1", "ToCopyBackward0", ["n2"], label="on_meta", tensor_id="t1"), leaf("n2", "t0", "w")]
    tensors = [tensor("t0", "w", [3]), tensor("t1", "on_meta", [3], is_leaf=False, grad_fn="n1"),
               tensor("t2", "fine", [3], is_leaf=False, grad_fn="n0")]
    return _failed(nodes, tensors, ["n0"], op)


def test_a_mark_with_no_room_above_its_input_stands_beside_it_covering_no_node(view):
    view.set_call(device_mismatch_under_a_consumer(), sync=True)
    (tag,), (link,) = _failed_marks(view)
    assert tag.text == "on_meta.mul(cpu_tensor) failed: a tensor on cpu meets one on meta: move one with .to() (line 16)"
    layout = view.graph_layout()
    mark = tag.sceneBoundingRect()
    for b in layout.nodes.values():
        assert not mark.intersects(QRectF(b.x, b.y, b.w, b.h)), b.id
    b = layout.nodes["n1"]
    assert mark.left() > b.x + b.w and b.y < mark.center().y() < b.y + b.h  # to the right of on_meta
    ((start, end),) = link.lines
    assert (end.x(), end.y()) == (b.x + b.w, b.y + b.h / 2) and start.x() == pytest.approx(mark.left(), abs=1.01)


def test_a_call_that_did_not_fail_in_forward_has_no_failed_mark(view):
    view.set_call(mul_call(), sync=True)
    assert _failed_marks(view) == ([], [])


def test_a_failed_op_without_input_graph_stands_over_the_graph_unjoined(view):
    call = leaf_inplace()
    op = dict(call.options["failed_op"], inputs=[_input(0, None, [2], False, True, None)], text="tensor(2).add_(1)")
    view.set_call(replace(call, options={"failed_op": op}), sync=True)
    (tag,), links = _failed_marks(view)
    assert tag.target == ("failed", ()) and links == []
    assert tag.sceneBoundingRect().bottom() < view.graph_layout().nodes["n0"].y


# -- exports ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_svg_of_a_failed_graph_is_titled_by_its_error(qapp, tmp_path, case):
    make, _, text, title = CASES[case]
    path = export.export_call(make(), tmp_path / f"{case}.svg")
    assert _svg_title(path) == title
    texts = _svg_texts(path)
    drawn = " ".join(t.strip() for t in texts if t.strip())
    assert title in drawn and text in texts
    assert not any("This call raised" in t for t in texts)


def test_a_failed_runs_other_graph_is_titled_by_the_runs_error(qapp, tmp_path):
    """``main.py export`` of the run's first call (backward ran fine, the script failed later)."""
    healthy = mul_call()
    error = ErrorInfo(type="RuntimeError", message=LEAF, line=17, failed_op={
        **{k: v for k, v in leaf_inplace().options["failed_op"].items() if k not in ("type", "message")},
        "call": "c1"})
    trace = Trace(calls=[healthy, leaf_inplace()], error=error, call_count=1)
    svg = export.export_call(healthy, tmp_path / "first.svg", trace=trace)
    assert _svg_title(svg) == f"RuntimeError at line 17: {LEAF}"
    pdf = export.export_call(healthy, tmp_path / "first.pdf", trace=trace)
    assert b"/Title (\xfe\xff" + f"RuntimeError at line 17: {LEAF}".encode("utf-16-be") + b")" in pdf.read_bytes()
    plain = export.export_call(healthy, tmp_path / "plain.svg")
    assert _svg_title(plain) == "Backprop Studio graph"
    stopped = replace(trace, error=ErrorInfo(type="Stopped", message="stopped by you at line 3", kind="cancelled"))
    assert _svg_title(export.export_call(healthy, tmp_path / "stop.svg", trace=stopped)) == "Backprop Studio graph"


def test_the_windows_default_title_gives_way_to_the_error_and_a_given_one_keeps_it_below(qapp, tmp_path, view):
    call = leaf_inplace()
    view.set_call(call, sync=True)
    error = f"RuntimeError at line 17: {LEAF}"
    # the export dialog offers the call's title ("#1 unreached (no line)") as the default
    default = export.render(view, tmp_path / "default.svg", title=call.title)
    assert _svg_title(default) == error
    given = export.render(view, tmp_path / "given.svg", title="Lesson 3")
    assert _svg_title(given) == "Lesson 3"
    drawn = " ".join(t.strip() for t in _svg_texts(given) if t.strip())
    assert drawn.startswith("Lesson 3 ") and error in drawn


def test_a_long_error_title_wraps_instead_of_widening_the_sheet(qapp, view):
    call = leaf_inplace()
    view.set_call(call, sync=True)
    sheet = export.make_sheet(view)
    assert sheet.title == f"RuntimeError at line 17: {LEAF}"
    assert sheet.width <= TITLE_WIDE + 2 * MARGIN
    short = export.make_sheet(view, title="Lesson 3")
    assert sheet.title_rect.height() > 1.5 * short.title_rect.height()


def test_a_failed_run_opens_on_the_graph_it_failed_on():
    trace = Trace(calls=[mul_call(), leaf_inplace()], error=ErrorInfo(type="RuntimeError", message=LEAF, line=17))
    assert opening_call(trace).id == "c1"
    assert opening_call(replace(trace, calls=[mul_call()])).id == "c0"


@pytest.mark.slow
def test_main_export_of_a_failed_run_is_titled_by_its_error_and_still_fails(tmp_path):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "leaf.svg"
    result = subprocess.run([sys.executable, "main.py", "export", "resources/examples/18_inplace_on_leaf.py", "-o",
                             str(out)], cwd=root, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert result.stdout == f"{out}: call #0 (Tensor.backward), 3 nodes\n"
    assert result.stderr.splitlines()[-1] == (
        f"backprop-studio export: resources/examples/18_inplace_on_leaf.py: the script raised RuntimeError: {LEAF} "
        "(line 17); exported the graph as captured")
    assert _svg_title(out) == f"RuntimeError at line 17: {LEAF}"
