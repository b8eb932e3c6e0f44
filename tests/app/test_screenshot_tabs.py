"""``--show calls`` / ``--show gradients`` bring that tab of the left dock to the front before the
screenshot: the Gradients tab's heatmap (viridis yellow for the largest norms) is in the picture
only when it is asked for."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtGui import QColor, QImage

from app.cli.window_options import PANELS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "resources" / "examples" / "35_exploding_and_clipping.py"


def _yellow_pixels(path: Path, width: int) -> int:
    """Pixels near viridis' top colour (#fde725) in the left ``width`` pixels of the picture."""
    image = QImage(str(path))
    top = QColor("#fde725")
    count = 0
    for y in range(0, image.height(), 2):
        for x in range(0, width, 2):
            c = image.pixelColor(x, y)
            count += abs(c.red() - top.red()) + abs(c.green() - top.green()) + abs(c.blue() - top.blue()) < 40
    return count


def test_the_left_tabs_are_panels_to_show():
    assert {"calls", "tensors", "gradients"} <= set(PANELS)


@pytest.mark.slow
def test_show_gradients_puts_the_heatmap_in_the_screenshot(tmp_path):
    capture = pytest.importorskip("core.worker.capture.recorder")
    saved = tmp_path / "t.json"
    capture.capture_script(str(EXAMPLE)).save(saved)
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "BACKPROP_STUDIO_SETTINGS": str(tmp_path / "s.ini")}
    counts = {}
    for tab in ("calls", "gradients"):
        out = tmp_path / f"{tab}.png"
        result = subprocess.run([sys.executable, str(ROOT / "main.py"), "view", str(saved), "--screenshot", str(out),
                                 "--show", tab], capture_output=True, text=True, timeout=300, env=env, cwd=str(ROOT))
        assert result.returncode == 0, result.stderr
        counts[tab] = _yellow_pixels(out, 250)  # the Calls dock: 18 % of the 1400 px window
    # the heatmap's yellow: call #6's three cells (call #7's inf and nan are grey), 174 sampled pixels
    assert counts["calls"] == 0 and counts["gradients"] > 120
