"""The curves of a loop read from a hand-made trace: the loss, one series per element of each small
leaf and of its grad, and norm series for the parameters too big for their elements."""

import math

from core.model.loop_curves import loop_curves, value_text
from core.model.trace import CallInfo, Trace


def _call(index, scalars=None, grad_norms=None, snapshot="full"):
    return CallInfo(id=f"c{index}", index=index, api="Tensor.backward", line=3, roots=[], nodes=[], tensors=[],
                    snapshot=snapshot, scalars=scalars, grad_norms=grad_norms)


def _norms(grad, param):
    return {"params": {"fc.weight": {"module": "fc", "grad": grad, "param": param, "ratio": None},
                       "b": {"module": "b", "grad": 1.0, "param": 1.0, "ratio": 1.0}},
            "modules": {"fc": grad, "b": 1.0}}


TRACE = Trace(calls=[
    _call(2, {"loss": 0.5, "values": {"w": [1.5, -1.0], "b": [0.25]}, "grads": {"w": [0.1, "nan"], "b": [-0.5]}},
          _norms(3.0, 7.0), snapshot="summary"),
    _call(0, {"loss": 2.0, "values": {"w": [0.0, 0.0], "b": [0.0]}, "grads": {"w": [-1.0, 2.0], "b": [-2.0]}},
          _norms(4.0, 5.0)),
    _call(1, {"loss": None, "values": {"w": [1.0, "-inf"], "b": [0.125]}, "grads": {}}, _norms("inf", 6.0)),
    _call(3),  # a call from before the field: no points
])


def test_series_are_listed_loss_values_grads_norms_with_exact_points():
    curves = loop_curves(TRACE)
    assert [s.key for s in curves.series] == [
        "loss", "b", "w[0]", "w[1]", "b.grad", "w.grad[0]", "w.grad[1]", "‖fc.weight‖", "‖fc.weight.grad‖"]
    assert [(s.group, s.leaf, s.shown) for s in curves.series[:2]] == [("loss", None, True), ("value", "b", True)]
    assert curves.get("loss").xs == [0, 2] and curves.get("loss").ys == [2.0, 0.5]
    assert curves.get("b").xs == [0, 1, 2] and curves.get("b").ys == [0.0, 0.125, 0.25]
    assert curves.get("w[0]").ys == [0.0, 1.0, 1.5]
    assert curves.get("w[1]").ys == [0.0, -math.inf, -1.0]
    # call 1 left no grads: the grad series skip it
    assert curves.get("w.grad[0]").xs == [0, 2] and curves.get("w.grad[0]").ys == [-1.0, 0.1]
    assert curves.get("w.grad[1]").ys[0] == 2.0 and math.isnan(curves.get("w.grad[1]").ys[1])
    assert [(s.group, s.shown) for s in curves.in_group("grad")] == [("grad", False)] * 3
    assert curves.calls == [0, 1, 2]


def test_big_parameters_get_their_norm_and_their_grads_norm_from_grad_norms():
    curves = loop_curves(TRACE)
    param, grad = curves.get("‖fc.weight‖"), curves.get("‖fc.weight.grad‖")
    assert (param.xs, param.ys) == ([0, 1, 2], [5.0, 6.0, 7.0])
    assert (grad.xs, grad.ys) == ([0, 1, 2], [4.0, math.inf, 3.0])
    assert (param.group, param.leaf, param.shown) == ("norm", "fc.weight", False)
    assert curves.get("‖b‖") is None  # b has its elements: no norm series


def test_one_element_leaves_are_named_without_an_index_and_the_readout_finds_the_nearest_call():
    trace = Trace(calls=[_call(i, {"loss": 1.0 / (i + 1), "values": {"w": [float(i)]}, "grads": {"w": [0.5]}})
                         for i in range(4)])
    curves = loop_curves(trace)
    assert [s.key for s in curves.series] == ["loss", "w", "w.grad"]
    assert curves.get("w").at(2.4) == (2, 2.0) and curves.get("loss").at(9) == (3, 0.25)
    assert value_text(0.123456) == "0.1235" and value_text(math.inf) == "inf"


def test_a_trace_without_scalars_or_norms_has_no_series():
    assert loop_curves(Trace(calls=[_call(0)])).series == []
