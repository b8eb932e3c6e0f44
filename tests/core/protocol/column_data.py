"""Traces and column lists shared by the columnar encoding tests: a trace with every kind of
record, a call with leaf gradients, and reading, finding and replacing encoded columns."""

import json
import random
from dataclasses import replace

from core.model.trace import ErrorInfo, GradInfo, MemorySample, StorageInfo, Trace, Values
from tests.fixtures_graphs import mlp_call, mul_call, residual_mlp_call


def full_trace() -> Trace:
    """Every kind of record: calls with errors, options, leaf and edge grads, storages, memory,
    complex and non-finite values, grads with samples, a notebook's cells."""
    mul = replace(mul_call(), index=1, id="c1")
    mlp = mlp_call(error=True)
    t0 = replace(mlp.tensors[2], grad=GradInfo(shape=[8, 3], values=Values(numel=24, sample=[0.5, -1.0], min=-1.0,
                                                                             max=2.0, mean=0.1, approx=True)),
                 values=Values(numel=24, data=[float(i) / 7 for i in range(24)]))
    t1 = replace(mlp.tensors[3], values=Values(numel=8, data=[[1.0, -2.0]] * 8), dtype="complex64")
    t2 = replace(mlp.tensors[4], values=Values(numel=4, data=["nan", "inf", 1.5, None], min="nan"))
    mlp = replace(mlp, tensors=[mlp.tensors[0], mlp.tensors[1], t0, t1, t2, *mlp.tensors[5:]],
                  storages=[StorageInfo(id="s_t_w1", nbytes=96, device="cpu", tensors=["t_w1"],
                                        numpy=[{"name": "a", "shape": [2], "strides": [1], "offset": 0}])],
                  leaf_grads={"fc1.weight": Values(numel=2, data=[1.0, 2.0]), "b": Values(numel=1, data=[3])},
                  edge_grads={mlp.nodes[0].id: [GradInfo(shape=[2], values=Values(numel=2, data=[0.25, -0.5])),
                                                None]},
                  options={"retain_graph": False, "inputs": ["t_w1"],
                           "results": [{"tensor": "t_w1", "values": {"numel": 1, "data": [1.0]}}]})
    return Trace(calls=[mlp, mul], error=ErrorInfo("RuntimeError", "boom ✓", 10, "Traceback...", "exception", "s.py"),
                 script="s.py", source="import torch\n" * 12, seeds={"torch": 3},
                 memory=[MemorySample(t=0.1 * i, device="cpu", rss=10 + i, phase="backward") for i in range(12)],
                 tensors=list(mlp.tensors[:3]), call_count=2, cells=[{"cell": 1, "first": 1, "lines": 6}])


def column_items(data: bytes) -> list:
    return [json.loads(line) for line in data.splitlines()]


def joined(items: list) -> bytes:
    return b"".join(json.dumps(i).encode() + b"\n" for i in items)


def replaced_column(data: bytes, path: str, payload) -> bytes:
    items = column_items(data)
    (item,) = [i for i in items if i[0] == path]
    item[1], item[2] = "vals", payload
    return joined(items)


def call_with_leaf_grads(shared: bool):
    """A call whose leaves have grads; its ``leaf_grads`` hold those very previews (as the worker
    builds them) when ``shared``, equal copies otherwise; one leaf gradient is only in the map."""
    call = residual_mlp_call(blocks=40)
    rng = random.Random(7)
    tensors = [replace(t, grad=GradInfo(shape=list(t.shape), values=Values(
        numel=t.values.numel, sample=[rng.uniform(-1, 1) for _ in range(8)], min=-1.0, max=1.0, mean=0.0)))
        if t.name != "x" else t for t in call.tensors]
    leaf = {t.name: (t.grad.values if shared else replace(t.grad.values)) for t in tensors if t.grad is not None}
    leaf["extra"] = Values(numel=1, data=[2.5])
    return replace(call, tensors=tensors, leaf_grads=leaf)


def item_index(items: list, path: str, kind: str, last: bool = False) -> int:
    at = [i for i, item in enumerate(items) if item[:2] == [path, kind]]
    return at[-1] if last else at[0]
