"""The norms Colour by Gradient Norm paints: each edge's ‖g‖₂ and each leaf's ‖grad‖₂, exact even
where the edge's values are only a sample, on the Gradients heatmap's log scale."""

from __future__ import annotations

import math
import textwrap

import pytest

from core.model.edge_norms import WHY_NO_EDGES, call_norms, grad_norm, values_norm
from core.model.trace import CallInfo, Edge, GradInfo, NodeInfo, Trace, Values
from core.model.trace_json import load_trace

SCRIPT = textwrap.dedent("""\
    import torch
    torch.manual_seed(0)
    w = torch.randn(5, 7, requires_grad=True)  # 35 elements: the edge keeps a sample of its gradient
    b = torch.randn(5, 1, requires_grad=True)
    x = torch.randn(7, 3)
    z = w @ x
    pre = z + b
    h = torch.tanh(pre)
    sq = h ** 2
    loss = sq.sum()
    loss.backward()
""")


def _small_call(norm=None, data=None) -> CallInfo:
    """MulBackward0 n0 -> AccumulateGrad n1 (leaf ``a``), the gradient given as the worker would."""
    values = Values(numel=40, sample=[1.0] * 8, min=1.0, max=1.0, mean=1.0) if data is None else \
        Values(numel=len(data), data=list(data))
    return CallInfo(id="c0", index=0, api="Tensor.backward", line=3, roots=["n0"],
                    nodes=[NodeInfo(id="n0", name="MulBackward0", kind="backward", next=[Edge("n1", 0), None]),
                           NodeInfo(id="n1", name="AccumulateGrad", kind="accumulate_grad", next=[], label="a")],
                    tensors=[], edge_grads={"n0": [GradInfo(shape=[40], values=values, norm=norm), None]},
                    grad_norms={"params": {"a": {"module": "a", "grad": 6.5, "param": 1.0, "ratio": 6.5}},
                                "modules": {"a": 6.5}})


def test_a_sampled_gradient_has_a_norm_only_where_the_worker_recorded_it():
    assert call_norms(_small_call()).edges == {}
    assert call_norms(_small_call(norm=6.324555320336759)).edges == {("n0", 0): 6.324555320336759}
    assert call_norms(_small_call(data=[3.0, 4.0])).edges == {("n0", 0): 5.0}  # every value: 3-4-5
    assert values_norm(Values(numel=3, sample=[1.0, 2.0])) is None
    assert math.isnan(grad_norm(GradInfo(shape=[2], values=Values(numel=2, sample=[1.0]), norm="nan")))


def test_a_leaf_takes_the_calls_grad_norm_and_a_call_without_edge_gradients_says_so():
    call = _small_call(norm=2.0)
    norms = call_norms(call)
    assert norms.leaves == {"n1": (6.5, "a")}
    assert norms.log_range == (math.log10(2.0), math.log10(6.5))
    assert norms.shade(2.0) == 0.0 and norms.shade(6.5) == 1.0
    bare = CallInfo(id="c1", index=1, api="Tensor.backward", line=3, roots=["n0"], nodes=call.nodes, tensors=[],
                    grad_norms=call.grad_norms)
    assert not call_norms(bare).has_edges and call_norms(bare).leaves == {"n1": (6.5, "a")}
    assert "leaves only" in WHY_NO_EDGES


def test_the_norm_survives_a_saved_trace(tmp_path):
    path = tmp_path / "t.json"
    Trace(calls=[_small_call(norm=6.25)], call_count=1).save(path)
    again = load_trace(path).calls[0]
    assert again.edge_grads["n0"][0].norm == 6.25
    assert call_norms(again).edges == {("n0", 0): 6.25}


@pytest.mark.slow
def test_each_edge_and_leaf_norm_is_torchs_and_colours_follow_the_norms(tmp_path):
    torch = pytest.importorskip("torch")
    from core.client.handle import run_capture

    script = tmp_path / "norms.py"
    script.write_text(SCRIPT)
    trace = run_capture(str(script), timeout=120).trace
    assert trace.error is None, trace.error
    call = trace.calls[0]
    norms = call_norms(call)

    # The same tensors here, and the gradient torch computes for each: an edge into a node whose
    # output is consumed once carries d loss / d that output.
    namespace: dict = {}
    exec(compile(SCRIPT.replace("loss.backward()\n", ""), "norms.py", "exec"), namespace)
    wanted = {"SumBackward0": None, "PowBackward0": "sq", "TanhBackward0": "h", "AddBackward0": "pre",
              "MmBackward0": "z"}
    names = {t.id: t.name for t in call.tensors}
    expected_edges = {}
    for n in call.nodes:
        for slot, e in enumerate(n.next):
            if e is None:
                continue
            dst = call.node(e.node)
            target = names.get(dst.variable) if dst.kind == "accumulate_grad" else wanted[dst.name]
            (g,) = torch.autograd.grad(namespace["loss"], namespace[target], retain_graph=True)
            expected_edges[(n.id, slot)] = float(torch.linalg.vector_norm(g))
    assert norms.edges == expected_edges  # the same float32 gradient, the same norm
    assert len(norms.edges) == 6  # sum→pow, pow→tanh, tanh→add, add→mm, add→b, mm→w (x takes no grad)
    w_edge = next(k for k in norms.edges if call.node(call.node(k[0]).next[k[1]].node).kind == "accumulate_grad"
                  and names[call.node(call.node(k[0]).next[k[1]].node).variable] == "w")
    assert call.edge_grads[w_edge[0]][w_edge[1]].values.data is None  # 35 values: a sample, the norm exact

    expected_leaves = {}
    for n in call.nodes:
        if n.kind == "accumulate_grad":
            name = names[n.variable]
            (g,) = torch.autograd.grad(namespace["loss"], namespace[name], retain_graph=True)
            expected_leaves[n.id] = (float(torch.linalg.vector_norm(g)), name)
    assert norms.leaves == expected_leaves and {name for _, name in norms.leaves.values()} == {"w", "b"}

    ranked = sorted([*norms.edges.values(), *(v for v, _ in norms.leaves.values())])
    shades = [norms.shade(v) for v in ranked]
    assert shades[0] == 0.0 and shades[-1] == 1.0
    for (a, sa), (b, sb) in zip(zip(ranked, shades), zip(ranked[1:], shades[1:])):
        assert sa < sb if a < b else sa == sb
