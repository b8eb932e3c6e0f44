"""True texts of a call: a refused seed, the node blamed for an error, why .grad is None."""

import textwrap

import pytest

from core.model.causes import blamed_nodes, grad_none_cause
from core.model.trace_json import trace_from_json
from core.model.values import seed_text
from core.worker.capture.recorder import capture_script

NON_SCALAR = """
import torch
x = torch.ones(2, requires_grad=True)
y = x * 2
y.backward()
"""

UNUSED = """
import torch
x = torch.ones(2, requires_grad=True)
w = torch.ones(2, requires_grad=True)
h = x * 3
u = w * 5
loss = h.sum()
loss.backward()
"""


def _trace(tmp_path, source, name):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return trace_from_json(capture_script(str(path)).to_json())


@pytest.fixture(scope="module")
def non_scalar(tmp_path_factory):
    return _trace(tmp_path_factory.mktemp("ns"), NON_SCALAR, "ns.py")


@pytest.fixture(scope="module")
def unused(tmp_path_factory):
    return _trace(tmp_path_factory.mktemp("unused"), UNUSED, "unused.py")


def test_a_non_scalar_backward_without_gradient_says_none_was_given(non_scalar):
    call = non_scalar.calls[0]
    assert call.error is not None and call.error.line == 5
    assert "only for scalar outputs" in call.error.message
    assert seed_text(call, call.node(call.roots[0])) == (
        "seed: none given; y has 2 elements, and backward() needs a scalar or a gradient argument")


def test_a_refused_seed_blames_no_node(non_scalar):
    call = non_scalar.calls[0]
    assert {n.name for n in call.nodes} == {"MulBackward0", "AccumulateGrad"}
    assert blamed_nodes(call) == set()  # neither the leaf x nor MulBackward0 raised: the call did


def test_a_leaf_the_failed_call_never_fed_says_why(non_scalar):
    call = non_scalar.calls[0]
    x = next(t for t in call.tensors if t.name == "x")
    assert grad_none_cause(x, call) == "backward raised RuntimeError before any gradient reached it"


def test_a_tensor_the_loss_never_used_is_off_the_path(unused):
    call = unused.calls[0]
    assert call.api == "Tensor.backward"
    w = next(t for t in unused.tensors if t.name == "w")  # as the script ended: ids of another table
    assert w.grad is None
    assert grad_none_cause(w, call) == "not on the path to the loss: backward never reaches it"
    x = next(t for t in unused.tensors if t.name == "x")
    assert x.grad is not None


def test_not_reached_yet_is_said_only_while_stepping(non_scalar):
    call = non_scalar.calls[0]
    x = next(t for t in call.tensors if t.name == "x")
    assert grad_none_cause(x, call, stepping=True) == ".grad is None: backward has not reached it yet"


def test_a_graph_never_backpropagated_says_so(unused):
    never = unused.calls[1]
    assert never.api == "unreached"
    w = next(t for t in never.tensors if t.name == "w")
    assert grad_none_cause(w, never) == "no backward call ran on this graph, so no gradient reached it"


def test_the_dot_export_of_a_refused_seed_marks_no_box(non_scalar):
    from core.layout.export_dot import LEGEND_TEXT, call_to_dot

    dot = call_to_dot(non_scalar.calls[0])
    boxes = [ln for ln in dot.splitlines() if ln.startswith('  "n') and "->" not in ln]
    assert len(boxes) == 2
    assert all("penwidth=2.5" not in ln for ln in boxes)  # the error outline
    assert LEGEND_TEXT["error"] not in dot


SHAPES = """
import torch
x = torch.ones(2, requires_grad=True)
w = torch.ones(2, 3, requires_grad=True)
loss = (x * 2).sum() + (w * 3).sum()
loss.backward()
"""


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return _trace(tmp_path_factory.mktemp("shapes"), SHAPES, "shapes.py")


def test_shapes_and_values_are_told_apart_in_words(shapes):
    from core.layout.visible import edge_shapes, node_label
    from core.model.values import edge_grad_text, format_shape, leaf_value_lines

    assert (format_shape([2, 3]), format_shape([2]), format_shape([]), format_shape(None)) == (
        "shape 2×3", "shape 2", "scalar", "")
    call = shapes.calls[0]
    by_name = {n.name: n for n in call.nodes if n.kind != "accumulate_grad"}
    leaves = {node_label(call, n): n for n in call.nodes if n.kind == "accumulate_grad"}
    assert set(leaves) == {"x\nshape 2", "w\nshape 2×3"}  # a shape, never "[2, 3]"
    grads = [edge_grad_text(g) for n in call.nodes if n.name == "MulBackward0"
             for g in call.edge_grads.get(n.id) or () if g is not None]
    assert sorted(grads) == ["grad = [2, 2]", "grad = [3, 3, 3, 3, 3, 3]"]  # values after "="
    assert leaf_value_lines(call, leaves["x\nshape 2"]) == ["x = [1, 1]", ".grad = [2, 2]"]
    assert edge_shapes(call)[leaves["w\nshape 2×3"].id] == "shape 2×3"
    assert "AddBackward0" in by_name


def test_an_unnamed_tensor_is_named_by_its_shape():
    from core.model.anatomy import tensor_name
    from core.model.trace import CallInfo, TensorInfo, Values

    t = TensorInfo(id="t0", name=None, shape=[4, 3], dtype="float32", device="cpu", requires_grad=False,
                   is_leaf=True, retains_grad=False, stride=[3, 1], storage_offset=0, storage=None, version=0,
                   values=Values(numel=12))
    call = CallInfo(id="c0", index=0, api="Tensor.backward", line=1, roots=[], nodes=[], tensors=[t])
    assert tensor_name(call, t) == "a 4×3 tensor"
