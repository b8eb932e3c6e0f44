"""The storage map (offsets, blocks, sharing, values, grid) and the storage view built from it."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QColor, QPalette

from core.model.storage_map import (
    StorageGrid, block_coverage, block_size, cell_description, contiguity, covered_blocks, covered_offsets, index_of,
    sharing, storage_numel, storage_picture, storage_values, stride_sentence,
)
from core.model.trace import StorageInfo, TensorInfo, Values
from widgets.storage.view import StorageView

EXAMPLES = Path(__file__).resolve().parents[2] / "resources" / "examples"
ARANGE = [float(i) for i in range(12)]


def tensor(tid, name, shape, stride, offset=0, *, storage="s0", nbytes=48, base=None, data=None, values=None):
    """A float32 TensorInfo on storage ``storage`` (12 floats unless ``nbytes`` says otherwise)."""
    numel = math.prod(shape)
    return TensorInfo(
        id=tid, name=name, shape=shape, dtype="float32", device="cpu", requires_grad=False, is_leaf=True,
        retains_grad=False, stride=stride, storage_offset=offset, storage=storage, version=1,
        values=values or Values(numel=numel, data=data), base=base, is_view=base is not None, element_size=4,
        nbytes=nbytes,
    )


def strided(data, shape, stride, offset):
    return [data[o] for o in covered_offsets(shape, stride, offset)]


def views() -> list[TensorInfo]:
    """x = arange(12.).view(3, 4) and views of it, as 20_views_and_strides.py and 22_indexing_views.py make them."""
    specs = [("x", [3, 4], [4, 1], 0), ("transposed", [4, 3], [1, 4], 0), ("row", [4], [1], 4),
             ("second_column", [3], [4], 1), ("every_other_row", [2, 4], [8, 1], 0)]
    out = [tensor("t0", None, [12], [1], data=ARANGE)]
    for i, (name, shape, stride, offset) in enumerate(specs, start=1):
        out.append(tensor(f"t{i}", name, shape, stride, offset, base="t0",
                          data=strided(ARANGE, shape, stride, offset)))
    return out


def by_name(tensors, name) -> TensorInfo:
    return next(t for t in tensors if t.name == name)


# -- offsets ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("shape", "stride", "offset", "expected"), [
    ([3, 4], [4, 1], 0, list(range(12))),  # x
    ([4, 3], [1, 4], 0, [0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]),  # x.t() and x.permute(1, 0)
    ([4], [1], 4, [4, 5, 6, 7]),  # x[1]
    ([12], [1], 0, list(range(12))),  # x.view(-1)
    ([3], [4], 1, [1, 5, 9]),  # x[:, 1]
    ([2, 4], [8, 1], 0, [0, 1, 2, 3, 8, 9, 10, 11]),  # x[::2]
    ([2, 2], [4, 1], 5, [5, 6, 9, 10]),  # x[1:, 1:3]
    ([2, 3], [0, 1], 0, [0, 1, 2, 0, 1, 2]),  # expand: stride 0 visits cells twice
    ([], [], 7, [7]),  # a scalar
    ([0, 4], [4, 1], 0, []),  # empty
])
def test_covered_offsets(shape, stride, offset, expected):
    assert covered_offsets(shape, stride, offset) == expected


def test_covered_offsets_is_bounded():
    assert covered_offsets([2000, 1000], [1000, 1], 0) is None
    assert covered_offsets([3, 4], [4], 0) is None  # shape and stride disagree
    assert covered_offsets([10, 10], [10, 1], 0, limit=50) is None


def test_contiguity_and_storage_numel():
    assert contiguity([3, 4], [4, 1]) and contiguity([12], [1]) and contiguity([1, 4], [99, 1])
    assert not contiguity([4, 3], [1, 4])
    assert not contiguity([2, 4], [8, 1])  # x[::2] skips a row
    assert not contiguity([3], [4])
    assert storage_numel(tensor("t", "x", [3, 4], [4, 1])) == 12
    assert storage_numel(tensor("t", "x", [4], [1], nbytes=400)) == 100


def test_index_of_and_sentence():
    assert index_of(5, [4, 3]) == (1, 2)
    assert index_of(0, []) == ()
    assert stride_sentence([4, 3], [1, 4], 0, "transposed").endswith("dim 0 +1, dim 1 +4.")
    assert stride_sentence([4], [1], 4, "row").startswith("row[0] is storage[4]")


# -- blocks ----------------------------------------------------------------------------------


def test_block_coverage_of_a_big_storage():
    n = 100_000  # w = torch.zeros(1000, 100)
    assert block_size(n, 1024) == 128
    half = block_coverage([500, 100], [100, 1], 50_000, n, 1024)  # w[500:]
    assert len(half) == 782
    assert half[:390] == [0.0] * 390
    assert half[390] == pytest.approx((50_048 - 50_000) / 128)
    assert half[391:] == [1.0] * (782 - 391)  # the last block holds 32 elements, all covered
    assert covered_blocks([500, 100], [100, 1], 50_000, n, 1024).count(True) == 392
    cols = block_coverage([1000, 10], [100, 1], 10, n, 1024)  # w[:, 10:20]: 10 of every 100
    assert sum(f * 128 for f in cols[:-1]) + cols[-1] * 32 == pytest.approx(10_000)
    assert max(cols) <= 20 / 128


def test_block_coverage_summarises_huge_tensors_fast():
    n = 1_000_000_000  # a (10000, 100000) storage: never enumerated
    start = time.process_time()  # CPU time: other processes on the machine do not count
    dense = block_coverage([10_000, 100_000], [100_000, 1], 0, n, 1024)
    upper = block_coverage([5_000, 100_000], [100_000, 1], 0, n, 1024)
    transposed = block_coverage([100_000, 10_000], [1, 100_000], 0, n, 1024)
    assert time.process_time() - start < 5
    assert dense == pytest.approx([1.0] * len(dense))
    assert sum(upper) == pytest.approx(len(upper) / 2, abs=1)
    assert transposed[1:-1] == pytest.approx([1.0] * (len(transposed) - 2), rel=1e-3)
    assert min(transposed) > 0.9  # strided dims are summarised at even density: edges are estimates


def test_block_coverage_summary_matches_exact_when_dense():
    exact = block_coverage([40, 50], [100, 1], 30, 4000, 64)
    summary = block_coverage([40, 50], [100, 1], 30, 4000, 64, limit=100)
    assert summary == pytest.approx(exact)


# -- sharing and values ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def views_trace():
    pytest.importorskip("torch")
    from core.worker.capture.recorder import capture_script

    return capture_script(str(EXAMPLES / "20_views_and_strides.py"))


def test_sharing_relations_on_the_views_example(views_trace):
    tensors = views_trace.tensors
    transposed, x = by_name(tensors, "transposed"), by_name(tensors, "x")
    base = next(t for t in tensors if t.id == transposed.base)
    base_label = base.name or f"{base.id} (unnamed)"
    relations = {(t.name or t.id): rel for t, rel in sharing(tensors, transposed.id)}
    assert relations == {
        "x": f"view of {base_label}", (base.name or base.id): "base of transposed",
        "row": f"view of {base_label}", "flat": f"view of {base_label}", "permuted": f"view of {base_label}",
    }
    assert "reshaped" not in relations and "compact" not in relations  # copies: new storage
    assert sharing(tensors, by_name(tensors, "compact").id) == []
    assert (base.id, "base of x") in [(t.id, rel) for t, rel in sharing(tensors, x.id)]
    assert covered_offsets(transposed.shape, transposed.stride, transposed.storage_offset) == \
        [0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]
    row = by_name(tensors, "row")
    assert (row.storage_offset, row.stride) == (4, [1])
    pic = storage_picture(tensors, row.id, views_trace.storages)
    assert pic.values == [0.0, 1.0, 2.0, 3.0, 100.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0]  # after row[0] = 100


def test_detach_shares_storage():
    x = tensor("t0", "x", [3], [1], nbytes=12, data=[0.0, 0.0, 0.0])
    detached = tensor("t1", "detached", [3], [1], nbytes=12, data=[0.0, 0.0, 0.0])
    other = tensor("t2", "other", [3], [1], storage="s1", nbytes=12)
    assert [(t.id, rel) for t, rel in sharing([x, detached, other], "t0")] == [("t1", "detach() / same data")]
    assert sharing([x, detached, other], "t2") == []
    assert sharing({"t0": x}, "missing") == []


def test_storage_values_fill_every_cell_from_the_base():
    tensors = views()
    row = by_name(tensors, "row")
    assert storage_values(tensors, row.id, 12) == ARANGE
    alone = [tensor("t9", "row", [4], [1], 4, data=[4.0, 5.0, 6.0, 7.0])]
    assert storage_values(alone, "t9", 12) == [None] * 4 + [4.0, 5.0, 6.0, 7.0] + [None] * 4
    assert storage_values(alone, "t9", 5000) is None


def test_picture_and_tooltip():
    tensors = views()
    pic = storage_picture(tensors, by_name(tensors, "transposed").id)
    assert (pic.count, pic.block, pic.storage_numel) == (12, 1, 12)
    assert pic.first_step[4] == 1 and pic.first_step[1] == 3
    assert cell_description(pic, 4) == "storage[4] = 4.0\ntransposed[0,1], element 1 in row-major order"
    big = [tensor("b0", "w", [1000, 100], [100, 1], nbytes=400_000, values=Values(numel=100_000))]
    pic = storage_picture(big, "b0")
    assert (pic.block, pic.count, pic.values) == (128, 782, None)
    assert cell_description(pic, 781) == "storage[99,968..99,999]: 100% covered by w"


# -- grid geometry ---------------------------------------------------------------------------


def test_grid_wraps_and_routes_hops_around_cells():
    tensors = views()
    pic = storage_picture(tensors, by_name(tensors, "transposed").id)
    wide = StorageGrid.for_picture(pic, 2000)
    assert wide.cols == 12 and wide.rows == 1
    grid = StorageGrid.for_picture(pic, 380)
    assert grid.cols == 4 and grid.rows == 3
    rects = [grid.cell(i) for i in range(12)]
    for i, (x, y, w, h) in enumerate(rects):
        assert grid.cell_at(x + w / 2, y + h / 2) == i
        for (x2, y2, w2, h2) in rects[i + 1:]:
            assert x + w <= x2 or x2 + w2 <= x or y + h <= y2 or y2 + h2 <= y
    assert grid.cell_at(grid.left - 2, rects[0][1] + 5) is None
    for lane, (a, b) in enumerate(zip(pic.offsets, pic.offsets[1:])):
        kind, pts = grid.hop(a, b, lane)
        assert kind == "route" and len(pts) >= 2
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            assert x0 == x1 or y0 == y1  # axis-aligned
            for t in (0.25, 0.5, 0.75):  # samples along the route stay out of every cell
                assert grid.cell_at(x0 + (x1 - x0) * t, y0 + (y1 - y0) * t) is None
    kind, pts = wide.hop(0, 4)
    assert kind == "arc" and pts[1][1] < pts[0][1]  # going right: above the row
    kind, pts = wide.hop(8, 1)
    assert kind == "arc" and pts[1][1] > pts[0][1]  # going left: below the row


# -- the widget ------------------------------------------------------------------------------


@pytest.fixture
def view(qtbot):
    widget = StorageView()
    qtbot.addWidget(widget)
    widget.resize(960, 600)
    widget.show()
    return widget


def cell_color(view: StorageView, index: int) -> QColor:
    """Colour just inside a cell's bottom-left corner, clear of its text."""
    rect = view.cell_rect(index)
    image = view.canvas.grab().toImage()
    return image.pixelColor(QPoint(int(rect.left() + 5), int(rect.bottom() - 5)))


def test_view_of_transposed_and_sliced(view):
    tensors = views()
    view.set_tensor(tensors, by_name(tensors, "transposed").id)
    assert view.highlighted_offsets() == [0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]
    assert view.highlighted_cells() == list(range(12))
    assert "(1, 4)" in view.facts.text() and "no" in view.facts.text()
    view.set_tensor({t.id: t for t in tensors}, by_name(tensors, "second_column").id)
    assert view.highlighted_offsets() == [1, 5, 9]
    assert view.highlighted_cells() == [1, 5, 9]
    assert cell_color(view, 1) != cell_color(view, 2)
    assert cell_color(view, 2) == cell_color(view, 3)
    view.set_tensor(tensors, by_name(tensors, "row").id)
    assert view.highlighted_offsets() == [4, 5, 6, 7]
    assert view.cell_rect(4).left() > view.cell_rect(3).right()


def test_clicking_a_sharing_row_selects_that_tensor(view, qtbot):
    tensors = views()
    view.set_tensor(tensors, by_name(tensors, "transposed").id)
    rows = view.shared_rows()
    assert ("t0", "base of transposed") in rows and ("t3", "view of t0 (unnamed)") in rows
    item = next(view.shared.topLevelItem(i) for i in range(len(rows)) if rows[i][0] == "t3")
    where = view.shared.visualItemRect(item).center()
    with qtbot.waitSignal(view.sig_tensor_selected, timeout=1000) as blocker:
        qtbot.mouseClick(view.shared.viewport(), Qt.MouseButton.LeftButton, pos=where)
    assert blocker.args == ["t3"]


def test_grab_is_not_blank(view):
    tensors = views()
    view.set_tensor(tensors, by_name(tensors, "transposed").id)
    image = view.canvas.grab().toImage()
    colors = {image.pixel(x, y) for x in range(0, image.width(), 3) for y in range(0, image.height(), 3)}
    assert len(colors) > 20
    covered = cell_color(view, 0)
    view.set_tensor(tensors, by_name(tensors, "row").id)
    assert cell_color(view, 0) != covered and cell_color(view, 4) == covered


def test_big_storage_is_drawn_in_blocks(view, qtbot):
    big = [tensor("b0", "w", [1000, 100], [100, 1], nbytes=400_000, values=Values(numel=100_000)),
           tensor("b1", "upper", [500, 100], [100, 1], 50_000, nbytes=400_000, base="b0",
                  values=Values(numel=50_000))]
    storages = [StorageInfo("s0", 400_000, "cpu", ["b0", "b1"])]
    view.set_tensor(big, "b1", storages)
    assert view.picture().block == 128
    assert view.highlighted_cells() == list(range(390, 782))
    assert len(view.highlighted_offsets()) == 50_000
    assert view.shared_rows() == [("b0", "base of upper")]
    qtbot.waitUntil(lambda: view.scroll.verticalScrollBar().value() > 0)  # scrolled to the covered blocks
    assert view.canvas.cell_tip(390) == "storage[49,920..50,047]: 38% covered by upper"


def test_empty_missing_and_palette(view):
    view.set_tensor(views(), "nope")
    assert "was not captured" in view.caption.text() and view.highlighted_offsets() == []
    tensors = views()
    view.set_tensor(tensors, "t2")
    pal = view.palette()
    pal.setColor(QPalette.ColorRole.Base, QColor("#1e1f22"))
    pal.setColor(QPalette.ColorRole.Text, QColor("#e6e6e6"))
    view.setPalette(pal)
    assert cell_color(view, 0).lightness() < 128
    view.clear()
    assert view.tensor_id() is None and view.highlighted_cells() == []
    assert not view.canvas.grab().isNull()
