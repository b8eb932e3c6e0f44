"""Exports draw what the window draws: the NaN/Inf check's marks on the first non-finite op's node
and gradient's node (``export --nan-check``, the window's export dialog), and Colour by Gradient
Norm with its colour scale (``export --color-by grad-norm``)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtGui import QColor, QImage

from app.cli.export import add_parser
from app.window.export_dialog import run_export
from tests.widgets.test_grad_norm_colours import norm_call
from tests.widgets.test_nonfinite_marks import _trace as nan_trace
from widgets.export.graph_export import NormScaleItem, export_call, offscreen_view
from widgets.theme import get_theme

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "resources" / "examples"
LIGHT = get_theme("light")  # the mark's pill: error border, error_fill inside


def _count(path: Path, hex_color: str) -> int:
    """Pixels of exactly ``hex_color`` in the PNG."""
    image = QImage(str(path))
    assert not image.isNull(), path
    want = QColor(hex_color).rgb()
    return sum(1 for y in range(image.height()) for x in range(image.width()) if image.pixel(x, y) == want)


def _export(*args, timeout=240):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    return subprocess.run([sys.executable, "main.py", "export", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.mark.slow
def test_export_with_the_check_marks_the_first_nan_and_without_it_does_not(tmp_path):
    marked, plain = tmp_path / "marked.png", tmp_path / "plain.png"
    result = _export(EXAMPLES / "33_first_nan.py", "--nan-check", "--theme", "light", "-o", marked)
    assert result.returncode == 0, result.stderr
    assert f"{marked}: call #0 (Tensor.backward), 14 nodes" in result.stdout
    result = _export(EXAMPLES / "33_first_nan.py", "--theme", "light", "-o", plain)
    assert result.returncode == 0, result.stderr
    # Two pills ("first -inf: log (line 25)", "first NaN gradient: LogBackward0") and the legend's sample.
    assert _count(marked, LIGHT.error_fill) > 1500
    assert _count(plain, LIGHT.error_fill) == 0


def test_the_export_commands_flags():
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["export", "a.py", "--nan-check", "--color-by", "grad-norm", "-o", "x.png"])
    assert args.nan_check is True and args.color_by == "grad-norm"
    args = parser.parse_args(["export", "a.py", "-o", "x.png"])
    assert args.nan_check is False and args.color_by is None
    with pytest.raises(SystemExit):
        parser.parse_args(["export", "a.py", "--color-by", "size", "-o", "x.png"])


def test_the_headless_export_marks_a_checked_trace(tmp_path, qapp):
    trace = nan_trace()
    export_call(trace.calls[0], tmp_path / "marked.png", theme="light", trace=trace)
    assert _count(tmp_path / "marked.png", LIGHT.error_fill) > 1000
    unchecked = replace(trace, nan_check=None)
    export_call(unchecked.calls[0], tmp_path / "plain.png", theme="light", trace=unchecked)
    assert _count(tmp_path / "plain.png", LIGHT.error_fill) == 0


@pytest.mark.parametrize("direction", ["TB", "LR"])
def test_the_windows_export_draws_the_marks_the_graph_shows(qtbot, window, tmp_path, direction):
    with qtbot.waitSignal(window.sig_trace_shown, timeout=60_000):
        window.show_trace(nan_trace())
    assert [t.kind for t in window.graph.marks.tags].count("nonfinite") == 2
    out = tmp_path / f"{direction}.png"
    assert run_export(window, path=out, theme="light", direction=direction) == [out]
    assert _count(out, LIGHT.error_fill) > 1000


def test_colour_by_norm_is_exported_with_its_scale(tmp_path, qapp):
    call = norm_call()
    with offscreen_view(call, color_by="grad-norm") as view:
        scales = [i for i in view.scene().items() if isinstance(i, NormScaleItem)]
        assert len(scales) == 1 and scales[0].sceneBoundingRect().top() > view.graph_layout().height
    coloured, plain = tmp_path / "coloured.png", tmp_path / "plain.png"
    export_call(call, coloured, theme="print", color_by="grad-norm")
    export_call(call, plain, theme="print")
    # the smallest norm's colour (w's leaf and edge) and the largest's (b's), in the print theme too
    assert _count(coloured, "#440154") > 2000 and _count(coloured, "#fde725") > 2000
    assert _count(plain, "#440154") == 0 and _count(plain, "#fde725") == 0


def test_the_windows_export_keeps_the_colours_and_adds_the_scale(qtbot, window, tmp_path):
    with qtbot.waitSignal(window.sig_trace_shown, timeout=60_000):
        window.show_trace(replace(nan_trace(), calls=[norm_call()], nan_check=None))
    window.act_norm_colours.setChecked(True)
    out = tmp_path / "window.png"
    run_export(window, path=out, theme="print")
    assert _count(out, "#fde725") > 2000
    assert not any(isinstance(i, NormScaleItem) for i in window.graph.scene().items())  # taken away after
    page = tmp_path / "page.png"
    run_export(window, path=page, theme="print", page="16:9")
    assert _count(page, "#fde725") > 2000
