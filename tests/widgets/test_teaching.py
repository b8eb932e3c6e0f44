"""Cut inputs and their causes, decoded saved values, .grad-is-None causes, values on the graph."""

import textwrap

import pytest

from core.model.attrs import decode_value, saved_label
from core.worker.capture.recorder import capture_script
from core.model.causes import grad_none_cause
from core.model.trace_json import trace_from_json
from core.model.values import leaf_value_lines, seed_text

CUTS = """
import torch
x = torch.tensor(2.0, requires_grad=True)
w = torch.tensor([1.0, 2.0], requires_grad=True)
unused = torch.tensor(5.0, requires_grad=True)
const = torch.tensor([3.0, 4.0])
detached = x.detach() * 10
with torch.no_grad():
    frozen = x * 10
h = (x * 3).exp()
y = x**3 + detached + frozen + x.item() + (w * const).sum()
y.backward()
"""


@pytest.fixture(scope="module")
def cut_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("cuts") / "cuts.py"
    path.write_text(textwrap.dedent(CUTS))
    trace = capture_script(str(path))
    assert trace.error is None, trace.error
    return trace_from_json(trace.to_json())  # every new field survives the JSON round trip


def _cuts(call):
    return [(n.name, c["input"], c["cause"], c["name"]) for n in call.nodes for c in n.cuts or ()]


def test_cut_inputs_are_named_with_their_cause(cut_trace):
    call = cut_trace.calls[0]
    assert sorted(_cuts(call)) == sorted([
        ("AddBackward0", 1, "detach", "detached"),
        ("AddBackward0", 1, "no_grad", "frozen"),
        ("AddBackward0", 1, "item", "x.item()"),
        ("MulBackward0", 1, "constant", "const"),
    ])
    number = next(c for n in call.nodes for c in n.cuts or () if c["cause"] == "item")
    assert number["value"] == "2"
    # every None entry of next_functions has exactly one cut record
    for n in call.nodes:
        nones = [i for i, e in enumerate(n.next) if e is None]
        assert nones == [c["input"] for c in n.cuts or ()]


def test_tensors_made_by_detach_or_under_no_grad_say_so(cut_trace):
    named = {t.name: t for t in cut_trace.tensors if t.name}
    assert named["detached"].origin == "detach"
    assert named["frozen"].origin == "no_grad"
    assert named["const"].origin is None and named["x"].origin is None


def test_grad_none_causes(cut_trace):
    call = cut_trace.calls[0]
    named = {t.name: t for t in cut_trace.tensors if t.name}
    assert "cut by detach()" in grad_none_cause(named["detached"], call)
    assert "made under torch.no_grad()" in grad_none_cause(named["frozen"], call)
    assert "requires_grad is False" in grad_none_cause(named["const"], call)
    assert grad_none_cause(named["unused"], call) == "not on the path to the loss: backward never reaches it"
    assert "not a leaf" in grad_none_cause(named["h"], call) and "retain_grad()" in grad_none_cause(named["h"], call)


def test_values_and_seed_text(cut_trace):
    call = cut_trace.calls[0]
    leaf = next(n for n in call.nodes if n.label == "x")
    assert leaf_value_lines(call, leaf) == ["x = 2", ".grad = 12"]
    wleaf = next(n for n in call.nodes if n.label == "w")
    assert leaf_value_lines(call, wleaf) == ["w = [1, 2]", ".grad = [3, 4]"]
    root = call.node(call.roots[0])
    assert seed_text(call, root) == "seed: 1 (d out / d out)"


def test_saved_values_are_decoded(tmp_path):
    path = tmp_path / "loss.py"
    path.write_text(textwrap.dedent("""
        import torch
        import torch.nn.functional as F
        a = torch.randn(4, 3, requires_grad=True)
        b = torch.randn(4, 3, requires_grad=True)
        c = a * b
        loss = F.cross_entropy(c, torch.tensor([0, 1, 2, 0]), reduction="sum")
        loss.backward()
    """))
    call = capture_script(str(path)).calls[0]
    nll = next(n for n in call.nodes if n.name == "NllLossBackward0")
    saved = {s.name: s for s in nll.saved}
    assert saved_label(call, saved["reduction"]) == "reduction = 'sum'"
    assert saved_label(call, saved["ignore_index"]) == "ignore_index = -100"
    mul = next(n for n in call.nodes if n.name == "MulBackward0")
    assert sorted(saved_label(call, s) for s in mul.saved) == ["other = b", "self = a"]
    assert decode_value("reduction", 1) == "'mean'" and decode_value("ignore_index", 2**64 - 100) == -100


def test_cut_stubs_and_values_are_drawn(qtbot, cut_trace):
    from widgets.export.graph_export import offscreen_view

    call = cut_trace.calls[0]
    with offscreen_view(call, values=True) as view:
        notes = [t for t in view.marks.tags if t.kind in ("cut", "value")]
        cuts = sorted(" ".join(t.lines) for t in notes if t.kind == "cut")
        values = sorted(" ".join(t.lines) for t in notes if t.kind == "value")
        assert cuts == sorted(["✂ const: requires_grad=False", "✂ detached: made by .detach()",
                               "✂ frozen: made under no_grad", "✂ x.item() → 2"])
        assert "x = 2 .grad = 12" in values and "seed: 1 (d out / d out)" in values
        assert all(t.isVisible() for t in notes)
    with offscreen_view(call) as view:
        assert not [t for t in view.marks.tags if t.kind == "value"]
        assert len([t for t in view.marks.tags if t.kind == "cut"]) == 4


BROADCAST = """
import torch
a = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], requires_grad=True)
b = torch.tensor(2.0, requires_grad=True)
d = torch.ones(3, dtype=torch.float64, requires_grad=True)
y = (a * b).sum() + (a[:3].double() * d).sum()
y.backward()
"""


def test_broadcast_and_dtype_marks_and_edge_grads(tmp_path):
    path = tmp_path / "bc.py"
    path.write_text(textwrap.dedent(BROADCAST))
    call = trace_from_json(capture_script(str(path)).to_json()).calls[0]
    by_name = {}
    for n in call.nodes:
        by_name.setdefault(n.name, []).append(n)
    mul = next(n for n in by_name["MulBackward0"] if n.next[1] and call.node(n.next[1].node).label == "b")
    assert mul.edge_marks == [{"input": 1, "sum": [[5], []]}]
    to_copy = by_name["ToCopyBackward0"][0]
    assert to_copy.edge_marks == [{"input": 0, "dtype": ["float64", "float32"]}]
    root = call.node(call.roots[0])
    assert {"input": 0, "dtype": ["float64", "float32"]} in root.edge_marks
    from core.model.edge_marks import mark_text

    assert mark_text(mul.edge_marks[0]) == "[5] → Σ → []"
    # the gradient each edge carried, already summed to the input's shape: b gets sum(a) = 15
    grads = call.edge_grads[mul.id]
    assert grads[1].shape == [] and grads[1].values.data == [15.0]
    assert grads[0].values.data == [2.0] * 5
    bleaf = next(n for n in call.nodes if n.label == "b")
    assert call.tensor(bleaf.variable).grad.values.data == [15.0]


def test_leaf_reached_twice_shows_the_sum(tmp_path):
    path = tmp_path / "poly.py"
    path.write_text("import torch\nx = torch.tensor(3.0, requires_grad=True)\ny = x**2 + 2 * x + 1\ny.backward()\n")
    call = capture_script(str(path)).calls[0]
    leaf = next(n for n in call.nodes if n.label == "x")
    assert leaf_value_lines(call, leaf) == ["x = 3", ".grad = 6 + 2 = 8"]


def test_backward_twice_blames_the_node_whose_saved_tensors_were_freed(tmp_path):
    from core.layout.export_dot import call_to_dot
    from widgets.graph.scene import node_styles

    path = tmp_path / "twice.py"
    path.write_text("import torch\nx = torch.tensor(2.0, requires_grad=True)\n"
                    "w = torch.tensor(5.0, requires_grad=True)\n"
                    "loss = x * w\nloss.backward()\nloss.backward()\n")
    call = capture_script(str(path)).calls[1]
    from core.model.causes import blamed_nodes

    mul = next(n for n in call.nodes if n.name == "MulBackward0")
    assert blamed_nodes(call) == {mul.id}
    styles = node_styles(call, [n.id for n in call.nodes])
    assert {nid for nid, s in styles.items() if s.error} == {mul.id}
    lines = {ln.split()[0].strip('"'): ln for ln in call_to_dot(call).splitlines()
             if ln.startswith('  "n') and "->" not in ln}
    assert "penwidth=2.5" in lines[mul.id]
    assert all("penwidth=2.5" not in ln for nid, ln in lines.items() if nid != mul.id)


def test_hooks_are_captured_and_drawn(tmp_path, qtbot):
    from core.model.causes import hook_lines
    from widgets.export.graph_export import offscreen_view

    path = tmp_path / "hooks.py"
    path.write_text(textwrap.dedent("""
        import torch
        x = torch.tensor(3.0, requires_grad=True)
        def double_grad(g):
            return g * 2
        x.register_hook(double_grad)
        y = x * x
        y.register_hook(lambda g: g)
        m = torch.nn.Linear(2, 1)
        m.register_full_backward_hook(lambda mod, gi, go: None)
        z = m(torch.ones(1, 2, requires_grad=True)).sum() + y
        z.backward()
    """))
    call = trace_from_json(capture_script(str(path)).to_json()).calls[0]
    named = {t.name: t for t in call.tensors if t.name}
    assert named["x"].hooks == ["double_grad (line 4)"]
    assert named["y"].hooks == ["<lambda> (line 8)"]
    leaf = next(n for n in call.nodes if n.label == "x")
    assert hook_lines(call, leaf) == ["hook double_grad"]
    hook_node = next(n for n in call.nodes if n.name == "BackwardHookFunctionBackward")
    assert hook_lines(call, hook_node) == ["module backward hooks"]
    # the edges carried 3 + 3 = 6 into x; its hook doubled that to .grad = 12
    assert leaf_value_lines(call, leaf) == ["x = 3", ".grad = 12", "(edges 3 + 3 = 6, then its hook)"]
    with offscreen_view(call) as view:
        hooks = sorted(" ".join(t.lines) for t in view.marks.tags if t.kind == "hook")
        # a full backward hook wraps the module's output and its input that requires grad: two nodes
        assert hooks == ["hook <lambda>", "hook double_grad", "module backward hooks", "module backward hooks"]


CHECKPOINT = """
import torch
from torch.utils.checkpoint import checkpoint
torch.manual_seed(0)
layer1 = torch.nn.Linear(4, 4)
layer2 = torch.nn.Linear(4, 1)
x = torch.randn(2, 4, requires_grad=True)
def block(t):
    return torch.relu(layer1(t))
h = checkpoint(block, x, use_reentrant=True)
loss = layer2(h).sum()
loss.backward()
h2 = checkpoint(block, x, use_reentrant=False)
loss2 = layer2(h2).sum()
loss2.backward()
"""


def test_checkpointing_nested_backward_and_recomputed_saved_tensors(tmp_path):
    import torch

    path = tmp_path / "ckpt.py"
    path.write_text(textwrap.dedent(CHECKPOINT))
    trace = trace_from_json(capture_script(str(path)).to_json())
    # the nested call finishes (and is stored) before the call it ran inside
    assert [c.index for c in trace.calls] == [1, 0, 2]
    outer, nested, plain = sorted(trace.calls, key=lambda c: c.index)
    assert outer.options["nested"] == [1]
    assert nested.options["nested_in"] == 0 and nested.options["inside"] == "CheckpointFunctionBackward"
    ckpt = next(n for n in outer.nodes if n.name == "CheckpointFunctionBackward")
    assert ckpt.module is None  # called at top level, not inside layer2
    # the checkpointed layer's grads come from the nested call and equal plain torch's
    torch.manual_seed(0)
    layer1, layer2 = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    x = torch.randn(2, 4, requires_grad=True)
    layer2(torch.relu(layer1(x))).sum().backward()
    assert nested.leaf_grads["layer1.weight"].data == pytest.approx(layer1.weight.grad.flatten().tolist())
    assert nested.leaf_grads["layer1.bias"].data == pytest.approx(layer1.bias.grad.tolist())
    assert outer.leaf_grads["x"].data == pytest.approx(x.grad.flatten().tolist())
    # non-reentrant: an ordinary graph whose saved tensors are recomputed
    assert sorted(n.name for n in plain.nodes if n.recomputed) == ["AddmmBackward0", "ReluBackward0"]
    assert not any(n.recomputed for n in outer.nodes)


def test_integer_and_unnamed_constant_inputs_are_named_as_cuts(tmp_path):
    path = tmp_path / "ints.py"
    path.write_text("import torch\nw = torch.tensor([1.0, 2.0], requires_grad=True)\ncounts = torch.tensor([3, 4])\n"
                    "loss = (w * counts).sum() + torch.ones(2).sum()\nloss.backward()\n")
    call = capture_script(str(path)).calls[0]
    assert sorted((n.name, c["cause"], c["name"], c["value"]) for n in call.nodes for c in n.cuts or ()) == [
        ("AddBackward0", "constant", None, "tensor(2)"), ("MulBackward0", "integer", "counts", "[2] tensor")]


def test_every_example_has_a_print_picture_shown_in_the_examples_readme():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    readme = (root / "resources" / "examples" / "README.md").read_text()
    for script in sorted((root / "resources" / "examples").glob("[0-9]*.py")):
        picture = root / "docs" / "images" / "examples" / f"{script.stem}.png"
        assert picture.is_file() and picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", script.name
        assert f"../../docs/images/examples/{script.stem}.png" in readme, script.name
        assert f"`{script.name}`" in readme, script.name


def test_unnamed_saved_tensors_are_named_by_the_node_that_made_them():
    from core.model.attrs import saved_label
    from core.model.trace import CallInfo, NodeInfo, Saved, TensorInfo, Values

    def t(tid, name, fn=None):
        return TensorInfo(id=tid, name=name, shape=[2], dtype="float32", device="cpu", requires_grad=True,
                          is_leaf=fn is None, retains_grad=False, stride=[1], storage_offset=0, storage=None,
                          version=0, values=Values(numel=2), grad_fn_name=fn)

    node = NodeInfo(id="n0", name="NllLossBackward0", kind="backward", next=[None],
                    saved=[Saved("self", "t1"), Saved("weight", "t2"), Saved("target", "t3")])
    call = CallInfo(id="c0", index=0, api="Tensor.backward", line=1, roots=["n0"], nodes=[node],
                    tensors=[t("t1", None, "LogSoftmaxBackward0"), t("t2", None), t("t3", "labels")])
    assert [saved_label(call, s) for s in node.saved] == [
        "self = output of LogSoftmaxBackward0", "weight = [2] tensor", "target = labels"]


def test_the_seed_gradient_given_to_backward_is_recorded_and_shown(tmp_path):
    path = tmp_path / "seed.py"
    path.write_text("import torch\nx = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)\ny = x * 2\n"
                    "y.backward(torch.tensor([0.5, 1.0, 2.0]))\nz = (x * x).sum()\nz.backward()\n")
    first, second = trace_from_json(capture_script(str(path)).to_json()).calls
    assert first.options["seed"] == [{"numel": 3, "data": [0.5, 1.0, 2.0]}]
    assert seed_text(first, first.node(first.roots[0])) == "seed: gradient = [0.5, 1, 2]"
    assert "seed" not in second.options
    assert seed_text(second, second.node(second.roots[0])) == "seed: 1 (d out / d out)"


@pytest.mark.slow
def test_call_options_reach_the_app_through_the_worker(tmp_path):
    """Calls are streamed as soon as they are stored: options must be on them by then."""
    from core.client.handle import run_capture

    path = tmp_path / "ckpt.py"
    path.write_text(textwrap.dedent(CHECKPOINT) + "y = layer2(x).sum()\ny.backward(torch.tensor(3.0))\n")
    trace = run_capture(str(path), timeout=120).trace
    by_index = {c.index: c for c in trace.calls}
    assert by_index[0].options["nested"] == [1]
    assert by_index[1].options["nested_in"] == 0
    assert by_index[3].options["seed"] == [{"numel": 1, "data": [3.0]}]


@pytest.mark.slow
def test_checkpoint_node_shows_and_opens_its_nested_backward(tmp_path, qtbot, monkeypatch):
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest

    from app.cli.commands import main as cli_main
    from core.layout.compound import layout_call
    from core.model.nesting import link_nested, nested_calls
    from widgets.graph.view import GraphView

    example = "resources/examples/14_checkpointing.py"
    trace = capture_script(example)
    link_nested(trace.calls)
    outer, nested = (next(c for c in trace.calls if c.index == i) for i in (0, 1))
    ckpt = next(n for n in outer.nodes if n.name == "CheckpointFunctionBackward")
    (inner,) = nested_calls(outer, ckpt)
    assert (inner.id, inner.index, inner.nodes) == (nested.id, 1, 6)
    assert inner.ops == (("ReluBackward0", 1), ("AddmmBackward0", 1), ("TBackward0", 1), ("AccumulateGrad", 3))
    assert nested_calls(outer, next(n for n in outer.nodes if n.name == "SumBackward0")) == []
    assert layout_call(outer).nodes[ckpt.id].label.split("\n") == [
        "CheckpointFunctionBackward", "hidden", "⤷ backward #1: 6 nodes",
        "  ReluBackward0, AddmmBackward0", "  TBackward0, 3 × AccumulateGrad"]
    assert "_nested_calls" not in trace.to_json()  # derived from the trace, never saved in it

    view = GraphView()
    qtbot.addWidget(view)
    view.resize(900, 900)
    view.show()
    view.set_peer_calls(trace_from_json(trace.to_json()).calls)  # a trace read from a file links too
    view.set_call(next(c for c in view._peers if c.index == 0), sync=True)
    assert "backward #1: 6 nodes" in view.node_items[ckpt.id].box.label
    opened = []
    view.sig_open_call.connect(opened.append)
    pos = view.mapFromScene(view.node_items[ckpt.id].sceneBoundingRect().center())
    QTest.mouseDClick(view.viewport(), Qt.LeftButton, Qt.NoModifier, pos)
    assert opened == [nested.id]
    action = next(a for a in view.context_menu(pos).actions() if a.text() == "Show nested backward #1")
    action.trigger()
    assert opened == [nested.id, nested.id]
    sum_pos = view.mapFromScene(view.node_items[outer.roots[0]].sceneBoundingRect().center())
    assert not view.open_nested(outer.roots[0]) and opened == [nested.id] * 2
    assert not any(a.text().startswith("Show nested") for a in view.context_menu(sum_pos).actions())

    monkeypatch.setenv("BACKPROP_STUDIO_SETTINGS", str(tmp_path / "settings.ini"))
    from app.window.window import MainWindow

    window = MainWindow(timeout=60)
    qtbot.addWidget(window)
    try:
        window.show_trace(trace)
        window.show_call(outer.id)
        assert window.call is outer
        window.graph.sig_open_call.emit(nested.id)  # what the double-click sends
        assert window.call is nested
    finally:
        window.handle.close()

    out = tmp_path / "outer.svg"
    assert cli_main(["export", example, "-o", str(out)]) == 0
    svg = out.read_text()
    assert "backward #1: 6 nodes" in svg and "3 × AccumulateGrad" in svg and "runs backward #1 inside" not in svg


def _edge_shapes(view):
    """The view's layout, each edge's line as a 2 px wide shape, and each edge's arrowhead."""
    from PySide6.QtGui import QPainterPathStroker

    from widgets.graph.items import edge_path
    from widgets.graph.teaching import _head

    lay = view.graph_layout()
    curved, horizontal = lay.engine != "dot", lay.direction == "LR"
    stroker = QPainterPathStroker()
    stroker.setWidth(2.0)
    lines = [stroker.createStroke(edge_path(e.points, curved, horizontal)) for e in lay.edges]
    heads = [_head(e.points, curved, horizontal) for e in lay.edges]
    return lay, lines, heads


@pytest.mark.parametrize("direction", ["TB", "LR", "forward"])
def test_cut_labels_cross_no_edge_and_edge_texts_hide_no_arrowhead(qtbot, direction):
    """02_polynomial with values: each cut label stays off every edge line, and no text (gradient
    on an edge, seed, cut label) covers an arrowhead."""
    from pathlib import Path

    from widgets.export.graph_export import offscreen_view

    example = Path(__file__).resolve().parents[2] / "resources" / "examples" / "02_polynomial.py"
    call = capture_script(str(example)).calls[0]
    with offscreen_view(call, values=True, direction=direction) as view:
        lay, lines, heads = _edge_shapes(view)
        tips = [e.points[-1] for e in lay.edges]
        notes = [t for t in view.marks.tags if t.kind in ("cut", "value")]
        cuts = [t for t in notes if t.kind == "cut"]
        assert sorted(" ".join(t.lines) for t in cuts) == ["✂ Python number 1", "✂ Python number 2"]
        grads = [e for e in view.edge_items if e.label_text().startswith("grad = ")]
        assert len(grads) == len(lay.edges) == 5
        for t in cuts:
            assert not [i for i, line in enumerate(lines) if line.intersects(t.text_rect())], (direction, t.lines)
        texts = [(t.lines, t.text_rect()) for t in notes] + [(e.label_text(), e.label_rect()) for e in grads]
        for what, r in texts:
            assert not any(r.contains(x, y) for x, y in tips), (direction, what)
            assert not any(r.intersects(h) for h in heads), (direction, what)


@pytest.fixture(scope="module")
def marked_calls():
    """Calls whose graphs carry every kind of mark: stale and in-place tags (08_inplace_error),
    broadcast marks (28_broadcasting_backward), device tags and a device change on an edge."""
    from pathlib import Path

    from tests.widgets.test_graph_marks import device_call

    examples = Path(__file__).resolve().parents[2] / "resources" / "examples"
    out = {name: capture_script(str(examples / f"{name}.py")).calls[0]
           for name in ("08_inplace_error", "28_broadcasting_backward")}
    out["device"] = device_call("cuda:0")
    return out


@pytest.mark.parametrize("direction", ["TB", "LR", "forward"])
def test_no_mark_covers_an_arrowhead_or_crosses_an_edge(qtbot, marked_calls, direction):
    """Every mark (tags on nodes, device and broadcast marks on edges, cut stubs) is placed
    for the direction it is drawn in: beside its edge or node, never over an arrowhead, an edge's
    line, a box it does not belong to, or another mark."""
    from widgets.export.graph_export import offscreen_view

    kinds = set()
    for name, call in marked_calls.items():
        with offscreen_view(call, direction=direction) as view:
            lay, lines, heads = _edge_shapes(view)
            boxes = {v: view.node_items[v].sceneBoundingRect().adjusted(1, 1, -1, -1) for v in lay.nodes}
            placed = []
            for t in view.marks.tags:
                kinds.add(t.kind)
                r = t.text_rect() if hasattr(t, "text_rect") else t.sceneBoundingRect().adjusted(1.5, 1.5, -1.5, -1.5)
                where = (direction, name, t.kind, getattr(t, "text", None) or t.lines)
                assert not any(r.intersects(h) for h in heads), where
                assert not any(line.intersects(r) for line in lines), where
                own = t.target if isinstance(t.target, str) else None
                assert not [v for v, b in boxes.items() if v != own and b.intersects(r)], where
                assert not [p for p in placed if p.intersects(r)], where
                placed.append(r)
            for e in view.edge_items:  # broadcast marks are edge labels (see test_label_placement)
                if e.mark_text:
                    kinds.add("mark")
                    assert not any(e.label_rect().intersects(h) for h in heads), (direction, name, e.mark_text)
    assert kinds == {"stale", "inplace", "device", "device_edge", "mark", "cut"}
