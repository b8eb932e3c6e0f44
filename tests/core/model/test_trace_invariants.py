"""Trace files that are well typed but inconsistent are refused naming the field; the rest open in every view.

The base trace here holds every field a view reads (cuts, edge marks, edge gradients, hooks,
NumPy arrays on a storage, options such as ``grad_before`` and ``seed``, a repeated call). A
seeded generator breaks it the ways a hand-edited or hostile file does: a cycle in the graph, a
numel that is not the shape's or the data's length, strides of the wrong length, a view past
its storage, ids naming nodes or tensors that do not exist, and the values that crashed views
(a call count of 10**30, huge offsets and strides, ``grad_before: "n0"``, a cut as a list). Each
case is either refused with a TraceFormatError naming the field, or opened by the summary,
the layout, the inspector, the calls, tensors, memory, storage and problems panels and the graph
view without any of them raising.
"""

import json
import random

import pytest

from app.cli.summary import trace_summary
from core.layout.compound import layout_call
from core.model.trace import Trace, TraceFormatError
from core.model.trace_checks import MAX_CALL_NODES, MAX_MEMORY_SAMPLES, kept_samples
from core.model.trace_json import load_notes, trace_from_json
from tests.core.model.test_trace_fuzz import ODD_VALUES, _base

CASES = 400
HUGE = [10 ** 30, 2 ** 63, 2 ** 62, 2 ** 40]


def rich_base() -> dict:
    """The fuzz base with every loosely typed field a view reads, consistent (it opens)."""
    d = _base()
    c0, c1 = d["calls"]
    nodes = {n["id"]: n for n in c0["nodes"]}
    nodes["n0"]["cuts"] = [{"input": 1, "cause": "number", "name": None, "value": "2"}]
    nodes["n7"]["cuts"] = [{"input": 1, "cause": "detach", "name": "d"}]
    nodes["n1"]["edge_marks"] = [{"input": 0, "sum": [[4, 2], [2]], "dtype": ["float32", "float64"]}]
    nodes["n3"]["recomputed"] = True
    nodes["n5"]["saved"] = [{"name": "self", "value": [[1, 2], [3]]}, {"name": "other", "tensor": "t_h"}]
    grad = {"shape": [4, 2], "values": {"numel": 8, "sample": [1.0, 2.0], "min": 0.0, "max": 2.0, "mean": 1.0}}
    c0["edge_grads"] = {"n0": [grad, None], "n1": [None, {"shape": [2], "values": {"numel": 2, "data": [1.0, 2.0]}}]}
    tensors = {t["id"]: t for t in c0["tensors"]}
    tensors["t_w1"]["hooks"] = ["scale (line 3)"]
    tensors["t_x"]["origin"] = "detach"
    tensors["t_h"]["output_nr"] = 1
    c0["storages"][0]["numpy"] = [{"name": "a", "shape": [8, 3], "strides": [3, 1], "offset": 0, "dtype": "float32"}]
    c0["options"].update({"grad_before": {"fc1.weight": "none"}, "module_classes": {"fc1": "Linear"},
                          "seed": [{"numel": 1, "data": [1.0]}], "nested": [1]})
    c1["options"] = {"nested_in": 0, "inside": "backward", "retain_graph": True}
    repeat = {k: v for k, v in c1.items() if k not in ("nodes", "tensors", "edge_grads")}
    repeat.update(id="c2", index=2, nodes=[], tensors=[], roots=[], snapshot="summary", same_as="c0")
    d["calls"].append(repeat)
    d["call_count"] = 3
    d["memory"] = [{"t": 0.1 * i, "device": "cpu", "rss": 10 + i, "allocated": 4 * i, "phase": "forward",
                    "mark": "zero_grad" if i == 2 else "", "where": "n3" if i == 3 else ""} for i in range(6)]
    d["seeds"] = {"torch": 0}
    return d


# -- breaking it --------------------------------------------------------------------------------


def _a_call(d, rng):
    return rng.choice([c for c in d["calls"] if c["nodes"]])


def _a_tensor(d, rng):
    pool = [t for c in d["calls"] for t in c["tensors"]] + d.get("tensors", [])
    return rng.choice(pool)


def _cycle(d, rng):
    """An edge from a node to itself or to one it reaches."""
    c = _a_call(d, rng)
    by_id = {n["id"]: n for n in c["nodes"]}
    start = rng.choice(c["nodes"])
    end = start
    for _ in range(rng.randrange(4)):
        onward = [e["node"] for e in end["next"] if e is not None]
        if not onward:
            break
        end = by_id[rng.choice(onward)]
    end["next"].append({"node": start["id"], "input_nr": 0})


def _numel(d, rng):
    """A count unlike the values listed (one value fewer or more, or far off)."""
    values = rng.choice([t["values"] for t in _pool(d) if t["values"].get("data")]
                        + [g["values"] for g in d["calls"][0]["edge_grads"]["n1"] if g])
    values["numel"] = max(0, values["numel"] + rng.choice([1, -1, 7, 10 ** 6]))


def _data(d, rng):
    t = next((t for t in _pool(d) if t["values"].get("data")), None)
    data = t["values"]["data"]
    if rng.random() < 0.5:
        del data[rng.randrange(len(data)):]
    else:
        data.extend(data[:rng.randrange(1, 4)])


def _pool(d):
    return [t for c in d["calls"] for t in c["tensors"]] + d.get("tensors", [])


def _stride_length(d, rng):
    t = _a_tensor(d, rng)
    if t["stride"] and rng.random() < 0.5:
        t["stride"].pop()
    else:
        t["stride"].append(rng.choice([1, 4]))


def _past_storage(d, rng):
    t = next(t for t in rng.sample(_pool(d), len(_pool(d))) if t["shape"] or rng.random() < 0.2)
    if rng.random() < 0.5 or not t["stride"]:
        t["storage_offset"] = rng.choice(HUGE + [t["nbytes"] // 4, t["nbytes"]])
    else:
        t["stride"][rng.randrange(len(t["stride"]))] = rng.choice(HUGE + [t["nbytes"]])


def _dangling(d, rng):
    c = _a_call(d, rng)
    n = rng.choice(c["nodes"])
    t = rng.choice(c["tensors"]) if c["tensors"] else None
    kind = rng.randrange(9)
    if kind == 0 and any(n["next"]):
        next(e for e in n["next"] if e is not None)["node"] = "n99"
    elif kind == 1 and t is not None:
        t["grad_fn"] = "n99"
    elif kind == 2:
        n["variable"] = "t99"
    elif kind == 3:
        n["saved"] = [{"name": "self", "tensor": "t99"}]
    elif kind == 4 and t is not None:
        t["base"] = "t99"
    elif kind == 5:
        n["tensor"] = "t99"
    elif kind == 6:
        c["roots"].append("n99")
    elif kind == 7:
        c.setdefault("edge_grads", {})["n99"] = [None]
    else:
        d["calls"][-1]["same_as"] = "c99"


def _cut_input(d, rng):
    c = d["calls"][0]
    n = rng.choice([n for n in c["nodes"] if n.get("cuts")] or c["nodes"])
    n["cuts"] = [{"input": rng.choice([0, len(n["next"]), 40])}]


def _crashed_before(d, rng):
    """The values that crashed a view when the loader let them through."""
    c0 = d["calls"][0]
    choice = rng.randrange(6)
    if choice == 0:
        d["call_count"] = 10 ** 30
    elif choice == 1:
        rng.choice(c0["tensors"])["storage_offset"] = rng.choice(HUGE)
    elif choice == 2:
        t = rng.choice([t for t in c0["tensors"] if t["stride"]])
        t["stride"][0] = rng.choice(HUGE)
    elif choice == 3:
        c0["options"]["grad_before"] = rng.choice(["n0", ["n0"], {"x": 1}, 5])
    elif choice == 4:
        n = next(n for n in c0["nodes"] if n.get("cuts"))
        n["cuts"][0] = rng.choice([[1, "number"], "cut", 3, {"input": "one"}, {"input": 1, "cause": 4}])
    else:
        c0["edge_grads"]["n0"] = [rng.choice([{"shape": [3], "values": {"numel": 8}}, 5, "g"]), None, None, None]


LOOSE = [("calls", 0, "nodes", 0, "cuts"), ("calls", 0, "nodes", 1, "edge_marks"), ("calls", 0, "edge_grads"),
         ("calls", 0, "options"), ("calls", 0, "storages", 0, "numpy"), ("calls", 0, "tensors", 2, "hooks"),
         ("calls", 0, "tensors", 0, "origin"), ("calls", 0, "tensors", 6, "output_nr"),
         ("calls", 0, "nodes", 3, "recomputed"), ("calls", 0, "nodes", 5, "saved"), ("calls", 1, "options"),
         ("calls", 2, "same_as"), ("memory", 2), ("seeds",), ("call_count",)]


def _loose(d, rng):
    """An odd value somewhere under one of the loosely typed fields."""
    path = rng.choice(LOOSE)
    target = d
    for k in path[:-1]:
        target = target[k]
    spots, stack = [], [(target, path[-1])]
    while stack:
        parent, k = stack.pop()
        spots.append((parent, k))
        child = parent[k]
        if isinstance(child, dict):
            stack += [(child, c) for c in child]
        elif isinstance(child, list):
            stack += [(child, i) for i in range(len(child))]
    parent, k = rng.choice(spots)
    parent[k] = rng.choice(ODD_VALUES + [[[1, 2]], ["n0"], {"input": -1}, [{"input": 1}]])


def _odd_but_valid(d, rng):
    """Values a file may hold though no capture writes them: views must take them."""
    c0 = d["calls"][0]
    n0, w1 = _n(d, "n0"), _t(d, "t_w1")
    edits = [
        lambda: n0["cuts"][0].update(cause="unknown", name="x" * 300),
        lambda: _n(d, "n1").update(edge_marks=[]),
        lambda: _t(d, "t_h").update(output_nr=10 ** 6),
        lambda: w1.update(hooks=[""]),
        lambda: c0["options"].update(grad_before={"fc1.weight": "zero", "x" * 300: "none"}),
        lambda: w1.update(stride=[0, 0]),
        lambda: c0["storages"][0].update(numpy=[]),
        lambda: c0["storages"][0]["numpy"][0].pop("dtype"),
        lambda: d["memory"][1].update(mark="x" * 200),
        lambda: d.update(call_count=2 ** 31 - 1),
        lambda: d["calls"][2].update(same_as="c1"),
        lambda: c0["options"].update(seed=[None, None]),
        lambda: c0["options"].update(module_classes={}),
        lambda: _n(d, "n5")["saved"][0].update(value=json.loads("[" * 8 + "]" * 8)),
        lambda: w1.update(shape=[0, 3], storage_offset=2 ** 40, values={"numel": 0, "data": []}, grad=None),
        lambda: c0["edge_grads"].update(n0=[]),
        lambda: _t(d, "t_loss").update(storage_offset=0, stride=[], shape=[]),
        # what the capture writes for a jagged nested tensor (padded shape, the ragged stride 0) and
        # for a tensor whose shape raised
        lambda: w1.update(shape=[2, 7, 3], stride=[0, 3, 1], values={"numel": 24, "data": [1.0] * 24}),
        lambda: w1.update(shape=[], stride=[3, 1]),
    ]
    rng.choice(edits)()


BREAKERS = [_odd_but_valid, _cycle, _numel, _data, _stride_length, _past_storage, _dangling, _cut_input,
            _crashed_before, _loose]


# -- showing it ---------------------------------------------------------------------------------


@pytest.fixture
def views(qtbot):
    from widgets.graph.view import GraphView
    from widgets.memory.panel import MemoryPanel
    from widgets.panels.calls import CallsPanel
    from widgets.panels.inspector import InspectorPanel
    from widgets.panels.problems import ProblemsPanel
    from widgets.panels.tensors import TensorsPanel
    from widgets.storage.view import StorageView

    made = dict(calls=CallsPanel(), memory=MemoryPanel(), tensors=TensorsPanel(), storage=StorageView(),
                graph=GraphView(), problems=ProblemsPanel(), inspector=InspectorPanel())
    for w in made.values():
        qtbot.addWidget(w)
    return made


def show_everywhere(trace: Trace, v: dict) -> None:
    trace_summary(trace)
    v["calls"].set_trace(trace)
    v["memory"].set_run(trace.memory, trace.script, trace.call_count)
    v["tensors"].set_tensors(trace.tensors)
    v["problems"].set_trace(trace)
    for t in trace.tensors:
        v["storage"].set_tensor(trace, t.id)
        v["inspector"].show_tensor({x.id: x for x in trace.tensors}, t.id)
    for call in trace.calls:
        layout_call(call)
        layout_call(call, show_saved=True)
        v["memory"].set_call(call)
        v["graph"].set_call(call, sync=True)
        v["graph"].set_show_saved(True, sync=True)
        v["graph"].set_show_saved(False, sync=True)
        for n in call.nodes:
            v["inspector"].show_node(call, n.id)
            v["graph"].show_selection(n.id)
            v["problems"].show_selection(n.id)
        for t in call.tensors:
            v["inspector"].show_tensor(call, t.id)
            v["storage"].set_tensor(call, t.id)


def _open_or_refuse(text: str, qtbot, views, case: str) -> str | None:
    """The refusal's message, or None once every view showed the trace without raising."""
    try:
        trace = trace_from_json(text, "fuzz.json")
    except TraceFormatError as exc:
        assert str(exc).startswith("fuzz.json: field '"), f"{case}: {exc}"
        return str(exc)
    with qtbot.captureExceptions() as raised:
        try:
            show_everywhere(trace, views)
        except Exception as exc:  # pragma: no cover - the message says which case
            pytest.fail(f"{case}: accepted but not showable ({type(exc).__name__}: {exc}):\n{text[:3000]}")
    assert not raised, f"{case}: a view raised {raised[0][1]!r}:\n{text[:3000]}"
    return None


def test_the_rich_base_opens_in_every_view(qtbot, views):
    text = json.dumps(rich_base())
    assert _open_or_refuse(text, qtbot, views, "base") is None


@pytest.mark.slow
def test_broken_traces_are_refused_naming_the_field_or_shown(qtbot, views):
    rng = random.Random(20261202)
    base = json.dumps(rich_base())
    refused: dict[str, int] = {}
    shown = 0
    for case in range(CASES):
        data = json.loads(base)
        breaker = BREAKERS[case % len(BREAKERS)]
        breaker(data, rng)
        if rng.random() < 0.2:  # two breaks at once; two odd values still make a valid file
            (_odd_but_valid if breaker is _odd_but_valid else rng.choice(BREAKERS))(data, rng)
        if _open_or_refuse(json.dumps(data), qtbot, views, f"case {case} ({breaker.__name__})") is None:
            shown += 1
        else:
            refused[breaker.__name__] = refused.get(breaker.__name__, 0) + 1
    assert CASES >= 300
    # Every kind of break is caught: a cycle, a dangling id, a view past its storage is never shown.
    for name in ("_cycle", "_dangling", "_past_storage", "_stride_length", "_crashed_before", "_numel", "_data"):
        assert refused.get(name, 0) == CASES // len(BREAKERS), (name, refused)
    assert "_odd_but_valid" not in refused and shown >= CASES // len(BREAKERS), (shown, refused)


# -- the exact files that crashed views ---------------------------------------------------------


def _edit(edit) -> str:
    d = rich_base()
    edit(d)
    return json.dumps(d)


def _t(d, tid):
    return next(t for t in d["calls"][0]["tensors"] if t["id"] == tid)


def _n(d, nid):
    return next(n for n in d["calls"][0]["nodes"] if n["id"] == nid)


EXACT = {
    "call_count 10**30": (lambda d: d.update(call_count=10 ** 30),
                          "field 'call_count': expected a count of calls from 0 to 2,147,483,647, got "
                          "1000000000000000000000000000000"),
    "storage_offset 10**30": (lambda d: _t(d, "t_w1").update(storage_offset=10 ** 30),
                              "field 'calls[0].tensors[2].storage_offset': puts the last element at byte "),
    "stride 10**30": (lambda d: _t(d, "t_w1").update(stride=[10 ** 30, 1]),
                      "field 'calls[0].tensors[2].stride': puts the last element at byte "),
    "storage_offset past the storage": (lambda d: _t(d, "t_w1").update(storage_offset=2 ** 40),
                                        "field 'calls[0].tensors[2].storage_offset': the view reaches byte "
                                        "4,398,046,511,200 of storage 's_t_w1', which holds 96 bytes"),
    "stride past the storage": (lambda d: _t(d, "t_w1").update(stride=[4, 1]),
                                "field 'calls[0].tensors[2].stride': the view reaches byte 124 of storage "
                                "'s_t_w1', which holds 96 bytes"),
    "grad_before as a string": (lambda d: d["calls"][0]["options"].update(grad_before="n0"),
                                "field 'calls[0].options': 'grad_before': expected an object of strings, got 'n0'"),
    "a cut as a list": (lambda d: _n(d, "n0").update(cuts=[[1, "number"]]),
                        "field 'calls[0].nodes[0].cuts': expected null or a list of {input, cause, name, value} "
                        "objects, got list"),
    "a cycle": (lambda d: _n(d, "n10")["next"].append({"node": "n0", "input_nr": 0}),
                "field 'calls[0].nodes[10].next[0]': names node 'n0', which leads back to 'n10' "
                "(n10 → n0 → n1 → n5 → n6 → n7 → …): a backward graph has no cycles"),
    "a self loop": (lambda d: _n(d, "n3")["next"].append({"node": "n3", "input_nr": 0}),
                    "field 'calls[0].nodes[3].next[1]': names node 'n3', which leads back to 'n3' (n3 → n3)"),
    "numel is not the data's length": (lambda d: _t(d, "t_w1")["values"]["data"].pop(),
                                       "field 'calls[0].tensors[2].values.data': holds 23 values, but numel is 24"),
    "numel is not the edge gradient's data": (lambda d: d["calls"][0]["edge_grads"]["n1"][1]["values"].update(numel=3),
                                              "field 'calls[0].edge_grads.n1[1].values.data': holds 2 values, but "
                                              "numel is 3"),
    "a stride short": (lambda d: _t(d, "t_w1").update(stride=[1]),
                       "field 'calls[0].tensors[2].stride': has 1 entries for the 2 dimensions of shape [8, 3]"),
    "an edge to a missing node": (lambda d: _n(d, "n3")["next"][0].update(node="n9x"),
                                  "field 'calls[0].nodes[3].next[0]': node 'n9x' is not in the call's nodes"),
    "a grad_fn that is not there": (lambda d: _t(d, "t_h").update(grad_fn="n99"),
                                    "field 'calls[0].tensors[6].grad_fn': names node 'n99', which this call does "
                                    "not have"),
    "a variable that is not there": (lambda d: _n(d, "n2").update(variable="t99"),
                                     "field 'calls[0].nodes[2].variable': names tensor 't99', which this call does "
                                     "not have"),
    "a saved tensor that is not there": (lambda d: _n(d, "n5")["saved"][1].update(tensor="t99"),
                                         "field 'calls[0].nodes[5].saved[1].tensor': names tensor 't99', which this "
                                         "call does not have"),
    "edge gradients of a missing node": (lambda d: d["calls"][0]["edge_grads"].update(n99=[None]),
                                         "field 'calls[0].edge_grads.n99': names node 'n99', which this call does "
                                         "not have"),
    "more edge gradients than inputs": (lambda d: d["calls"][0]["edge_grads"]["n0"].extend([None, None]),
                                        "field 'calls[0].edge_grads.n0': holds 4 gradients for the 2 inputs of node "
                                        "'n0'"),
    "a cut on an input with a gradient": (lambda d: _n(d, "n0")["cuts"][0].update(input=0),
                                          "field 'calls[0].nodes[0].cuts[0].input': input 0 leads to node 'n1': a cut "
                                          "marks an input that gets no gradient"),
    "a repeat of a missing call": (lambda d: d["calls"][2].update(same_as="c9"),
                                   "field 'calls[2].same_as': names call 'c9', which this trace does not have"),
    "a negative stride": (lambda d: _t(d, "t_w1").update(stride=[3, -1]),
                          "field 'calls[0].tensors[2].stride': expected a list of non-negative integers"),
    "a saved value nested deep": (lambda d: _n(d, "n5")["saved"][0].update(value=json.loads("[" * 50 + "]" * 50)),
                                  "field 'calls[0].nodes[5].saved[0].value': expected a number, a string or a list "
                                  "of them, nested at most 8 deep"),
    "options nested deep": (lambda d: d["calls"][0]["options"].update(x=json.loads("[" * 900 + "]" * 900)),
                            "field 'calls[0].options': expected objects and lists nested at most 16 deep"),
    "seeds nested deep": (lambda d: d.update(seeds={"torch": json.loads('{"a":' * 900 + "1" + "}" * 900)}),
                          "field 'seeds': expected objects and lists nested at most 16 deep"),
}


@pytest.mark.parametrize("where", ["options", "saved value", "memory"])
def test_json_nested_too_deeply_anywhere_is_refused(where):
    deep = "[" * 100_000 + "]" * 100_000
    text = json.dumps(rich_base())
    marker = {"options": '"retain_graph": false', "saved value": '"value": [[1, 2], [3]]',
              "memory": '"where": "n3"'}[where]
    assert marker in text
    key = marker.split(":")[0]
    with pytest.raises(TraceFormatError) as info:
        trace_from_json(text.replace(marker, f"{key}: {deep}", 1), "deep.json")
    assert str(info.value) == "deep.json: JSON nested too deeply to be a trace"


@pytest.mark.parametrize("case", list(EXACT))
def test_each_inconsistency_is_refused_naming_its_field(case):
    edit, words = EXACT[case]
    with pytest.raises(TraceFormatError) as info:
        trace_from_json(_edit(edit), "bad.json")
    assert str(info.value).startswith("bad.json: " + words), str(info.value)


def test_an_empty_trace_file_says_it_is_empty(tmp_path):
    from core.model.trace_json import load_trace

    (tmp_path / "empty.json").write_text("\n")
    with pytest.raises(TraceFormatError) as info:
        load_trace(tmp_path / "empty.json")
    assert str(info.value) == f"{tmp_path / 'empty.json'}: the file is empty"


# -- sizes ----------------------------------------------------------------------------------------


def test_a_call_past_the_node_limit_is_refused_before_it_is_built():
    from bench.big_traces import chain_trace

    text = json.dumps(chain_trace(MAX_CALL_NODES + 1))
    with pytest.raises(TraceFormatError) as info:
        trace_from_json(text, "big.json")
    assert str(info.value) == ("big.json: field 'calls[0].nodes': 200,001 nodes in call 0; Backprop Studio opens "
                               "calls of up to 200,000 nodes")


def test_a_file_past_the_size_limit_is_refused_unread(tmp_path):
    from core.model.trace_json import load_trace

    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate(600 * 2 ** 20)  # sparse: nothing is written, nothing need be read
    with pytest.raises(TraceFormatError) as info:
        load_trace(path)
    assert str(info.value) == f"{path}: 600 MiB; Backprop Studio opens trace files of up to 512 MiB"


def test_long_memory_records_are_thinned_keeping_every_peak():
    from bench.big_traces import memory_trace

    data = memory_trace(MAX_MEMORY_SAMPLES * 3, peak_at=123_457)
    data["memory"][200_001]["mark"] = "optimizer.step"
    trace = trace_from_json(json.dumps(data), "long.json")
    assert MAX_MEMORY_SAMPLES * 0.7 < len(trace.memory) <= MAX_MEMORY_SAMPLES
    assert max(s.rss for s in trace.memory) == 9_000_000_000
    assert [s.t for s in trace.memory] == sorted(s.t for s in trace.memory)
    assert trace.memory[0].t == 0 and trace.memory[-1].rss == max(s.rss for s in trace.memory[-50:])
    assert any(s.mark == "optimizer.step" for s in trace.memory)
    kept = len(trace.memory)
    assert load_notes(trace) == [f"memory: 300,000 samples, {kept:,} kept (evenly spread, with every peak)"]
    short = memory_trace(1000)
    assert load_notes(trace_from_json(json.dumps(short))) == []


def test_kept_samples_hold_each_stretchs_peaks():
    samples = [{"rss": i % 7, "allocated": (i * 13) % 11, "reserved": 0, "saved_bytes": 0} for i in range(1000)]
    keep = kept_samples(samples, cap=100)
    assert len(keep) <= 100 and keep == sorted(keep)
    stretch = -(-1000 * 5 // 100)
    for start in range(0, 1000, stretch):
        part = range(start, min(start + stretch, 1000))
        assert max(samples[i]["rss"] for i in part) == max(samples[i]["rss"] for i in keep if i in part)


@pytest.mark.slow
def test_a_million_node_chain_is_refused_in_bounded_time(tmp_path):
    import time

    from bench.big_traces import chain_trace
    from core.model.trace_json import load_trace

    path = tmp_path / "chain.json"
    path.write_text(json.dumps(chain_trace(1_000_000), separators=(",", ":")))
    start = time.perf_counter()
    with pytest.raises(TraceFormatError) as info:
        load_trace(path)
    took = time.perf_counter() - start
    assert str(info.value) == (f"{path}: field 'calls[0].nodes': 1,000,000 nodes in call 0; Backprop Studio opens "
                               "calls of up to 200,000 nodes")
    assert took < 60, took  # reading the JSON alone: 2-8 s; building the records took over 180 s
