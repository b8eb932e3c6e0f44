"""Calls of odd size and shape, built without torch: a long chain, a wide fan-in, deep module
paths, megabyte names. Shared by the layout and window tests of big traces."""

from __future__ import annotations

from core.model.trace import CallInfo, Edge, NodeInfo, Trace
from tests.fixtures_graphs import tensor

ACC = "torch::autograd::AccumulateGrad"


def _call(nodes: list[NodeInfo], tensors=()) -> CallInfo:
    edges = sum(1 for n in nodes for e in n.next if e is not None)
    return CallInfo(id="c0", index=0, api="backward", line=3, roots=["n0"], nodes=nodes, tensors=list(tensors),
                    node_count=len(nodes), edge_count=edges)


def chain(n: int) -> CallInfo:
    """n0 -> n1 -> ... -> a leaf: ``n`` nodes in one line."""
    nodes = [NodeInfo(id=f"n{i}", name="MulBackward0", kind="backward", next=[Edge(f"n{i + 1}", 0)], line=2)
             for i in range(n - 1)]
    nodes.append(NodeInfo(id=f"n{n - 1}", name=ACC, kind="accumulate_grad", next=[], variable="t0"))
    return _call(nodes, [tensor("t0", "w", [3])])


def fan_in(n: int) -> CallInfo:
    """One node with ``n`` inputs, each a leaf."""
    root = NodeInfo(id="n0", name="StackBackward0", kind="backward",
                    next=[Edge(f"n{i}", 0) for i in range(1, n + 1)], line=2)
    leaves = [NodeInfo(id=f"n{i}", name=ACC, kind="accumulate_grad", next=[], variable=f"t{i}")
              for i in range(1, n + 1)]
    return _call([root] + leaves, [tensor(f"t{i}", f"w{i}", [1]) for i in range(1, n + 1)])


def deep_modules(depth: int, count: int = 60) -> CallInfo:
    """A chain of ``count`` ops whose module paths grow to ``depth`` levels (``m0.m1.…``)."""
    nodes = []
    for i in range(count):
        d = max(1, depth * (i + 1) // count)
        nodes.append(NodeInfo(id=f"n{i}", name="AddBackward0", kind="backward", next=[Edge(f"n{i + 1}", 0)],
                              module=".".join(f"m{k}" for k in range(d)), line=2))
    nodes.append(NodeInfo(id=f"n{count}", name=ACC, kind="accumulate_grad", next=[], variable="t0"))
    return _call(nodes, [tensor("t0", "w", [3])])


def big_names(size: int) -> CallInfo:
    """Two nodes whose label, module and tensor names are ``size`` characters long."""
    big = "x" * size
    nodes = [NodeInfo(id="n0", name="MulBackward0", kind="backward", next=[Edge("n1", 0)], label=big, tensor="t1",
                      module="m" * size, line=2),
             NodeInfo(id="n1", name=ACC, kind="accumulate_grad", next=[], variable="t0")]
    return _call(nodes, [tensor("t0", big, [3]), tensor("t1", big, [3], is_leaf=False, grad_fn="n0")])


def trace_of(call: CallInfo) -> Trace:
    return Trace(calls=[call], script="/x/s.py", source="import torch\nx = 1\nloss.backward()\n", call_count=1)
