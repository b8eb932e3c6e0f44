"""``main.py export SCRIPT --curves OUT``: the curves of the run's loop, as PNG or SVG in the print theme."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from PySide6.QtGui import QColor, QImage

from app.cli.commands import main

EXAMPLES = Path(__file__).resolve().parents[2] / "resources" / "examples"
SCRATCH = EXAMPLES / "11_linear_regression_scratch.py"
NN = EXAMPLES / "12_linear_regression_nn.py"


@pytest.mark.slow
def test_export_curves_of_two_loops_as_png_and_one_as_svg(tmp_path, capsys):
    assert main(["export", str(SCRATCH), str(NN), "--curves", str(tmp_path / "{name}.png")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"{tmp_path / '11_linear_regression_scratch.png'}: curves of loss, b, w over 200 calls" in out
    assert f"{tmp_path / '12_linear_regression_nn.png'}: curves of loss, model.bias, model.weight over 200 calls" in out
    image = QImage(str(tmp_path / "11_linear_regression_scratch.png"))
    assert (image.width(), image.height()) == (1800, 2 * (70 + 210 * 2))  # two plots: loss, values
    assert image.pixelColor(2, 2) == QColor("#ffffff")
    assert main(["export", str(NN), "--curves", str(tmp_path / "nn.svg")]) == 0
    svg = tmp_path / "nn.svg"
    assert ET.parse(svg).getroot().tag == "{http://www.w3.org/2000/svg}svg"
    text = svg.read_text()
    assert "model.weight" in text and "model.bias" in text and "backward call" in text


def test_curves_replace_o_and_take_png_or_svg(tmp_path, capsys):
    assert main(["export", str(SCRATCH)]) == 2
    assert "-o OUT is required (or --curves OUT)" in capsys.readouterr().err
    assert main(["export", str(SCRATCH), "-o", str(tmp_path / "g.png"), "--curves", str(tmp_path / "c.png")]) == 2
    assert "--curves OUT writes its own file: leave out -o" in capsys.readouterr().err
    assert main(["export", str(SCRATCH), "--curves", str(tmp_path / "c.pdf")]) == 1
    assert "the curves are written as .png or .svg" in capsys.readouterr().err
    assert not (tmp_path / "c.pdf").exists()
