"""The Tensors tab says, per tensor, whether it is a leaf, whether it requires grad, and its .grad."""

from __future__ import annotations

from core.model.trace import GradInfo, TensorInfo, Values
from widgets.panels.tensors import TensorsPanel


def tensor(tid, name, data, *, leaf=True, requires_grad=True, grad=None, retains_grad=False):
    n = len(data)
    return TensorInfo(
        id=tid, name=name, shape=[n], dtype="float32", device="cpu", requires_grad=requires_grad, is_leaf=leaf,
        retains_grad=retains_grad, stride=[1], storage_offset=0, storage=f"s{tid}", version=0,
        values=Values(numel=n, data=data),
        grad=GradInfo(shape=[n], values=Values(numel=n, data=grad)) if grad is not None else None,
        grad_fn=None if leaf else "n0", grad_fn_name=None if leaf else "MulBackward0", nbytes=4 * n)


def rows(panel: TensorsPanel) -> dict[str, dict[str, str]]:
    header = panel.tree.headerItem()
    names = [header.text(c) for c in range(panel.tree.columnCount())]
    out = {}
    for i in range(panel.tree.topLevelItemCount()):
        item = panel.tree.topLevelItem(i)
        out[item.text(0)] = {n: item.text(c) for c, n in enumerate(names)}
    return out


def test_the_header_names_leaf_requires_grad_and_grad(qtbot):
    panel = TensorsPanel()
    qtbot.addWidget(panel)
    header = panel.tree.headerItem()
    assert [header.text(c) for c in range(panel.tree.columnCount())] == [
        "name", "shape", "leaf", "requires_grad", ".grad", "grad_fn", "stride", "offset", "storage", "version",
        "dtype", "device"]


def test_rows_tell_leaf_non_leaf_and_no_grad_apart(qtbot):
    # x = torch.tensor([2., 3.], requires_grad=True); y = x * 2; y.sum().backward(); c = torch.ones(2)
    panel = TensorsPanel()
    qtbot.addWidget(panel)
    panel.resize(1600, 400)
    panel.show()
    qtbot.waitExposed(panel)
    panel.set_tensors([
        tensor("t0", "x", [2.0, 3.0], grad=[2.0, 2.0]),
        tensor("t1", "y", [4.0, 6.0], leaf=False),
        tensor("t2", "c", [1.0, 1.0], requires_grad=False),
        tensor("t3", "h", [4.0, 6.0], leaf=False, retains_grad=True, grad=[1.0, 1.0]),
        tensor("t4", "w", [0.5], grad=None),
    ])
    got = rows(panel)
    assert {k: (v["leaf"], v["requires_grad"], v[".grad"]) for k, v in got.items()} == {
        "x": ("True", "True", "[2, 2]"),
        "y": ("False", "True", "None (non-leaf)"),
        "c": ("True", "False", "—"),
        "h": ("False", "True", "[1, 1]"),
        "w": ("True", "True", "None"),
    }
    item = panel.tree.topLevelItem(0)
    assert "leaf: True  requires_grad: True  .grad: [2, 2]" in item.toolTip(0)
    # Wide enough: every column shows.
    assert not any(panel.tree.isColumnHidden(c) for c in range(panel.tree.columnCount()))


def test_a_narrow_dock_keeps_leaf_requires_grad_and_grad(qtbot):
    panel = TensorsPanel()
    qtbot.addWidget(panel)
    panel.resize(420, 300)
    panel.show()
    qtbot.waitExposed(panel)
    panel.set_tensors([tensor("t0", "x", [2.0, 3.0], grad=[2.0, 2.0])])
    shown = [panel.tree.headerItem().text(c) for c in range(panel.tree.columnCount())
             if not panel.tree.isColumnHidden(c)]
    assert shown[:5] == ["name", "shape", "leaf", "requires_grad", ".grad"]
    assert "device" not in shown
