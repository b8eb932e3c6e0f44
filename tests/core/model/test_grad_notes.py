"""Retained grads and autograd.grad's results, written on the node they belong to."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from core.model.grad_notes import RESULT_TIP, RETAINED_TIP, node_notes, note_tip, notes_for, returned
from core.model.trace import CallInfo, Edge, GradInfo, NodeInfo, TensorInfo, Values

EXAMPLES = Path(__file__).resolve().parents[3] / "resources" / "examples"


def tensor(tid, name, shape=(), data=None, *, leaf=False, retains=False, grad=None, grad_fn=None, output_nr=None,
           hooks=None) -> TensorInfo:
    numel = math.prod(shape)
    grad_info = None if grad is None else GradInfo(shape=list(shape), values=values(grad))
    return TensorInfo(id=tid, name=name, shape=list(shape), dtype="float32", device="cpu", requires_grad=True,
                      is_leaf=leaf, retains_grad=retains, stride=[], storage_offset=0, storage=None, version=0,
                      values=values(data if data is not None else [0.0] * numel), grad=grad_info, grad_fn=grad_fn,
                      output_nr=output_nr, hooks=hooks)


def values(data) -> Values:
    if isinstance(data, Values):
        return data
    return Values(numel=len(data), data=list(data))


def grad(data, shape=()) -> GradInfo:
    return GradInfo(shape=list(shape), values=values(data))


def node(nid, name, nxt=(), *, tensor_id=None, label=None, variable=None) -> NodeInfo:
    kind = "accumulate_grad" if name == "AccumulateGrad" else "backward"
    return NodeInfo(id=nid, name=name, kind=kind, next=[None if e is None else Edge(*e) for e in nxt],
                    tensor=tensor_id, label=label, variable=variable)


def retain_call(hidden_grad=3.0, hooks=None) -> CallInfo:
    """06_retain_grad.py: out = hidden * other_hidden, hidden = x * 3 retained, other_hidden = x + 1."""
    return CallInfo(
        id="c0", index=0, api="Tensor.backward", line=13, roots=["n0"],
        nodes=[node("n0", "MulBackward0", [("n1", 0), ("n3", 0)], tensor_id="t0", label="out"),
               node("n1", "MulBackward0", [("n2", 0), None], tensor_id="t2", label="hidden"),
               node("n2", "AccumulateGrad", [], label="x", variable="t4"),
               node("n3", "AddBackward0", [("n2", 0), None], tensor_id="t1", label="other_hidden")],
        tensors=[tensor("t0", "out", data=[18.0], grad_fn="n0"),
                 tensor("t1", "other_hidden", data=[3.0], grad_fn="n3"),
                 tensor("t2", "hidden", data=[6.0], retains=True, grad=[hidden_grad], grad_fn="n1", hooks=hooks),
                 tensor("t4", "x", data=[2.0], leaf=True, grad=[15.0])],
        edge_grads={"n0": [grad([3.0]), grad([6.0])], "n3": [grad([6.0]), None], "n1": [grad([9.0]), None]},
    )


def grad_call(results, inputs_tensors, nodes, roots=("n0",), options=None, extra_tensors=()) -> CallInfo:
    opts = {"results": results, "inputs": [r["tensor"] for r in results], **(options or {})}
    return CallInfo(id="c0", index=0, api="autograd.grad", line=5, roots=list(roots), nodes=nodes,
                    tensors=[*extra_tensors, *inputs_tensors], options=opts)


def test_a_retained_grad_is_written_on_the_node_that_made_it():
    call = retain_call()
    assert node_notes(call) == {"n1": ["hidden.grad = 3"]}
    assert notes_for(call, "n1") == ["hidden.grad = 3"]
    assert notes_for(call, "n3") == [] and notes_for(call, "n2") == []
    assert note_tip(call, "n1") == RETAINED_TIP and note_tip(call, "n3") == ""


def test_a_retained_grad_added_to_one_held_before_shows_the_sum():
    # a second backward (retain_graph=True) adds this call's 3 to the 3 the first one left
    assert node_notes(retain_call(hidden_grad=6.0)) == {"n1": ["hidden.grad = 3 (before) + 3 = 6"]}


def test_a_hook_on_the_retained_tensor_keeps_its_grad_without_a_sum():
    # the hook may have changed the gradient retain_grad() kept: no sum is claimed
    assert node_notes(retain_call(hidden_grad=6.0, hooks=["double (line 4)"])) == {"n1": ["hidden.grad = 6"]}


def _steps(hidden_grad):
    """06_retain_grad.py's backward stepped: MulBackward0 (out), MulBackward0 (hidden), AddBackward0,
    AccumulateGrad (x), as the stepper records them."""
    one = lambda v: {"numel": 1, "data": [v]}  # noqa: E731
    return [{"index": 0, "node": "n0", "name": "MulBackward0", "grad_outputs": [one(1.0)],
             "grad_inputs": [one(3.0), one(6.0)], "leaf_grads": {}, "error": None},
            {"index": 1, "node": "n1", "name": "MulBackward0", "grad_outputs": [one(3.0)],
             "grad_inputs": [one(9.0), None], "leaf_grads": {"hidden": one(hidden_grad)}, "error": None},
            {"index": 2, "node": "n3", "name": "AddBackward0", "grad_outputs": [one(6.0)],
             "grad_inputs": [one(6.0), None], "leaf_grads": {}, "error": None}]


@pytest.mark.parametrize("hidden_grad, before", [(3.0, "None"), (6.0, "3")])
def test_while_stepping_a_retained_grad_changes_when_its_node_runs(hidden_grad, before):
    from core.model.step_state import step_view

    call, steps = retain_call(hidden_grad), _steps(hidden_grad)
    seen = [node_notes(call, step_view(call, steps, upto=k).leaf_grads) for k in range(4)]
    after = f"hidden.grad = {hidden_grad:g}"
    assert seen == [{"n1": [f"hidden.grad = {before}"]}] * 2 + [{"n1": [after]}] * 2
    assert notes_for(call, "n1", {}) == [f"hidden.grad = {before}"]


def test_while_stepping_an_unnamed_retained_grad_is_keyed_by_its_node():
    call = retain_call()
    call.tensors[2].__dict__["name"] = None
    assert node_notes(call, {}) == {"n1": [".grad = None (retained)"]}
    assert node_notes(call, {"n1": {"numel": 1, "data": [3.0]}}) == {"n1": [".grad = 3 (retained)"]}


def test_a_retained_grad_never_reached_is_none():
    call = retain_call()
    t = call.tensors[2]
    t.__dict__["grad"] = None
    assert node_notes(call) == {"n1": ["hidden.grad = None"]}


def test_an_unnamed_and_a_big_retained_grad():
    big = Values(numel=24, data=None, sample=[0.0, 1.0], min=0.0, max=2.0, mean=1.0)
    call = CallInfo(
        id="c0", index=0, api="Tensor.backward", line=3, roots=["n0"],
        nodes=[node("n0", "SumBackward0", [("n1", 0)], tensor_id="t0"),
               node("n1", "AddmmBackward0", [None], tensor_id="t1")],
        tensors=[tensor("t0", None, data=[1.0], retains=True, grad=[1.0], grad_fn="n0"),
                 tensor("t1", "h", shape=(4, 6), retains=True, grad_fn="n1")],
    )
    call.tensors[1].__dict__["grad"] = GradInfo(shape=[4, 6], values=big)
    assert node_notes(call) == {"n0": [".grad = 1 (retained)"], "n1": ["h.grad = shape 4×6, μ 1 ∈ [0, 2]"]}


def test_a_retained_output_of_a_multi_output_node_sums_only_its_own_edges():
    # a, b = x.unbind(); b retained; b.grad held 1 before; this call sends 2 into output 1 and 5 into output 0
    call = CallInfo(
        id="c0", index=0, api="Tensor.backward", line=4, roots=["n0"],
        nodes=[node("n0", "AddBackward0", [("n1", 0), ("n1", 1)], tensor_id="t0"),
               node("n1", "UnbindBackward0", [None])],
        tensors=[tensor("t0", "s", data=[0.0], grad_fn="n0"),
                 tensor("t2", "b", data=[0.0], retains=True, grad=[3.0], grad_fn="n1", output_nr=1)],
        edge_grads={"n0": [grad([5.0]), grad([2.0])]},
    )
    assert node_notes(call) == {"n1": ["b.grad = 1 (before) + 2 = 3"]}


def test_autograd_grad_results_are_written_on_their_inputs():
    # gw, gb = torch.autograd.grad(z, [w, b]) with z = (w * b).sum(), w = [1, 2, 3], b = 0.5
    nodes = [node("n0", "SumBackward0", [("n1", 0)], tensor_id="t0", label="z"),
             node("n1", "MulBackward0", [("n2", 0), ("n3", 0)]),
             node("n2", "AccumulateGrad", [], label="w", variable="t2"),
             node("n3", "AccumulateGrad", [], label="b", variable="t1")]
    results = [{"tensor": "t2", "values": Values(numel=3, data=[0.5, 0.5, 0.5]).__dict__},
               {"tensor": "t1", "values": Values(numel=1, data=[6.0]).__dict__}]
    call = grad_call(results, [tensor("t1", "b", data=[0.5], leaf=True),
                               tensor("t2", "w", shape=(3,), data=[1.0, 2.0, 3.0], leaf=True)],
                     nodes, extra_tensors=[tensor("t0", "z", data=[3.0], grad_fn="n0")])
    assert node_notes(call) == {"n2": ["returns ∂z/∂w = [0.5, 0.5, 0.5]"], "n3": ["returns ∂z/∂b = 6"]}
    assert note_tip(call, "n2") == RESULT_TIP


def test_a_non_leaf_input_gets_its_result_on_the_node_that_made_it():
    # (gm,) = torch.autograd.grad(loss, mid) with mid = w * 2, loss = (mid ** 2).sum()
    nodes = [node("n0", "SumBackward0", [("n1", 0)], tensor_id="t0", label="loss"),
             node("n1", "PowBackward0", [("n2", 0)]),
             node("n2", "MulBackward0", [("n3", 0), None], tensor_id="t1", label="mid"),
             node("n3", "AccumulateGrad", [], label="w", variable="t3")]
    results = [{"tensor": "t1", "values": Values(numel=3, data=[4.0, 8.0, 12.0]).__dict__}]
    call = grad_call(results, [tensor("t1", "mid", shape=(3,), grad_fn="n2")], nodes,
                     extra_tensors=[tensor("t0", "loss", data=[56.0], grad_fn="n0"),
                                    tensor("t3", "w", shape=(3,), leaf=True)])
    assert node_notes(call) == {"n2": ["returns ∂loss/∂mid = [4, 8, 12]"]}


def test_several_outputs_grad_outputs_and_an_unused_input():
    nodes = [node("n0", "MulBackward0", [("n1", 0), ("n1", 0)], tensor_id="t0", label="p"),
             node("n1", "AccumulateGrad", [], label="a", variable="t2"),
             node("n2", "MulBackward0", [("n1", 0), None], tensor_id="t1", label="q")]
    outs = [tensor("t0", "p", data=[4.0], grad_fn="n0"), tensor("t1", "q", data=[6.0], grad_fn="n2")]
    a, u = tensor("t2", "a", data=[2.0], leaf=True), tensor("t3", "u", data=[1.0], leaf=True)
    results = [{"tensor": "t2", "values": Values(numel=1, data=[7.0]).__dict__}, {"tensor": "t3", "values": None}]
    call = grad_call(results, [a, u], nodes, roots=("n0", "n2"), extra_tensors=outs)
    assert node_notes(call) == {"n1": ["returns ∂(p + q)/∂a = 7"]}  # u is in no graph: nowhere to write
    seeded = grad_call(results[:1], [a], nodes, roots=("n0", "n2"), extra_tensors=outs,
                       options={"seed": [{"numel": 1, "data": [2.0]}, {"numel": 1, "data": [1.0]}]})
    assert node_notes(seeded) == {"n1": ["returns grad_outputs·∂(p + q)/∂a = 7"]}


def test_an_input_in_the_graph_that_got_no_gradient_says_none():
    nodes = [node("n0", "MulBackward0", [("n1", 0), ("n2", 0)], tensor_id="t0", label="y"),
             node("n1", "AccumulateGrad", [], label="x", variable="t1"),
             node("n2", "AccumulateGrad", [], label="k", variable="t2")]
    results = [{"tensor": "t2", "values": None}]
    call = grad_call(results, [tensor("t2", "k", data=[1.0], leaf=True)], nodes,
                     extra_tensors=[tensor("t0", "y", data=[1.0], grad_fn="n0")])
    assert node_notes(call) == {"n2": ["returns ∂y/∂k = None (not used by the outputs)"]}


def test_a_batched_result_has_one_dimension_more():
    # torch.autograd.grad(y, x, grad_outputs=eye, is_grads_batched=True): 2 results of x's shape 3
    nodes = [node("n0", "MulBackward0", [("n1", 0), None], tensor_id="t0", label="y"),
             node("n1", "AccumulateGrad", [], label="x", variable="t1")]
    data = [float(i) for i in range(6)]
    results = [{"tensor": "t1", "values": Values(numel=6, data=data).__dict__}]
    call = grad_call(results, [tensor("t1", "x", shape=(3,), leaf=True)], nodes,
                     extra_tensors=[tensor("t0", "y", shape=(3,), grad_fn="n0")])
    assert node_notes(call) == {"n1": ["returns ∂y/∂x = [[0, 1, 2], [3, 4, 5]]"]}
    assert returned(call, "t1") == ([2, 3], Values(numel=6, data=data)) and returned(call, "t0") is None


def test_a_backward_call_has_no_results_and_a_leaf_no_note():
    assert node_notes(retain_call()).keys() == {"n1"}
    call = retain_call()
    call.tensors[2].__dict__["retains_grad"] = False
    assert node_notes(call) == {}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
@pytest.mark.parametrize("example", ["06_retain_grad.py", "03_second_order.py"])
def test_the_examples_notes_through_the_worker_are_torchs_numbers(example):
    import runpy

    import torch

    from core.client.handle import run_capture

    trace = run_capture(str(EXAMPLES / example), timeout=120).trace
    assert trace.error is None, trace.error
    plain = runpy.run_path(str(EXAMPLES / example), run_name="__main__")
    notes = [node_notes(c) for c in trace.calls]
    if example == "06_retain_grad.py":
        assert plain["hidden"].grad.item() == 3.0
        call = trace.calls[0]
        hidden = next(n.id for n in call.nodes if n.label == "hidden")
        assert notes == [{hidden: [f"hidden.grad = {plain['hidden'].grad.item():g}"]}] == [{hidden: ["hidden.grad = 3"]}]
    else:
        x = plain["x"]
        y = x ** 3
        (first,) = torch.autograd.grad(y, x, create_graph=True)
        (second,) = torch.autograd.grad(first, x)
        assert (first.item(), second.item()) == (12.0, 12.0)
        leaf = [next(n.id for n in c.nodes if n.kind == "accumulate_grad" and n.label == "x") for c in trace.calls]
        assert notes == [{leaf[0]: [f"returns ∂y/∂x = {first.item():g}"]},
                         {leaf[1]: [f"returns ∂dy_dx/∂x = {second.item():g}"]}]
