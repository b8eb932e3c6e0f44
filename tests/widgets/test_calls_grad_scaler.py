"""The Calls list tells a GradScaler run: each call's loss scale, and the call whose step inf/NaN
skipped gets an amber third line with the scale before and after (36_amp_skip, captured)."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtGui import QColor

from widgets.panels.calls import DETAIL_ROLE, WARN_ROLE, CallsPanel

EXAMPLE = Path(__file__).resolve().parents[2] / "resources" / "examples" / "36_amp_skip.py"
SKIP = "step skipped: inf/NaN in gradients, scale 65536 → 32768"


@pytest.fixture(scope="module")
def trace():
    capture = pytest.importorskip("core.worker.capture.recorder")
    return capture.capture_script(str(EXAMPLE))


def test_each_row_has_its_scale_and_the_skipped_step_is_told(qtbot, trace):
    panel = CallsPanel()
    qtbot.addWidget(panel)
    panel.set_trace(trace)
    items = [panel.list.item(r) for r in range(panel.list.count())]
    assert [i.data(WARN_ROLE) for i in items] == ["", "", "", SKIP, "", ""]
    assert [i.data(DETAIL_ROLE).split(" · ")[:3] for i in items] == \
        [["line 34", "16 nodes", "scale 65536"]] * 3 + [["line 34", "same graph as #0", "then zero_grad"]] + \
        [["line 34", "same graph as #0", "scale 32768"], ["line 34", "16 nodes", "scale 32768"]]
    assert items[3].text().startswith("#3 Tensor.backward · line 34 · same graph as #0 · ")
    assert items[3].text().endswith(" · " + SKIP)
    assert "GradScaler.step(SGD): " + SKIP + "\nThe scaled gradients held inf or NaN" in items[3].toolTip()
    heights = [panel.list.visualItemRect(i).height() for i in items]
    assert heights[3] > heights[2] == heights[4]


def test_the_skipped_line_is_drawn_in_amber(qtbot, trace):
    panel = CallsPanel()
    qtbot.addWidget(panel)
    panel.resize(520, 600)
    panel.set_trace(trace)
    panel.show()
    qtbot.waitExposed(panel)
    image = panel.list.viewport().grab().toImage()
    amber = QColor("#9a5b00")

    def amber_rows() -> set[int]:
        rows = set()
        for r in range(panel.list.count()):
            rect = panel.list.visualItemRect(panel.list.item(r))
            for y in range(rect.top(), rect.bottom(), 1):
                for x in range(rect.left(), min(rect.right(), 400), 2):
                    c = image.pixelColor(x, y)
                    if abs(c.red() - amber.red()) + abs(c.green() - amber.green()) + abs(c.blue() - amber.blue()) < 60:
                        rows.add(r)
                        break
        return rows

    assert amber_rows() == {3}
