"""An error raised by a torch op in forward: the op, its line and inputs, and the graph it failed on,
in the trace and through its JSON and columns round trips."""

import json
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from core.model.forward_errors import error_title, mark_text, mark_tip, op_title  # noqa: E402
from core.model.trace import TraceFormatError  # noqa: E402
from core.model.trace_json import trace_from_json  # noqa: E402
from core.protocol.column_reader import decode  # noqa: E402
from core.protocol.columns import encode  # noqa: E402
from core.worker.capture.recorder import capture_script  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[3] / "resources" / "examples"
LEAF_MESSAGE = "a leaf Variable that requires grad is being used in an in-place operation."


def _capture(tmp_path, source: str):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    return capture_script(str(script))


def _nodes(call):
    return [(n.id, n.name, n.label) for n in call.nodes]


def _leaf_inplace():
    return capture_script(str(EXAMPLES / "18_inplace_on_leaf.py"))


def test_an_in_place_op_on_a_leaf_names_the_op_its_line_and_the_leaf():
    trace = _leaf_inplace()
    x = {"position": 0, "name": "x", "shape": [2], "dtype": "float32", "requires_grad": True, "is_leaf": True,
         "node": "n0"}
    # `x += 1` at line 17 runs as add_ on x, the leaf of the graph backwarded at line 14
    assert trace.error.line == 17
    assert trace.error.failed_op == {"name": "add_", "text": "x.add_(1)", "line": 17, "inputs": [x], "call": "c1"}
    assert [c.api for c in trace.calls] == ["Tensor.backward", "unreached"]
    failed = trace.calls[1]
    assert failed.id == "c1" and _nodes(failed) == [("n0", "AccumulateGrad", "x")] and failed.roots == ["n0"]
    assert failed.options["failed_op"] == {"name": "add_", "text": "x.add_(1)", "line": 17, "inputs": [x],
                                           "type": "RuntimeError", "message": LEAF_MESSAGE}
    assert mark_text(failed.options["failed_op"]) == \
        "x.add_(1) failed: a leaf that requires grad cannot be changed in place (line 17)"
    assert error_title(trace.error) == f"RuntimeError at line 17: {LEAF_MESSAGE}"
    assert op_title(failed.options["failed_op"]) == error_title(trace.error)
    # the call that ran backward is as it was: no failed op on it
    assert "failed_op" not in trace.calls[0].options and trace.calls[0].error is None


def test_numpy_on_a_tensor_that_requires_grad(tmp_path):
    trace = _capture(tmp_path, """\
        import torch
        w = torch.ones(3, requires_grad=True)
        h = w * 2
        a = h.numpy()
        """)
    h = {"position": 0, "name": "h", "shape": [3], "dtype": "float32", "requires_grad": True, "is_leaf": False,
         "node": "n0"}
    assert trace.error.failed_op == {"name": "numpy", "text": "h.numpy()", "line": 4, "inputs": [h], "call": "c0"}
    call = trace.calls[0]
    assert _nodes(call) == [("n0", "MulBackward0", "h"), ("n1", "AccumulateGrad", "w")] and call.roots == ["n0"]
    op = call.options["failed_op"]
    assert op["message"] == "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead."
    assert mark_text(op) == "h.numpy() failed: a tensor that requires grad has no .numpy(); call h.detach().numpy() " \
                            "(line 4)"
    assert error_title(trace.error) == "RuntimeError at line 4: Can't call numpy() on Tensor that requires grad. " \
                                       "Use tensor.detach().numpy() instead."


def test_numpy_on_an_unnamed_tensor_says_the_fix_without_a_name():
    unnamed = {"position": 0, "name": None, "shape": [3], "dtype": "float32", "requires_grad": True,
               "is_leaf": False, "node": "n0"}
    op = {"name": "numpy", "text": "tensor(3).numpy()", "line": 2, "inputs": [unnamed], "type": "RuntimeError",
          "message": "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead."}
    assert mark_text(op) == "tensor(3).numpy() failed: a tensor that requires grad has no .numpy(); " \
                            "call .detach().numpy() (line 2)"


def test_a_shape_mismatch_in_a_function_names_its_locals(tmp_path):
    trace = _capture(tmp_path, """\
        import torch


        def layer(x, w):
            h = x * 2
            return torch.mm(h, w)


        x = torch.ones(2, 3, requires_grad=True)
        w = torch.ones(4, 5, requires_grad=True)
        out = layer(x, w)
        """)
    op = trace.error.failed_op
    assert (op["name"], op["text"], op["line"], op["call"]) == ("mm", "torch.mm(h, w)", 6, "c0")
    assert op["inputs"] == [
        {"position": 0, "name": "h", "shape": [2, 3], "dtype": "float32", "requires_grad": True, "is_leaf": False,
         "node": "n0"},
        {"position": 1, "name": "w", "shape": [4, 5], "dtype": "float32", "requires_grad": True, "is_leaf": True,
         "node": "n2"}]
    call = trace.calls[0]
    # h lives only in the failing frame; both inputs' nodes are roots of the partial graph
    assert _nodes(call) == [("n0", "MulBackward0", "h"), ("n1", "AccumulateGrad", "x"), ("n2", "AccumulateGrad", "w")]
    assert call.roots == ["n0", "n2"]
    assert mark_text(call.options["failed_op"]) == \
        "torch.mm(h, w) failed: shapes 2×3 and 4×5 cannot be multiplied (3 ≠ 4) (line 6)"
    assert mark_tip(call.options["failed_op"]) == (
        "torch.mm(h, w) raised RuntimeError at line 6:\n"
        "mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)\n\n"
        "Called on:\n"
        "h: shape 2×3 · float32 · requires grad (not a leaf)\n"
        "w: shape 4×5 · float32 · leaf · requires grad\n\n"
        "The graph shows what the script had built when the op failed; backward never ran on it.")
    assert error_title(trace.error) == "RuntimeError at line 6: mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"


def test_a_broadcast_mismatch_in_add_marks_the_input_with_a_graph(tmp_path):
    trace = _capture(tmp_path, """\
        import torch
        a = torch.ones(2, 3, requires_grad=True)
        b = torch.ones(4)
        c = a + b
        """)
    op = trace.calls[0].options["failed_op"]
    assert (op["name"], op["text"]) == ("add", "a.add(b)")
    assert [(i["name"], i["node"]) for i in op["inputs"]] == [("a", "n0"), ("b", None)]
    assert mark_text(op) == "a.add(b) failed: sizes 3 and 4 at dimension 1 do not broadcast (line 4)"


def test_an_op_on_tensors_without_graph_records_the_op_and_no_call(tmp_path):
    trace = _capture(tmp_path, """\
        import torch
        c = torch.ones(2, 3) @ torch.ones(4, 5)
        """)
    assert trace.calls == []
    op = trace.error.failed_op
    assert (op["name"], op["text"], op["line"], op["call"]) == ("matmul", "tensor(2×3).matmul(tensor(4×5))", 2, None)
    assert [(i["name"], i["requires_grad"], i["node"]) for i in op["inputs"]] == [(None, False, None)] * 2


def test_the_scripts_own_error_has_no_failed_op(tmp_path):
    trace = _capture(tmp_path, """\
        import torch
        x = torch.ones(2, requires_grad=True)
        y = x * 3
        raise ValueError("the script's own error")
        """)
    assert trace.error.type == "ValueError" and trace.error.failed_op is None
    assert [c.api for c in trace.calls] == ["unreached"] and "failed_op" not in trace.calls[0].options
    assert "failed_op" not in json.loads(trace.to_json())["error"]


@pytest.mark.parametrize("failing", [
    "y.backward()  # a second time",
    "(x * 2).backward()  # not a scalar",
    "x.register_hook(lambda g: g @ torch.ones(5, 5))\ny = (x * x).sum()\ny.backward()",
])
def test_an_error_in_backward_is_no_failed_op(tmp_path, failing):
    trace = _capture(tmp_path, "import torch\nx = torch.ones(2, requires_grad=True)\ny = (x * x).sum()\n"
                               "y.backward(retain_graph=False)\n" + failing + "\n")
    assert trace.error.type == "RuntimeError" and trace.error.failed_op is None
    assert [c.api for c in trace.calls] == ["Tensor.backward", "Tensor.backward"]
    assert trace.calls[1].error is not None and "failed_op" not in trace.calls[1].options


# -- the trace file ------------------------------------------------------------------------------


def test_the_failed_op_round_trips_through_json_and_columns():
    trace = _leaf_inplace()
    back = trace_from_json(trace.to_json(), "run.json")
    assert back.error == trace.error and back.calls[1].options == trace.calls[1].options
    wire = decode(encode(trace))
    assert wire.error == trace.error and wire.calls[1].options["failed_op"] == trace.calls[1].options["failed_op"]


def test_a_trace_written_before_failed_ops_still_opens():
    data = json.loads(_leaf_inplace().to_json())
    del data["error"]["failed_op"]
    del data["calls"][1]["options"]["failed_op"]
    trace = trace_from_json(json.dumps(data), "old.json")
    assert trace.error.failed_op is None and trace.error.line == 17 and "failed_op" not in trace.calls[1].options


@pytest.mark.parametrize("change, field, what", [
    (lambda d: d["error"]["failed_op"].update(text=7), "error.failed_op", "'text': expected a string, got 7"),
    (lambda d: d["error"]["failed_op"].update(extra=1), "error.failed_op", "unknown key 'extra'"),
    (lambda d: d["error"]["failed_op"]["inputs"][0].pop("node"), "error.failed_op",
     "'inputs[0].node': missing"),
    (lambda d: d["error"]["failed_op"]["inputs"][0].update(grad=1), "error.failed_op",
     "'inputs[0]': unknown key 'grad'"),
    (lambda d: d["error"]["failed_op"]["inputs"][0].update(shape=[-2]), "error.failed_op",
     "'inputs[0].shape': expected a list of non-negative integers, got list"),
    (lambda d: d["calls"][1]["options"]["failed_op"].pop("message"), "calls[1].options",
     "'failed_op': 'message' missing"),
    (lambda d: d["error"]["failed_op"].update(call="c9"), "error.failed_op.call",
     "names call 'c9', which this trace does not have"),
    (lambda d: d["error"]["failed_op"].update(call="c0"), "error.failed_op.call",
     "names call 'c0', which holds no failed op"),
    (lambda d: d["calls"][1]["options"]["failed_op"]["inputs"][0].update(node="n7"),
     "calls[1].options.failed_op.inputs[0].node", "names node 'n7', which call 'c1' does not have"),
])
def test_a_wrong_failed_op_is_refused_naming_its_field(change, field, what):
    data = json.loads(_leaf_inplace().to_json())
    change(data)
    with pytest.raises(TraceFormatError) as err:
        trace_from_json(json.dumps(data), "bad.json")
    assert str(err.value) == f"bad.json: field '{field}': {what}"


def test_a_notebook_cell_names_the_failed_ops_place(tmp_path):
    cells = [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": src}
             for src in ("import torch\nx = torch.ones(2, requires_grad=True)", "y = x * 2\nx.mul_(3)")]
    path = tmp_path / "lesson.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    trace = capture_script(str(path))
    op = trace.error.failed_op
    assert (op["text"], op["where"]) == ("x.mul_(3)", "cell 2, line 2")
    assert mark_text(trace.calls[-1].options["failed_op"]) == \
        "x.mul_(3) failed: a leaf that requires grad cannot be changed in place (cell 2, line 2)"
    assert error_title(trace.error) == f"RuntimeError at cell 2, line 2: {LEAF_MESSAGE}"
    assert trace_from_json(trace.to_json(), "nb.json").error == trace.error


@pytest.mark.slow
def test_the_worker_sends_the_failed_op_with_its_graph():
    from core.client.handle import run_capture

    trace = run_capture(str(EXAMPLES / "18_inplace_on_leaf.py")).trace
    local = _leaf_inplace()
    assert trace.error.failed_op == local.error.failed_op
    assert [c.id for c in trace.calls] == ["c0", "c1"]
    assert trace.calls[1].options["failed_op"] == local.calls[1].options["failed_op"]
    assert replace(trace.error, traceback="") == replace(local.error, traceback="", line=17)
