"""A notebook shown in the window: the graph's node tooltips and marks name the cell and its line."""

import json

import pytest

torch = pytest.importorskip("torch")

from core.worker.capture.recorder import capture_script  # noqa: E402

CELLS = ["import torch\nw = torch.ones(3, requires_grad=True)",
         "h = w * 2\ns = h.sigmoid()\ns.mul_(2)",
         "s.sum().backward()"]


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("BACKPROP_STUDIO_SETTINGS", str(tmp_path / "settings.ini"))
    from app.session.worker_handle import WorkerHandle
    from app.window.window import MainWindow

    w = MainWindow(handle=WorkerHandle(prestart=False), timeout=120)
    qtbot.addWidget(w)
    w.resize(1200, 800)
    w.show()
    yield w
    w.handle.close()


def test_the_graph_of_a_notebook_names_cells(qtbot, window, tmp_path):
    from widgets.graph.scene import tooltip

    cells = [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": src}
             for src in CELLS]
    path = tmp_path / "lesson.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    trace = capture_script(str(path))
    window.show_trace(trace)
    qtbot.waitUntil(lambda: window.call is not None and bool(window.graph.node_items))
    call = window.call
    inplace = next(n for n in call.nodes if n.inplace)
    stale = next(n for n in call.nodes if n.stale is not None)
    assert tooltip(call, inplace.id).splitlines()[3:5] == ["cell 2, line 3", "made by the in-place op mul_"]
    assert "mul_ at cell 2, line 3 changed it in place" in tooltip(call, stale.id)
    tips = [t.toolTip() for t in window.graph.marks.tags if t.kind == "inplace" and t.target == inplace.id]
    assert len(tips) == 1 and tips[0].startswith("In-place op: mul_ at cell 2, line 3 changed s in place.")
