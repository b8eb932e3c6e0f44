"""The graph opens readable: on every bundled example and on a GPT-2-sized model, the smallest
text in the opening view is at least 9 px on screen (computed from the scene and the view's
transform), and OCR reads the module names of the transformer's opening view."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.fixtures_graphs import residual_mlp_call, transformer_call

EXAMPLES = Path(__file__).resolve().parents[3] / "resources" / "examples"
BIG = {"50_big_residual_mlp.py": (800, "blocks"), "51_huge_residual_mlp.py": (8333, "blocks")}


def _calls(name: str):
    if name in BIG:  # the same module tree as the script, without running 50,000 ops here
        return [residual_mlp_call(*BIG[name])]
    pytest.importorskip("torch")
    from core.worker.capture.recorder import capture_script

    trace = capture_script(str(EXAMPLES / name), mode="script")
    return [c for c in trace.calls if c.nodes and not c.same_as][:3]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("[0-9]*.py")))
def test_every_example_opens_readable_and_fits_a_slide(view, name, tmp_path):
    from PySide6.QtGui import QImage

    from widgets.export.graph_export import make_sheet, offscreen_view, render_png
    from widgets.export.page import plan_page

    for call in _calls(name):
        view.set_call(call, sync=True)
        px = view.smallest_text_px()
        assert px >= 9, f"{name} call #{call.index}: smallest text {px:.1f} px at zoom {view.zoom_percent()} %"
        assert len(view.node_items) <= 400
        with offscreen_view(call) as off:
            plan = plan_page(off, "16:9", "png", make_sheet, title=call.title)
            assert plan.text >= 9, f"{name} call #{call.index}: {plan.text:.1f} px on the slide"
            out = render_png(off, tmp_path / f"{call.index}.png", plan=plan)
        image = QImage(str(out))
        assert (image.width(), image.height()) == (1920, 1080)


def test_gpt2_sized_model_opens_readable_and_ocr_reads_its_modules(view, tmp_path):
    call = transformer_call(12)
    view.set_call(call, sync=True)
    assert view.smallest_text_px() >= 9
    if shutil.which("tesseract") is None:
        pytest.skip("tesseract is not installed: the size check ran, the OCR check did not")
    image = tmp_path / "opening.png"
    _for_ocr(view.grab().toImage()).save(str(image))
    text = subprocess.run(["tesseract", str(image), "-", "--psm", "11"], capture_output=True, text=True,
                          timeout=60).stdout
    words = {_norm(w) for w in text.split()}
    assert {_norm("transformer"), _norm("lm_head"), "loss"} <= words, text


def _norm(word: str) -> str:
    return word.lower().replace("i", "l")  # OCR reads the l of lm_head as I


def _for_ocr(image):
    """Three times larger, black on white: tesseract reads screen-sized text poorly as it is."""
    import numpy as np
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QImage

    big = image.scaled(image.width() * 3, image.height() * 3, Qt.IgnoreAspectRatio, Qt.SmoothTransformation)
    grey = big.convertToFormat(QImage.Format_Grayscale8)
    w, h, stride = grey.width(), grey.height(), grey.bytesPerLine()
    a = np.frombuffer(grey.constBits(), np.uint8, stride * h).reshape(h, stride)[:, :w]
    out = np.where(a < 150, 0, 255).astype(np.uint8).copy()
    return QImage(out.data, w, h, w, QImage.Format_Grayscale8).copy()


@pytest.mark.slow
def test_screenshot_of_the_graph_region_alone(tmp_path):
    pytest.importorskip("torch")
    import os
    import sys

    from PySide6.QtGui import QImage

    out = tmp_path / "graph.png"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", BACKPROP_STUDIO_SETTINGS=str(tmp_path / "s.ini"))
    done = subprocess.run([sys.executable, "main.py", str(EXAMPLES / "13_mlp_classifier.py"), "--screenshot",
                           str(out), "--region", "graph", "--size", "1200x800"], cwd=EXAMPLES.parents[1],
                          capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr
    image = QImage(str(out))
    assert 300 < image.width() < 1200 and 300 < image.height() < 800  # the view, not the window
    colours = {image.pixel(x, y) for x in range(0, image.width(), 9) for y in range(0, image.height(), 9)}
    assert len(colours) > 20  # nodes, edges and the legend drawn


MODELS = '''
import torch
from torch import nn


class Basic(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet18(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        widths, cin = (8, 16, 32, 64), 8
        for i, w in enumerate(widths):
            setattr(self, f"layer{i + 1}", nn.Sequential(Basic(cin, w, 1 if i == 0 else 2), Basic(w, w, 1)))
            cin = w
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(x.mean((2, 3)))


resnet = ResNet18()
loss = nn.functional.cross_entropy(resnet(torch.randn(2, 3, 16, 16)), torch.tensor([1, 2]))
loss.backward()

bert = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True), 12,
                             enable_nested_tensor=False)
loss = bert(torch.randn(2, 5, 32)).pow(2).mean()
loss.backward()
'''


@pytest.mark.slow
def test_resnet18_and_bert_sized_models_open_readable(view, tmp_path):
    pytest.importorskip("torch")
    from core.worker.capture.recorder import capture_script
    from core.layout.groups import group_info

    script = tmp_path / "models.py"
    script.write_text(MODELS)
    resnet, bert = capture_script(str(script), mode="script").calls[:2]
    assert group_info(bert).repeat == {"bert.layers": 12}  # layer 0 lacks the ops on its input: still stacked
    assert group_info(resnet).repeat.get("layer1") == 2  # two identical BasicBlocks
    classes = bert.options["module_classes"]
    assert classes["bert"] == "TransformerEncoder" and classes["bert.layers.3.self_attn"] == "MultiheadAttention"
    assert group_info(bert).class_of("bert.layers") == "TransformerEncoderLayer"  # the stack: its blocks' class
    assert resnet.options["module_classes"]["layer2.0.downsample"] == "Sequential"
    for call in (resnet, bert):
        assert len(call.nodes) > 100
        view.set_call(call, sync=True)
        assert view.smallest_text_px() >= 9, (len(call.nodes), view.zoom_percent(), sorted(view.collapsed()))
    assert view.node_items["group:bert.layers"].box.label == (
        f"bert.layers \u00d7 12\nTransformerEncoderLayer \u00b7 {group_info(bert).count['bert.layers']} nodes\nout: shape 2×5×32")
    assert view.group_items["bert"].group.label == "bert \u00b7 TransformerEncoder"


def test_the_layout_thread_prepares_the_next_fold_once_the_scene_is_shown(view, qtbot):
    from core.layout.groups import group_info

    c = residual_mlp_call(400, "blocks")  # 2,402 nodes: "blocks" opens into 7 runs
    info = group_info(c)
    runs = info.children["blocks"]
    # Read when the scene is built: the preparing starts 150 ms after the layout is done, so a
    # build slower than that lets it start inside wait_ready.
    prepared = []
    view.sig_scene_ready.connect(lambda _id: prepared.append(set(info._maps)))
    view.set_call(c, collapsed=frozenset({"blocks"}))  # laid out on the layout thread
    assert view.wait_ready()
    assert len(prepared) == 1 and not set(runs) & prepared[0]  # nothing prepared while the scene was built
    qtbot.waitUntil(lambda: set(runs) <= set(info.lines), timeout=5000)
    assert set(runs) <= set(info._maps)
    view.toggle_group("blocks")
    assert view.wait_ready()
    assert {f"group:{r}" for r in runs} <= set(view.node_items)
    assert view.node_items[f"group:{runs[0]}"].box.label.split("\n")[-1] == info.lines[runs[0]]
