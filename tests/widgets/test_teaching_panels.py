"""What the panels teach: the Calls list's options and grad history, NumPy arrays in the Storage view,
its export, the inspector's formulas, causes and decoded values, and multi-output labels."""

import textwrap

import pytest

from core.worker.capture.recorder import capture_script
from core.model.trace_json import trace_from_json


def test_calls_list_shows_options_grad_history_and_groups_gradcheck(tmp_path, qtbot):
    from core.model.call_notes import call_flags, grad_history, group_calls
    from widgets.panels.calls import CallsPanel

    path = tmp_path / "acc.py"
    path.write_text(textwrap.dedent("""
        import torch
        x = torch.tensor(2.0, requires_grad=True)
        for i in range(3):
            y = x * x
            y.backward(retain_graph=(i == 1))
            if i == 1:
                x.grad = None
        def f(a):
            return (a * a).sum()
        inp = torch.randn(3, dtype=torch.float64, requires_grad=True)
        torch.autograd.gradcheck(f, (inp,))
    """))
    trace = trace_from_json(capture_script(str(path)).to_json())
    history = grad_history(trace)
    c0, c1, c2 = trace.calls[:3]
    assert history[c0.id] == ["x.grad 4"]
    assert history[c1.id] == ["x.grad 8"]  # accumulated: 4 + 4
    assert history[c2.id] == ["↺ x.grad = None", "x.grad 4"]
    assert call_flags(c1) == ["retain_graph"] and call_flags(c0) == []
    groups = group_calls(trace.calls)
    assert [len(g) for g in groups] == [1, 1, 1, len(trace.calls) - 3]
    assert len(trace.calls) - 3 > 1 and all(c.options["within"] == "gradcheck" for c in groups[-1])
    panel = CallsPanel()
    qtbot.addWidget(panel)
    panel.set_trace(trace)
    rows = [panel.list.item(r).text() for r in range(panel.list.count())]
    assert len(rows) == 4
    assert rows[1] == "#1 Tensor.backward · line 6 · 2 nodes · retain_graph · x.grad 8"
    last = trace.calls[-1].index
    assert rows[3].startswith(f"#3–#{last} gradcheck · line 12 · {len(trace.calls) - 3} calls inside")


def test_numpy_arrays_sharing_memory_are_shown_in_the_storage_view(tmp_path, qtbot):
    from widgets.storage.view import StorageView

    path = tmp_path / "np_share.py"
    path.write_text(textwrap.dedent("""
        import numpy as np
        import torch
        array = np.arange(6, dtype=np.float32)
        shared = torch.from_numpy(array)
        row = array[2:4]
        copied = torch.tensor(array)
        back = shared.numpy()
    """))
    trace = trace_from_json(capture_script(str(path)).to_json())
    named = {t.name: t for t in trace.tensors if t.name}
    storage = next(s for s in trace.storages if s.id == named["shared"].storage)
    peers = {a["name"]: a for a in storage.numpy}
    assert sorted(peers) == ["array", "back", "row"]
    assert peers["row"]["offset"] == 2 and peers["row"]["shape"] == [2] and peers["row"]["strides"] == [1]
    copy_storage = next(s for s in trace.storages if s.id == named["copied"].storage)
    assert copy_storage.numpy is None
    view = StorageView()
    qtbot.addWidget(view)
    view.set_tensor(trace, named["shared"].id)
    assert view.shared_label.text() == "Same storage: 3 NumPy arrays"
    assert [r[1] for r in view.shared_rows()] == ["NumPy array (float32), same memory"] * 3
    view.set_tensor(trace, named["copied"].id)
    assert view.shared_label.text() == "No other captured tensor uses this storage."


@pytest.mark.slow
def test_storage_view_exports_headless_and_from_the_app(tmp_path, qtbot):
    from PySide6.QtGui import QImage

    from app.cli.commands import main as cli_main
    from widgets.storage.export import StorageExportError, export_view_copy, find_tensor
    from widgets.storage.view import StorageView

    script = tmp_path / "views.py"
    script.write_text("import torch\nx = torch.arange(12.0).reshape(3, 4)\nxt = x.t()\n")
    out = tmp_path / "xt.svg"
    assert cli_main(["export", str(script), "--storage", "xt", "-o", str(out)]) == 0
    svg = out.read_text()
    assert "<svg" in svg and "xt" in svg and "(1, 4)" in svg  # the title and the stride
    assert "Same storage: 2 other tensors<" in svg and "click a tensor" not in svg  # no screen-only hint
    trace = capture_script(str(script))
    with pytest.raises(StorageExportError, match="named tensors: x, xt"):
        find_tensor(trace, "nope")
    view = StorageView()
    qtbot.addWidget(view)
    source, tid = find_tensor(trace, "xt")
    view.set_tensor(source, tid, trace.storages)
    size = view.size()
    png = export_view_copy(view, tmp_path / "xt.png")
    assert view.size() == size  # the live view keeps its layout
    assert view.shared_label.text() == "Same storage: 2 other tensors (click a tensor to show it)"
    image = QImage(str(png))
    assert image.width() >= 1000 and image.height() > 400
    assert image.pixelColor(5, 5).name() == "#ffffff"  # print look: white paper
    pdf = export_view_copy(view, tmp_path / "xt.pdf")
    assert pdf.read_bytes().startswith(b"%PDF")


def test_inspector_shows_formula_causes_hooks_and_decoded_values(tmp_path, qtbot):
    from widgets.panels.inspector import InspectorPanel

    path = tmp_path / "insp.py"
    path.write_text(textwrap.dedent("""
        import torch
        import torch.nn.functional as F
        a = torch.tensor([1.0, 2.0], requires_grad=True)
        b = torch.tensor([3.0, 4.0], requires_grad=True)
        c = a * b
        c.register_hook(lambda g: g)
        frozen = c.detach()
        logits = torch.stack([c, frozen + 1])
        loss = F.cross_entropy(logits, torch.tensor([0, 1]))
        loss.backward()
    """))
    call = capture_script(str(path)).calls[0]
    panel = InspectorPanel()
    qtbot.addWidget(panel)
    mul = next(n for n in call.nodes if n.name == "MulBackward0")
    panel.show_node(call, mul.id)
    text = panel.text()
    assert "grad_self (a) = grad_c · b\ngrad_other (b) = grad_c · a" in text
    assert "= a shape 2 float32" in text and "= b shape 2 float32" in text
    assert "<lambda> (line 7): registered with register_hook on c" in text
    stack = next(n for n in call.nodes if n.name == "StackBackward0")
    panel.show_node(call, stack.id)
    assert "None: [2] tensor · detached: made by .detach(), which shares memory but cuts the graph" in panel.text()
    nll = next(n for n in call.nodes if n.name == "NllLossBackward0")
    panel.show_node(call, nll.id)
    text = panel.text()
    assert "reduction\n= 'mean'" in text and "ignore_index\n= -100" in text
    leaf = next(n for n in call.nodes if n.label == "a")
    panel.show_node(call, leaf.id)
    assert "accumulates into a.grad" in panel.text()


def test_a_long_formula_wraps_outside_brackets_instead_of_widening_the_inspector(tmp_path, qtbot):
    from widgets.panels.inspector import InspectorPanel, breakable_formula

    nbsp = "\u00a0"
    assert breakable_formula("grad_self (a) = grad · result · (1 − result)") == (
        f"grad_self{nbsp}(a) = grad · result · (1{nbsp}−{nbsp}result)")
    assert breakable_formula("g = −grad · w[labels] / total at [i, t_i], 0 elsewhere") == (
        f"g = −grad · w[labels] / total at{nbsp}[i,{nbsp}t_i], 0 elsewhere")
    path = tmp_path / "sig.py"
    path.write_text("import torch\na = torch.tensor([0.5, 1.0, 2.0], requires_grad=True)\n"
                    "result = torch.sigmoid(a)\nresult.sum().backward()\n")
    call = capture_script(str(path)).calls[0]
    panel = InspectorPanel()
    qtbot.addWidget(panel)
    panel.resize(330, 700)
    panel.show()
    sig = next(n for n in call.nodes if n.name == "SigmoidBackward0")
    panel.show_node(call, sig.id)
    assert "grad_self (a) = grad_result · result · (1 − result)" in panel.text()
    assert panel.browser.horizontalScrollBar().maximum() == 0  # no sideways scrolling to read it
    doc = panel.browser.document()
    block = doc.findBlock(doc.toPlainText().index("grad_self (a)"))
    layout = block.layout()
    lines = [block.text()[layout.lineAt(i).textStart():][:layout.lineAt(i).textLength()].strip()
             for i in range(layout.lineCount())]
    assert len(lines) == 2 and lines[1].replace(nbsp, " ") == "(1 − result)"  # the bracket moves whole
    # A long bracketed group breaks at its own spaces in a narrow panel, never inside a word.
    text = "grad_self (x) = grad copied to every element (expand to self_sym_sizes)"
    assert breakable_formula(text) == text.replace(" (x)", f"{nbsp}(x)")
    path.write_text("import torch\nx = torch.ones(3, requires_grad=True)\nx.sum().backward()\n")
    call = capture_script(str(path)).calls[0]
    panel.resize(200, 700)
    total = next(n for n in call.nodes if n.name == "SumBackward0")
    panel.show_node(call, total.id)
    doc = panel.browser.document()
    block = doc.findBlock(doc.toPlainText().index("grad_self (x) = grad"))
    layout = block.layout()
    lines = [block.text()[layout.lineAt(i).textStart():][:layout.lineAt(i).textLength()].strip()
             for i in range(layout.lineCount())]
    assert len(lines) >= 3 and " ".join(lines).replace(nbsp, " ") == text, lines  # each break at a space
    assert panel.browser.horizontalScrollBar().maximum() == 0


def test_multi_output_nodes_are_labelled_with_every_output_and_edges_with_next_functions(tmp_path, qtbot):
    from widgets.export.graph_export import offscreen_view

    path = tmp_path / "multi.py"
    path.write_text(textwrap.dedent("""
        import torch
        x = torch.randn(3, 4, requires_grad=True)
        first, second, third = x.unbind(0)
        left, right = x.split(2, dim=1)
        loss = first.sum() + third.sum() + right.sum()
        loss.backward()
    """))
    call = capture_script(str(path)).calls[0]
    labels = {n.name: n.label for n in call.nodes}
    assert labels["UnbindBackward0"] == "first, second, third"
    assert labels["SplitBackward0"] == "left, right"
    unbind = next(n.id for n in call.nodes if n.name == "UnbindBackward0")
    with offscreen_view(call, slots=True) as view:
        slots = sorted(" ".join(t.lines) for t in view.marks.tags if t.kind == "slot")
        assert slots.count("next[0] = (UnbindBackward0, 0)") == 1
        assert "next[0] = (UnbindBackward0, 2)" in slots  # third is output 2 of unbind
        assert len(slots) == sum(1 for n in call.nodes for e in n.next if e is not None)
        assert unbind in view.node_items
