"""The trace loader under fuzzing: what it accepts can be shown, the rest is a TraceFormatError naming the field.

A seeded generator mutates a complete trace (every kind of record, an error, memory
samples, storages, a stale saved tensor, grads with values): one value replaced by a value
of another type or range, a key removed, a list item duplicated or wrapped. Every accepted
trace goes through the summary, the layout of every call and the inspector on every node
and tensor.
"""

import json
import random
from dataclasses import replace

import pytest

from core.layout.compound import layout_call
from app.cli.summary import trace_summary
from core.model.trace import ErrorInfo, GradInfo, MemorySample, StorageInfo, Trace, TraceFormatError, Values
from core.model.trace_json import call_from_dict, trace_from_dict, trace_from_json
from tests.fixtures_graphs import mlp_call, mul_call
from widgets.panels.inspector import InspectorPanel

CASES = 700
ODD_VALUES = [None, True, False, 0, -1, 1, 3, 2 ** 70, -(10 ** 30), 1.5, -2.5, float("nan"), float("inf"), "",
              "n0", "t_x", "x" * 300, [], [1], [-1], ["n0"], [None], [[1, 2]], [[1, 2, 3]], ["a", 1], {},
              {"node": "n0", "input_nr": 0}, {"numel": 1}, {"a": 1}, [{}], [[[]]]]


def _base() -> dict:
    mul = mul_call()
    mlp = mlp_call(error=True)
    t0 = replace(mlp.tensors[2], grad=GradInfo(shape=[8, 3], values=Values(numel=24, sample=[0.5, -1.0],
                                                                             min=-1.0, max=2.0, mean=0.1)),
                 values=Values(numel=24, data=[float(i) for i in range(24)]))
    t1 = replace(mlp.tensors[3], values=Values(numel=8, data=[[1.0, -2.0]] * 8), dtype="complex64")
    mlp = replace(mlp, tensors=[mlp.tensors[0], mlp.tensors[1], t0, t1, *mlp.tensors[4:]],
                  storages=[StorageInfo(id="s_t_w1", nbytes=96, device="cpu", tensors=["t_w1"])],
                  leaf_grads={"fc1.weight": Values(numel=2, data=[1.0, 2.0])},
                  options={"retain_graph": False, "inputs": ["t_w1"],
                           "results": [{"tensor": "t_w1", "values": {"numel": 1, "data": [1.0]}}]})
    mul = replace(mul, index=1, id="c1")
    trace = Trace(calls=[mlp, mul], error=ErrorInfo("RuntimeError", "boom", 10, "Traceback...", "exception",
                                                   "s.py", "Fatal"),
                  script="s.py", source="import torch\n" * 12, memory=[MemorySample(t=0.1, device="cpu", rss=10)],
                  tensors=list(mlp.tensors[:3]), call_count=2)
    if "cells" in Trace.__dataclass_fields__:  # a notebook's cells map script lines to "cell N, line M"
        trace = replace(trace, cells=[{"cell": 1, "first": 1, "lines": 6}, {"cell": 2, "first": 8, "lines": 5}])
    return json.loads(trace.to_json())


def _paths(data, path=()):
    yield path
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _paths(v, path + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _paths(v, path + (i,))


def _mutate(data, rng: random.Random):
    paths = [p for p in _paths(data) if p]
    path = rng.choice(paths)
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    action = rng.random()
    if action < 0.7:
        parent[key] = rng.choice(ODD_VALUES)
    elif action < 0.8 and isinstance(parent, dict):
        del parent[key]
    elif action < 0.9 and isinstance(parent, list):
        parent.append(parent[key])
    else:
        parent[key] = [parent[key]]
    return data


def _show_everything(trace: Trace, inspector: InspectorPanel) -> None:
    trace_summary(trace)
    inspector.show_tensor({t.id: t for t in trace.tensors}, trace.tensors[0].id) if trace.tensors else None
    for call in trace.calls:
        layout_call(call)
        layout_call(call, show_saved=True)
        for n in call.nodes:
            inspector.show_node(call, n.id)
        for t in call.tensors:
            inspector.show_tensor(call, t.id)


def test_the_base_trace_is_accepted_and_shown(qtbot):
    inspector = InspectorPanel()
    qtbot.addWidget(inspector)
    trace = trace_from_json(json.dumps(_base()))
    assert [c.id for c in trace.calls] == ["c0", "c1"]
    _show_everything(trace, inspector)


@pytest.mark.slow
def test_mutated_traces_are_shown_or_refused_naming_the_field(qtbot):
    inspector = InspectorPanel()
    qtbot.addWidget(inspector)
    rng = random.Random(20261130)
    base = json.dumps(_base())
    accepted = refused = 0
    for case in range(CASES):
        data = json.loads(base)
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            data = _mutate(data, rng)
        text = json.dumps(data)
        try:
            trace = trace_from_json(text, "fuzz.json")
        except TraceFormatError as exc:
            refused += 1
            assert str(exc).startswith("fuzz.json: "), exc
            assert "field '" in str(exc), exc
            continue
        accepted += 1
        try:
            _show_everything(trace, inspector)
        except Exception as exc:  # pragma: no cover - the message says which case
            pytest.fail(f"case {case}: accepted but not showable ({type(exc).__name__}: {exc}):\n{text[:3000]}")
    assert accepted > 50 and refused > 200


@pytest.mark.parametrize("text, words", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"format": "backprop-studio-trace", "version": ' + "9" * 5001 + "}", "not readable JSON"),
    ('{"format": "backprop-studio-trace", "version": 0, "calls": []}', "field 'version'"),
    ('{"format": "backprop-studio-trace", "version": -3, "calls": []}', "field 'version'"),
    ('{"format": "backprop-studio-trace", "version": true, "calls": []}', "field 'version'"),
    ('{"format": "backprop-studio-trace", "version": 1, "calls": [{"id": "c0", "index": 0, "api": "x", '
     '"line": 1, "roots": 5, "nodes": [], "tensors": []}]}', "field 'calls[0].roots'"),
    ('{"format": "backprop-studio-trace", "version": 1, "calls": [{"id": "c0", "index": 0, "api": "x", '
     '"line": 1, "roots": [[1]], "nodes": [], "tensors": []}]}', "field 'calls[0].roots'"),
    ('{"format": "backprop-studio-trace", "version": 1, "calls": "none"}', "field 'calls'"),
    ('{"format": "backprop-studio-trace", "version": 1, "calls": [], "memory": [{"t": "soon", "device": "cpu"}]}',
     "field 'memory[0].t'"),
    ('{"format": "backprop-studio-trace", "vers', "not valid JSON"),
])
def test_hostile_documents_are_refused_with_a_reason(text, words):
    with pytest.raises(TraceFormatError) as info:
        trace_from_json(text, "bad.json")
    assert words in str(info.value)


def test_a_streamed_call_is_checked_the_same_way():
    data = json.loads(json.dumps(_base()))["calls"][0]
    assert call_from_dict(data).id == "c0"
    data["nodes"][0]["next"] = [{"node": "n1", "input_nr": "zero"}]
    with pytest.raises(TraceFormatError, match=r"call 0: field 'calls\[0\]\.nodes\[0\]\.next\[0\]\.input_nr'"):
        call_from_dict(data, "call 0")


def test_non_finite_values_as_the_capture_writes_them_are_accepted(qtbot):
    data = json.loads(json.dumps(_base()))
    values = data["calls"][0]["tensors"][2]["values"]
    values["data"][:3] = ["nan", "inf", "-inf"]
    grad = data["calls"][0]["tensors"][2]["grad"]["values"]
    grad["sample"], grad["min"], grad["max"] = ["nan", 1.0], "nan", "inf"
    trace = trace_from_dict(data)
    inspector = InspectorPanel()
    qtbot.addWidget(inspector)
    _show_everything(trace, inspector)
    inspector.show_tensor(trace.calls[0], "t_w1")
    assert "nan" in inspector.text() and "inf" in inspector.text()
