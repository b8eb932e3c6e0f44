"""Exports: every format is valid and holds the graph; frames, GIF, geometry, the CLI and the dialog."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest
from PIL import Image
from PySide6.QtWidgets import QMainWindow

from core.layout.export_dot import call_to_dot
from core.layout.visible import node_label
from core.model.trace import Trace
from core.model.trace_json import load_trace
from tests.fixtures_graphs import edge_count, mlp_call, residual_mlp_call
from widgets.export import graph_export as export
from widgets.graph.view import GraphView

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "resources" / "examples"
SVG = "{http://www.w3.org/2000/svg}"
GEOMETRY_EXAMPLES = ("01_multiply", "06_retain_grad", "08_inplace_error", "13_mlp_classifier", "40_model_small_cnn",
                     "41_model_build")


@pytest.fixture(scope="module")
def captured():
    """Calls of bundled examples, captured in this process (torch is there in tests)."""
    capture = pytest.importorskip("core.worker.capture.recorder")
    out = {}
    for name in GEOMETRY_EXAMPLES:
        trace = capture.capture_script(str(EXAMPLES / f"{name}.py"))
        out[name] = (trace, trace.calls[0])
    return out


def walk_steps(call) -> list[dict]:
    """Step records in a valid backward order (each node after all its consumers)."""
    users = {n.id: 0 for n in call.nodes}
    for n in call.nodes:
        for e in n.next:
            if e is not None:
                users[e.node] += 1
    ready, order = [r for r in call.roots], []
    while ready:
        nid = ready.pop(0)
        order.append(nid)
        for e in call.node(nid).next:
            if e is not None:
                users[e.node] -= 1
                if users[e.node] == 0:
                    ready.append(e.node)
    grad = {"numel": 1, "data": [0.5]}
    return [{"index": i, "node": nid, "name": call.node(nid).name,
             "grad_inputs": [grad if e is not None else None for e in call.node(nid).next]}
            for i, nid in enumerate(order)]


def svg_texts(path: Path) -> list[tuple[str, float, float]]:
    """(text, x, y) of every ``<text>``, in sheet coordinates."""
    out = []
    for g in ET.parse(path).getroot().iter(SVG + "g"):
        m = re.match(r"matrix\(([^)]*)\)", g.get("transform", "matrix(1,0,0,1,0,0)"))
        a, b, c, d, e, f = (float(v) for v in m.group(1).split(","))
        for t in g.findall(SVG + "text"):
            x, y = float(t.get("x")), float(t.get("y"))
            out.append(("".join(t.itertext()), a * x + c * y + e, b * x + d * y + f))
    return out


def dark_pixels(image: Image.Image, box=None) -> int:
    grey = image.convert("L").crop(box) if box else image.convert("L")
    return sum(grey.histogram()[:128])


# -- formats -------------------------------------------------------------------------------------


def test_png_size_pixels_legend_and_background(qapp, tmp_path):
    c = mlp_call()
    one = export.export_call(c, tmp_path / "one.png", scale=1.0, title="MLP")
    two = export.export_call(c, tmp_path / "two.png", title="MLP", caption="caption")
    clear = export.export_call(c, tmp_path / "clear.png", scale=1.0, background="transparent")
    with Image.open(one) as a, Image.open(two) as b, Image.open(clear) as t:
        assert a.size[0] > 300 and a.size[1] > 600
        assert abs(b.size[0] - 2 * a.size[0]) <= 2 and b.size[1] > 2 * a.size[1]  # the caption adds a line
        assert a.convert("RGBA").getpixel((2, 2)) == (255, 255, 255, 255)
        assert t.convert("RGBA").getpixel((2, 2))[3] == 0
        assert dark_pixels(a) > 2000
        w, h = a.size
        assert dark_pixels(a, (0, h - 90, w, h)) > 200  # the legend under the graph
        assert b.info.get("dpi", (0,))[0] == pytest.approx(192, abs=1)


def test_svg_holds_a_text_per_label_line(qapp, tmp_path):
    c = mlp_call()
    path = export.export_call(c, tmp_path / "g.svg", title="Two layers", caption="below")
    texts = [t for t, _, _ in svg_texts(path)]
    for n in c.nodes:
        for line in node_label(c, n).split("\n"):
            assert line in texts, line
    assert "Two layers" in texts and "below" in texts and "backward op" in texts
    assert "<image" not in path.read_text()  # vector, not cached pixmaps


def test_pdf_is_one_vector_page(qapp, tmp_path):
    path = export.export_call(mlp_call(), tmp_path / "g.pdf", title="PDF")
    data = path.read_bytes()
    assert data.startswith(b"%PDF")
    assert len(re.findall(rb"/Type\s*/Page(?![a-zA-Z])", data)) == 1
    box = [float(v) for v in re.search(rb"/MediaBox\s*\[([^\]]*)\]", data).group(1).split()]
    assert 200 < box[2] < 600 and box[3] > box[2]  # sized to the graph, not A4


def test_dot_has_every_node_and_edge(tmp_path):
    c = mlp_call()
    text = call_to_dot(c, title="MLP", states={"n0": "executed", "n1": "current"}, edge_texts={("n0", "n1"): "0.5"})
    for n in c.nodes:
        assert re.search(rf'^\s*"{n.id}" \[label=', text, re.M), n.id
    edges = re.findall(r'^\s*"([^"]+)" -> "([^"]+)"(?!.*invis)', text, re.M)
    assert sorted(edges) == sorted((n.id, e.node) for n in c.nodes for e in n.next if e is not None)
    assert 'subgraph cluster_' in text and 'label="fc1"' in text and "cluster_legend" in text
    folded = call_to_dot(c, collapsed=frozenset({"fc1"}))
    assert '"group:fc1"' in folded and '"n8"' not in folded and '"n6" -> "group:fc1"' in folded
    if shutil.which("dot") is None:
        pytest.skip("Graphviz dot is not installed")
    for source in (text, folded, call_to_dot(mlp_call(error=True), theme="dark")):
        done = subprocess.run(["dot", "-Tsvg"], input=source, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "<svg" in done.stdout


@pytest.mark.slow
def test_json_round_trip(tmp_path, captured):
    trace, call = captured["13_mlp_classifier"]
    whole = export.export_call(call, tmp_path / "t.json", trace=trace)
    assert load_trace(whole) == trace
    single = export.export_call(call, tmp_path / "c.json")
    assert load_trace(single).calls == [call]


# -- frames, GIF, geometry ---------------------------------------------------------------------


@pytest.mark.slow
def test_frames_and_gif(qapp, tmp_path):
    c = mlp_call()
    steps = walk_steps(c)
    paths = export.export_frames(c, steps, tmp_path / "frames", title="Stepping")
    assert [p.name for p in paths] == [f"frame_{k:03d}.png" for k in range(len(steps))] and len(steps) == 11
    sizes = set()
    for p in paths:
        with Image.open(p) as im:
            sizes.add(im.size)
    assert len(sizes) == 1
    with Image.open(paths[0]) as first, Image.open(paths[-1]) as last:
        assert first.tobytes() != last.tobytes()
    gif = export.export_gif(paths, tmp_path / "s.gif", duration_ms=300)
    direct = export.export_gif(c, tmp_path / "d.gif", steps=steps[:4], scale=0.75)
    with Image.open(gif) as g, Image.open(direct) as d:
        assert g.n_frames == len(steps) and d.n_frames == 4
        assert g.info["duration"] == 300


@pytest.mark.parametrize("name", GEOMETRY_EXAMPLES)
def test_exported_geometry_of_bundled_examples(qapp, tmp_path, captured, name):
    _, call = captured[name]
    with export.offscreen_view(call) as view:
        layout = view.graph_layout()
        assert export.check_geometry(layout) == []
        assert len(view.edge_items) == edge_count(call)
        sheet = export.make_sheet(view, title=name)
        path = export.render_svg(view, tmp_path / f"{name}.svg", title=name)
    dx, dy = sheet.graph.x() - sheet.source.x(), sheet.graph.y() - sheet.source.y()
    texts = svg_texts(path)
    for box in layout.nodes.values():
        for line in box.label.split("\n"):
            inside = [(x, y) for t, x, y in texts if t == line and box.x + dx <= x <= box.x + box.w + dx
                      and box.y + dy <= y <= box.y + box.h + dy]
            assert inside, f"{name}: label {line!r} of {box.id} is not drawn inside its box"


def test_check_geometry_finds_problems(qapp):
    from dataclasses import replace

    from core.layout.compound import layout_call

    layout = layout_call(mlp_call())
    a, b = layout.nodes["n0"], layout.nodes["n1"]
    nodes = dict(layout.nodes)
    nodes["n1"] = replace(b, x=a.x + 5, y=a.y + 5)
    nodes["n2"] = replace(layout.nodes["n2"], label="a_label_far_too_long_for_this_box_" * 2)
    problems = export.check_geometry(replace(layout, nodes=nodes))
    assert any("n0 and n1 overlap" in p or "n1 and n0 overlap" in p for p in problems)
    assert any("of n2" in p for p in problems)


@pytest.mark.slow
def test_render_keeps_the_view_as_it_was(qtbot, tmp_path):
    view = GraphView()
    qtbot.addWidget(view)
    view.resize(500, 400)
    view.set_call(residual_mlp_call(300), sync=True, collapsed=frozenset())
    view.select_node("n1")
    view.set_zoom(5)  # the overview picture instead of the items
    assert not view.node_items["n1"].isVisible()
    whole = export.render_png(view, tmp_path / "all.png", scale=0.05, theme="dark", legend=False)
    part = export.render_png(view, tmp_path / "part.png", scale=1.0, region="visible", selection=True)
    assert view.theme().name == "light" and view.node_items["n1"].selected and not view.node_items["n1"].isVisible()
    with Image.open(whole) as w, Image.open(part) as p:
        assert w.size[1] > 2000 and p.size[1] > 300
        assert w.convert("RGB").getpixel((1, 1)) == (30, 31, 34)  # the dark theme's background
        assert dark_pixels(p) < p.size[0] * p.size[1] * 0.9


def test_big_graph_exports_collapsed_by_default(qapp, tmp_path):
    c = residual_mlp_call(833)
    path = export.export_call(c, tmp_path / "big.svg")
    texts = [t for t, _, _ in svg_texts(path)]
    assert "layers \u00d7 833" in texts and "collapsed module" in texts and "MeanBackward0" in texts
    assert "arrows: gradients, from the loss to the leaves" in texts


def test_page_export_folds_rather_than_shrinking_text(qapp, tmp_path):
    from tests.fixtures_graphs import transformer_call
    from widgets.export.page import plan_page

    c = transformer_call(12)
    with export.offscreen_view(c, collapsed=frozenset()) as view:  # all 542 nodes open
        plan = plan_page(view, "16:9", "png", export.make_sheet)
        assert plan.text >= 9 and not plan.cropped
        assert plan.sheet.width * plan.scale <= 1920 + 0.5 and plan.sheet.height * plan.scale <= 1080 + 0.5
        assert plan.collapsed and len(view.node_items) < len(c.nodes)  # folded to fit
        path = export.render_png(view, tmp_path / "t.png", plan=plan)
    with Image.open(path) as im:
        assert im.size == (1920, 1080) and dark_pixels(im) > 2000
    # Folded by default, an export opens modules as deep as the page still holds readably.
    with export.offscreen_view(c) as view:
        assert view.collapsed() == frozenset({"transformer", "lm_head"})
        plan = plan_page(view, "A4", "png", export.make_sheet, deepen=True)
        assert plan.text >= 9 and plan.collapsed == frozenset(
            {"transformer.wte", "transformer.wpe", "transformer.h", "transformer.ln_f"})
    # A small graph that does not fit at 10 pt is drawn whole, smaller: a lesson shown whole.
    path = export.export_call(mlp_call(), tmp_path / "m.svg", page="4:3", collapsed=frozenset(),
                              direction="LR")
    texts = [t for t, _, _ in svg_texts(path)]
    assert "MseLossBackward0" in texts and "arrows: gradients, from the loss to the leaves" in texts
    assert not any("around the loss" in t for t in texts)
    # A long chain with no modules cannot fold: the page shows the part around the loss, and says so.
    from tests.big_calls import chain

    path = export.export_call(chain(300), tmp_path / "c.svg", page="4:3", collapsed=frozenset(), direction="LR")
    texts = [t for t, _, _ in svg_texts(path)]
    assert "arrows: gradients, from the loss to the leaves" in texts
    assert any("around the loss" in t for t in texts)
    root = ET.parse(path).getroot()
    assert (root.get("width"), root.get("height"), root.get("viewBox")) == ("254mm", "190.5mm", "0 0 720 540")


def test_forward_direction_in_an_export(qapp, tmp_path):
    path = export.export_call(mlp_call(), tmp_path / "f.svg", direction="forward")
    pos = {t: y for t, _, y in svg_texts(path)}
    assert pos["fc1.weight"] < pos["ReluBackward0"] < pos["MseLossBackward0"]  # inputs on top, loss below
    assert "arrows: forward order, from the inputs to the loss" in pos


@pytest.mark.slow
def test_cli_page_and_direction(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "slide.png"
    done = _cli(EXAMPLES / "13_mlp_classifier.py", "-o", out, "--page", "16:9", "--direction", "LR")
    assert done.returncode == 0, done.stderr
    with Image.open(out) as im:
        assert im.size == (1920, 1080) and dark_pixels(im) > 2000
    bad = _cli(EXAMPLES / "13_mlp_classifier.py", "-o", out, "--page", "B5")
    assert bad.returncode == 2 and "--page" in bad.stderr


# -- the command line and the dialog --------------------------------------------------------------


def _cli(*args, timeout=240):
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    return subprocess.run([sys.executable, "main.py", "export", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.mark.slow
def test_cli_one_script_with_steps_frames_and_gif(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "mul.svg"
    done = _cli(EXAMPLES / "01_multiply.py", "-o", out, "--step", 1, "--title", "{name}", "--frames",
                tmp_path / "frames", "--gif", tmp_path / "mul.gif")
    assert done.returncode == 0, done.stderr
    texts = [t for t, _, _ in svg_texts(out)]
    assert {"01_multiply", "MulBackward0", "a", "b", "running now", "ready to run"} <= set(texts)
    frames = sorted((tmp_path / "frames").glob("frame_*.png"))
    assert len(frames) == 3  # MulBackward0 and two AccumulateGrad
    with Image.open(tmp_path / "mul.gif") as g:
        assert g.n_frames == 3


@pytest.mark.slow
def test_cli_batch_goes_on_after_a_bad_script(tmp_path):
    pytest.importorskip("torch")
    bad = tmp_path / "missing.py"
    done = _cli(EXAMPLES / "02_polynomial.py", bad, EXAMPLES / "01_multiply.py", "-o", tmp_path / "out" / "{name}.png")
    assert done.returncode == 1
    assert "missing.py: no such file" in done.stderr
    for stem in ("02_polynomial", "01_multiply"):
        with Image.open(tmp_path / "out" / f"{stem}.png") as im:
            assert im.size[0] > 100 and dark_pixels(im) > 500
    refused = _cli(EXAMPLES / "02_polynomial.py", EXAMPLES / "01_multiply.py", "-o", tmp_path / "one.png")
    assert refused.returncode == 2 and "{name}" in refused.stderr


def _stub_window(qtbot):
    w = QMainWindow()
    qtbot.addWidget(w)
    w.graph = GraphView(w)
    w.setCentralWidget(w.graph)
    w.call = mlp_call()
    w.trace = Trace(calls=[w.call], call_count=1)
    w.script_path = None
    w.stepper = SimpleNamespace(call=w.call, steps=walk_steps(w.call))
    menu = w.menuBar().addMenu("&File")
    w.act_quit = menu.addAction("&Quit")
    menu.insertSeparator(w.act_quit)
    w.graph.set_call(w.call, sync=True)
    return w


@pytest.mark.slow
def test_dialog_exports_the_window_state_and_reports_errors(qtbot, tmp_path, monkeypatch):
    from app.window import export_dialog

    w = _stub_window(qtbot)
    export_dialog.add_export_action(w)
    file_menu = w.menuBar().actions()[0].menu()
    actions = file_menu.actions()
    assert actions.index(w.act_export) < actions.index(w.act_quit)
    assert w.act_export.shortcut().toString() == "Ctrl+E" and w.act_export.isEnabled()
    w.graph.set_collapsed({"fc1"}, sync=True)
    w.graph.set_node_states({"n0": "executed", "n1": "current"})
    errors = []
    monkeypatch.setattr(export_dialog, "report_error", lambda parent, text: errors.append(text))
    dialog = export_dialog.ExportDialog(w)
    qtbot.addWidget(dialog)
    assert dialog.frames.isEnabled()
    dialog.path.setText(str(tmp_path / "window.svg"))
    dialog._path_edited(dialog.path.text())
    assert dialog.fmt() == "svg" and not dialog.scale.isEnabled()
    dialog.frames.setChecked(True)
    paths = dialog.export()
    assert errors == [] and paths[0] == tmp_path / "window.svg"
    texts = {t for t, _, _ in svg_texts(paths[0])}
    assert {"fc1", "running now", "collapsed module"} <= texts and "TBackward0" in texts
    assert len(list((tmp_path / "window-frames").glob("frame_*.png"))) == 11
    with Image.open(tmp_path / "window.gif") as g:
        assert g.n_frames == 11
    bad = export_dialog.ExportDialog(w)
    qtbot.addWidget(bad)
    (tmp_path / "file").write_text("")
    bad.path.setText(str(tmp_path / "file" / "x.png"))  # a file where a folder should be
    assert bad.export() == [] and len(errors) == 1 and "x.png" in errors[0]


def test_dialog_exports_a_slide_in_forward_order_with_the_window_state(qtbot, tmp_path):
    from app.window import export_dialog

    w = _stub_window(qtbot)
    w.graph.set_collapsed({"fc1"}, sync=True)
    w.graph.set_node_states({"n0": "executed", "n1": "current"})
    from widgets.graph.direction import set_direction

    set_direction(w.graph, "LR", sync=True)
    dialog = export_dialog.ExportDialog(w)
    qtbot.addWidget(dialog)
    assert dialog.options()["direction"] == "LR"  # the dialog starts as the graph is drawn on screen
    dialog.path.setText(str(tmp_path / "slide.svg"))
    dialog._path_edited(dialog.path.text())
    dialog.direction.setCurrentIndex(dialog.direction.findData("forward"))
    dialog.page.setCurrentIndex(dialog.page.findData("4:3"))
    assert dialog.options()["direction"] == "forward" and dialog.options()["page"] == "4:3"
    [path] = dialog.export()
    pos = {t: y for t, _, y in svg_texts(path)}
    assert {"fc1", "running now", "arrows: forward order, from the inputs to the loss"} <= set(pos)
    assert pos["fc1"] < pos["MseLossBackward0"]  # the folded input module above the loss
    assert ET.parse(path).getroot().get("viewBox") == "0 0 720 540"
    assert w.graph.graph_layout().direction == "LR"  # the window's own view is left as it was
