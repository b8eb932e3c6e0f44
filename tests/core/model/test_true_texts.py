"""Texts the app shows that must say exactly what happens."""

from __future__ import annotations

import pytest

from core.model.formulas import FORMULAS, formula_lines


def test_accumulate_grad_names_the_leafs_grad_not_a_renamed_attribute():
    assert formula_lines("AccumulateGrad", {}, [], "fc2.weight") == [
        "fc2.weight.grad += grad_fc2.weight (or fc2.weight.grad = grad_fc2.weight when it is None)"]
    assert formula_lines("AccumulateGrad") == ["variable.grad += grad (or variable.grad = grad when it is None)"]


def test_names_followed_by_a_mark_are_substituted():
    assert formula_lines("TBackward0", {}, ["x"], "y") == ["grad_self (x) = grad_yᵀ"]
    assert formula_lines("MmBackward0", {"self": "x", "mat2": "w"}, ["x", "w"], "y") == [
        "grad_self (x) = grad_y @ wᵀ", "grad_mat2 (w) = xᵀ @ grad_y"]
    assert formula_lines("DivBackward0", {"self": "a", "other": "b"}, ["a", "b"], "c") == [
        "grad_self (a) = grad_c / b", "grad_other (b) = −grad_c · a / b²"]


def test_no_name_is_rewritten_after_a_dot_or_inside_a_longer_name():
    names = {"self": "x", "other": "z", "mat2": "w", "indices": "idx", "weight": "W"}
    for node in FORMULAS:
        for line in formula_lines(node, names, [], "out"):
            assert ".grad_out" not in line, (node, line)
            assert "x_sym_sizes" not in line and "x_sym_numel" not in line, (node, line)
    assert formula_lines("ViewBackward0", {"self": "x"}, ["x"], "y") == [
        "grad_self (x) = grad_y reshaped to self_sym_sizes"]


MOVED = """\
import torch
w = torch.tensor([1.0, 2.0], requires_grad=True)
y = w.to("meta", torch.float64)
loss = (y * 3).sum()
loss.backward()
"""


def test_device_and_dtype_chips_both_say_the_way_the_gradient_goes(tmp_path):
    from core.model.anatomy import device_changes
    from core.model.edge_marks import mark_text
    from core.model.trace_json import trace_from_json
    from core.worker.capture.recorder import capture_script

    path = tmp_path / "moved.py"
    path.write_text(MOVED)
    call = trace_from_json(capture_script(str(path)).to_json()).calls[0]  # backward then fails: meta has no data
    to_copy = next(n for n in call.nodes if n.name == "ToCopyBackward0")
    into_w = call.node(to_copy.next[0].node)
    assert into_w.name == "AccumulateGrad" and call.tensor(into_w.variable).name == "w"
    # the gradient arrives as float64 on meta and is cast and copied to w's float32 on cpu
    assert [mark_text(m) for m in to_copy.edge_marks] == ["float64 → float32"]
    changes = [c for c in device_changes(call) if c.src == to_copy.id]
    assert [(c.dst, c.text) for c in changes] == [(into_w.id, "meta → cpu")]


CROSS_ENTROPY = """\
import torch
import torch.nn.functional as F
logits = torch.tensor([[1.0, 2.0, 0.5], [0.1, 0.2, 3.0]], requires_grad=True)
loss = F.cross_entropy(logits, torch.tensor([1, 2]))
loss.backward()
"""


def cross_entropy_trace(tmp_path):
    from core.worker.capture.recorder import capture_script

    path = tmp_path / "ce.py"
    path.write_text(CROSS_ENTROPY)
    trace = capture_script(str(path))
    assert trace.error is None, trace.error
    return trace


def test_the_trace_file_stores_ignore_index_signed(tmp_path):
    import json

    from core.model.attrs import saved_label
    from core.model.trace_json import trace_from_json

    text = cross_entropy_trace(tmp_path).to_json()
    nll = next(n for n in json.loads(text)["calls"][0]["nodes"] if n["name"] == "NllLossBackward0")
    assert {s["name"]: s.get("value") for s in nll["saved"]}["ignore_index"] == -100
    assert "18446744073709551516" not in text
    call = trace_from_json(text).calls[0]
    saved = next(s for n in call.nodes if n.name == "NllLossBackward0" for s in n.saved if s.name == "ignore_index")
    assert saved.value == -100 and saved_label(call, saved) == "ignore_index = -100"


ITEMS = """\
import torch
x = torch.tensor([1.0, 2.0, 0.0], requires_grad=True)
w = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
scale = (x.sum() * 2).item()
y = (w * scale).sum() + x.sum().item() + 20
y.backward()
"""


def test_item_cuts_name_the_call_and_its_variable(tmp_path):
    from core.model.causes import cut_text
    from core.model.trace_json import trace_from_json
    from core.worker.capture.recorder import capture_script

    path = tmp_path / "items.py"
    path.write_text(ITEMS)
    trace = capture_script(str(path))
    assert trace.error is None, trace.error
    call = trace_from_json(trace.to_json()).calls[0]
    cuts = sorted((n.name, cut_text(c, short=True)) for n in call.nodes for c in n.cuts or ())
    assert cuts == [("AddBackward0", "Python number 20"), ("AddBackward0", "x.sum().item() → 3"),
                    ("MulBackward0", "scale = (x.sum() * 2).item() → 6")]
    mul = next(c for n in call.nodes if n.name == "MulBackward0" for c in n.cuts)
    assert cut_text(mul) == ("scale = (x.sum() * 2).item() → 6 · a Python number taken out with .item(): "
                             "no gradient flows back through it")
    assert cut_text({"input": 1, "cause": "item", "name": None, "value": "6"}, short=True) == ".item() → 6"


@pytest.mark.slow
def test_item_cuts_reach_the_app_through_the_worker(tmp_path):
    from core.client.handle import run_capture
    from core.model.causes import cut_text

    path = tmp_path / "items.py"
    path.write_text(ITEMS)
    trace = run_capture(str(path), timeout=120).trace
    assert trace.error is None, trace.error
    cuts = sorted(cut_text(c, short=True) for n in trace.calls[0].nodes for c in n.cuts or ())
    assert cuts == ["Python number 20", "scale = (x.sum() * 2).item() → 6", "x.sum().item() → 3"]


def test_an_item_call_over_several_lines_is_named_on_one(tmp_path):
    from core.model.causes import cut_text
    from core.worker.capture.recorder import capture_script

    path = tmp_path / "lines.py"
    path.write_text("import torch\nx = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)\n"
                    "total: float = (\n    x.sum()\n    * 2\n).item()\ny = (x * total).sum()\ny.backward()\n")
    call = capture_script(str(path)).calls[0]
    assert [cut_text(c, short=True) for n in call.nodes for c in n.cuts or ()] == [
        "total = (x.sum() * 2).item() → 12"]
