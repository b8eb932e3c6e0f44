"""The columnar wire encoding of traces: exact round trips, the field named for anything wrong,
frames decoded as they stream in, and the codec both ends agree on (zstd where both have it)."""

import gc
import json
import math
import os
import random
import re
import shlex
import struct
import sys
import threading
import time
import zlib
from dataclasses import FrozenInstanceError, fields, replace

import pytest

from core.protocol import column_pack
from core.protocol import column_reader as tr
from core.protocol import columns as tc
from core.protocol.column_pack import pack_floats
from core.protocol import wire
from core.client.handle import run_capture
from core.client.process import ROOT
from core.client.launchers import from_command
from core.worker.channel import Channel
from core.model.trace import ErrorInfo, GradInfo, MemorySample, Saved, StorageInfo, Trace, TraceFormatError, Values
from core.model.trace_json import call_from_dict, call_to_dict, trace_from_dict
from tests.fixtures_graphs import mlp_call, mul_call, residual_mlp_call

try:
    import zstandard
except ImportError:  # the zstd cases skip; zlib is always there
    zstandard = None


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


def same_json(a, b) -> bool:
    """Equal as the trace format writes them (NaN compared as text)."""
    return json.dumps(a.to_dict() if isinstance(a, Trace) else a.__dict__, sort_keys=True, default=str) == \
        json.dumps(b.to_dict() if isinstance(b, Trace) else b.__dict__, sort_keys=True, default=str)


def test_every_record_comes_back_equal_and_typed():
    trace = full_trace()
    back = tr.decode(tc.encode(trace))
    assert back == trace
    assert back.to_json() == trace.to_json()
    # Types survive: an int stays an int, a float a float, a complex pair a list, text values text.
    grads = back.calls[0].leaf_grads
    assert grads["b"].data == [3] and type(grads["b"].data[0]) is int
    assert back.calls[0].tensors[3].values.data == [[1.0, -2.0]] * 8
    assert back.calls[0].tensors[4].values.data == ["nan", "inf", 1.5, None]
    assert back.calls[0].edge_grads[back.calls[0].nodes[0].id][1] is None
    assert back.calls[0].edge_grads[back.calls[0].nodes[0].id][0].values.data == [0.25, -0.5]
    assert back.calls[0].tensors[2].grad.values.approx is True
    # The objects are complete dataclasses: every field set, the derived maps work.
    node = back.calls[0].nodes[0]
    assert back.calls[0].node(node.id) is node and node.__dict__.keys() == trace.calls[0].nodes[0].__dict__.keys()


def test_rows_are_built_as_the_frozen_dataclasses_themselves():
    trace = full_trace()
    back = tr.decode(tc.encode(trace))
    node, tensor = back.calls[0].nodes[0], back.calls[0].tensors[2]
    assert type(node) is type(trace.calls[0].nodes[0]) and type(tensor.grad) is GradInfo
    assert type(tensor.values) is Values and type(back.calls[0].storages[0]) is StorageInfo
    # Still frozen, hashable and equal field by field; replace and vars see every field in order.
    with pytest.raises(FrozenInstanceError):
        node.label = "changed"
    assert list(vars(node)) == [f.name for f in fields(node)] and vars(node) == vars(trace.calls[0].nodes[0])
    assert replace(node, label="x") == replace(trace.calls[0].nodes[0], label="x")
    # Fields every row shares (a constant column) are set on each row, from one value.
    assert [n.kind for n in back.calls[0].nodes] == [n.kind for n in trace.calls[0].nodes]
    made = column_pack.row_maker(Saved, ("name", "tensor", "value", "freed"))(
        [["a", "b"], iter([None]), [1, [2, 3]], iter([False])], 2)
    assert made == [Saved(name="a", tensor=None, value=1, freed=False),
                    Saved(name="b", tensor=None, value=[2, 3], freed=False)]
    assert hash(made[0]) == hash(Saved(name="a", value=1)) and {made[0]} == {Saved(name="a", value=1)}
    empty = [[], iter([None]), [], iter([False])]
    assert column_pack.row_maker(Saved, ("name", "tensor", "value", "freed"))(empty, 0) == []


def test_a_big_call_round_trips_bit_for_bit_and_is_smaller_than_json():
    call = residual_mlp_call(blocks=300)
    rng = random.Random(3)
    values = [Values(numel=64, sample=[rng.uniform(-1, 1) for _ in range(8)], min=-rng.random(),
                     max=rng.random(), mean=rng.gauss(0, 1e-7)) for _ in call.tensors]
    values[0] = replace(values[0], min=float("nan"), max=float("-inf"), mean=5e-324)  # doubles, bit for bit
    call = replace(call, tensors=[replace(t, values=v) for t, v in zip(call.tensors, values)])
    data = tc.encode(call)
    back = tr.decode(data, "call")
    assert back.nodes == call.nodes and back.roots == call.roots
    for a, b in zip(back.tensors, call.tensors):
        assert struct.pack("<3d", a.values.min, a.values.max, a.values.mean) == \
            struct.pack("<3d", b.values.min, b.values.max, b.values.mean)
        assert a.values.sample == b.values.sample and a.shape == b.shape and a.stride == b.stride
    assert math.isnan(back.tensors[0].values.min)
    as_json = json.dumps(call_to_dict(call)).encode()
    assert len(zlib.compress(data, 1)) < 0.9 * len(zlib.compress(as_json, 1))  # random doubles dominate
    # Repeated strings are one object each, not one per node.
    assert len({id(n.kind) for n in back.nodes}) == len({n.kind for n in back.nodes})


def _columns(data: bytes) -> list:
    return [json.loads(line) for line in data.splitlines()]


def _join(items: list) -> bytes:
    return b"".join(json.dumps(i).encode() + b"\n" for i in items)


def _replace_column(data: bytes, path: str, payload) -> bytes:
    items = _columns(data)
    (item,) = [i for i in items if i[0] == path]
    item[1], item[2] = "vals", payload
    return _join(items)


def test_a_wrong_value_is_named_by_its_field_path():
    trace = full_trace()
    data = tc.encode(trace)
    shapes = [t.shape for c in trace.calls for t in c.tensors]
    bad = list(shapes)
    bad[len(trace.calls[0].tensors) + 1] = [2, -3]  # the second tensor of the second call
    with pytest.raises(TraceFormatError, match=r"field 'calls\[1\]\.tensors\[1\]\.shape': expected a list of "
                                               r"non-negative integers, got list"):
        tr.decode(_replace_column(data, "calls.tensors.shape", bad))
    names = [n.name for c in trace.calls for n in c.nodes]
    names[2] = 7
    with pytest.raises(TraceFormatError, match=r"field 'calls\[0\]\.nodes\[2\]\.name': expected a string, got 7"):
        tr.decode(_replace_column(data, "calls.nodes.name", names))
    # An edge to a node that is not in the call, as the JSON reader says it.
    targets = [e.node for c in trace.calls for n in c.nodes for e in n.next if e is not None]
    targets[0] = "n_nowhere"
    first = next(n for n in trace.calls[0].nodes if any(n.next))
    where = f"calls[0].nodes[{trace.calls[0].nodes.index(first)}].next[0]"
    with pytest.raises(TraceFormatError, match=re.escape(f"field '{where}': node 'n_nowhere' is not in")):
        tr.decode(_replace_column(data, "calls.nodes.next.node", targets))


def test_missing_cut_short_and_foreign_columns_are_refused():
    data = tc.encode(full_trace())
    items = _columns(data)
    with pytest.raises(TraceFormatError, match="end early"):
        tr.decode(_join(items[:-1]))
    with pytest.raises(TraceFormatError, match=r"field 'calls\[0\]\.nodes\[0\]\.name': missing"):
        tr.decode(_join([i for i in items if i[0] != "calls.nodes.name"]))
    with pytest.raises(TraceFormatError, match="not a columnar Backprop Studio trace"):
        tr.decode(_join([["", "head", {"format": "other"}]] + items[1:]))
    (times,) = [i for i in items if i[0] == "memory.t"]
    assert times[1] == "f64" and times[2][0] is None  # twelve doubles, packed
    times[2][1] = times[2][1][:-12] + "="  # eleven and a half
    with pytest.raises(TraceFormatError, match="field 'memory.t': the packed numbers do not match their count"):
        tr.decode(_join(items))
    times[2][1] = pack_floats([0.5] * 11)
    with pytest.raises(TraceFormatError, match=r"field 'memory\[0\].t': expected 12 rows, got 11"):
        tr.decode(_join(items))
    with pytest.raises(TraceFormatError, match="not readable JSON"):
        tr.decode(data[:200] + b"{oops\n" + data[200:])


@pytest.mark.parametrize("block_rows", [tc.BLOCK_ROWS, 3])
def test_whatever_the_columns_accept_the_json_reader_accepts_too(block_rows, monkeypatch):
    """Seeded mutations of single column values: each is refused with a TraceFormatError, or read
    into a trace that the trace file's own reader also accepts, field for field; also where the
    tables come in blocks of three rows, each read (and checked) as it arrives."""
    monkeypatch.setattr(tc, "BLOCK_ROWS", block_rows)
    base = _columns(tc.encode(full_trace()))
    rng = random.Random(16)
    odd = [None, True, 0, -1, 2 ** 70, 1.5, float("inf"), "", "x", [], [1], [-1], ["a"], [None], {}, {"a": 1}]
    refused = accepted = 0
    for _ in range(300):
        items = json.loads(json.dumps(base))
        item = rng.choice([i for i in items if i[1] == "vals" and i[2]])
        item[2][rng.randrange(len(item[2]))] = rng.choice(odd)
        try:
            trace = tr.decode(_join(items))
        except TraceFormatError as exc:
            assert "field '" in str(exc) or "column" in str(exc), exc
            refused += 1
            continue
        accepted += 1
        assert trace_from_dict(json.loads(trace.to_json())) == trace
    assert refused > 100 and accepted > 20


def _stream(obj, codec: str, piece: int = 997) -> tuple[list, list]:
    """A message holding ``obj`` sent as a columnar frame and fed to a StreamDecoder in small pieces."""
    key = "trace" if isinstance(obj, Trace) else "call"
    msg = {"type": "trace" if key == "trace" else "call_trace", key: obj, "run": 7, "position": 2}
    data = b'{"type": "hello"}\n' + b"".join(wire.columns_frame(msg, key, codec)) + b'{"type": "after"}\n'
    got, progress = [], []
    decoder = wire.StreamDecoder(got.append, lambda h, r, d: progress.append((h, r, d)))
    for at in range(0, len(data), piece):
        decoder.feed(data[at:at + piece])
    assert not decoder.partial
    return got, progress


@pytest.mark.parametrize("codec", ["zlib", "zstd", "raw"])
def test_a_columnar_frame_is_decoded_as_it_streams_in(codec, monkeypatch):
    if codec == "zstd" and wire._zstd() is None:
        pytest.skip("zstandard is not installed")
    monkeypatch.setattr(wire, "COLUMNS_FIRST", 4 * 1024)  # a chunk per few KiB of columns: several here
    monkeypatch.setattr(wire, "COLUMNS_BATCH", 8 * 1024)
    call = residual_mlp_call(blocks=200)
    got, progress = _stream(call, codec)
    assert got[0] == b'{"type": "hello"}' and got[2] == b'{"type": "after"}'
    msg = got[1]
    assert msg["type"] == "call_trace" and msg["run"] == 7 and msg["position"] == 2
    assert msg["call"] == call and call_from_dict(msg["call"]) is msg["call"]
    header, received, decoded = progress[-1]
    assert header["codec"] == codec and header["enc"] == "columns" and decoded == header["raw"]
    if codec == "raw":  # as they are: each chunk's bytes and its 4-byte length
        assert decoded < received < decoded + 4 * (len(progress) + 1)
    else:
        assert received * 3 < decoded  # compressed on the way
    assert len(got) == 3 and len(progress) > 5  # reported chunk by chunk, not only at the end
    assert [d for _, _, d in progress] == sorted(d for _, _, d in progress)
    with pytest.raises(TraceFormatError, match="the call_trace from the worker: a column is not readable JSON"):
        call_from_dict(_stream_broken(call, codec))


def _stream_broken(call, codec):
    """The same frame with one column's JSON corrupted: the error arrives in place of the call."""
    header = next(wire.columns_frame({"type": "call_trace", "call": call}, "call", codec))
    lines = tc.encode(call).splitlines(keepends=True)
    lines[3] = lines[3][:-5] + b"\n"  # a column cut off
    comp = wire.Packer(codec)
    out = comp.cut(b"".join(lines)) + comp.end()
    data = header + len(out).to_bytes(4, "big") + out + (0).to_bytes(4, "big")
    got = []
    wire.StreamDecoder(got.append).feed(data)
    return got[0]["call"]


def test_a_trace_frame_carries_the_whole_trace():
    trace = full_trace()
    got, _ = _stream(trace, "zlib", piece=64)
    assert got[1]["trace"] == trace and trace_from_dict(got[1]["trace"]) is got[1]["trace"]
    # Objects with nothing to encode (no worker asked for columns) still go as the trace format's JSON.
    plain = wire.plain_message({"type": "trace", "trace": trace, "run": 1})
    assert plain["trace"] == json.loads(trace.to_json()) and plain["run"] == 1


def test_zstd_falls_back_to_zlib_where_it_is_not_installed(monkeypatch):
    monkeypatch.setattr(wire, "_zstd", lambda: None)
    assert wire.available_codecs() == ["zlib"]
    assert wire.pick_codec("zstd") == "zlib" and wire.pick_codec("none") is None
    with pytest.raises(wire.ProtocolMismatch, match="pip install zstandard"):
        wire.decompressor("zstd")


BLOCK_ZSTD = """\
import runpy, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("zstandard", "compression"):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
sys.meta_path.insert(0, Block())
runpy.run_module("core.worker.main", run_name="__main__", alter_sys=True)
"""

SCRIPT = """\
import torch
x = torch.ones(3, requires_grad=True)
y = x
for _ in range(700):
    y = y * 1.0
y.sum().backward()
"""


@pytest.mark.skipif(zstandard is None, reason="zstandard is not installed")
@pytest.mark.parametrize("worker_has_zstd", [True, False])
def test_the_trace_travels_in_zstd_where_both_ends_have_it_else_zlib(tmp_path, worker_has_zstd):
    """A worker behind a launcher, asked for zstd: the call comes back in zstd when the worker has
    it, in zlib when it has not (its hello says so), in columns either way, with the same grads."""
    script = tmp_path / "chain.py"
    script.write_text(SCRIPT)
    if worker_has_zstd:
        start = f"{shlex.quote(sys.executable)} -m core.worker"
    else:
        (tmp_path / "start_worker.py").write_text(BLOCK_ZSTD)
        start = f"{shlex.quote(sys.executable)} {shlex.quote(str(tmp_path / 'start_worker.py'))}"
    launcher = from_command(f"sh -c 'cd {shlex.quote(str(ROOT))} && PYTHONPATH=. exec {start}'", name="box",
                            compress="zstd")
    events = []
    result = run_capture(str(script), launcher=launcher, timeout=120, on_event=events.append)
    assert result.trace.error is None, (result.trace.error, result.output)
    (hello,) = [e for e in events if e.get("type") == "hello"]
    assert hello["codecs"] == (["zstd", "zlib"] if worker_has_zstd else ["zlib"])
    transfers = [e for e in events if e.get("type") == "transfer" and e["of"] == "call_trace"]
    assert transfers and {e["codec"] for e in transfers} == {"zstd" if worker_has_zstd else "zlib"}
    assert transfers[-1]["received"] < transfers[-1]["decoded"] == transfers[-1]["raw"]
    call = result.trace.calls[0]
    assert call.node_count == 702 and call.leaf_grads["x"].data == [1.0, 1.0, 1.0]


def test_a_local_worker_sends_its_trace_in_uncompressed_columns(tmp_path):
    """No launcher: the run command asks for raw frames, so the call and the trace travel in
    columns through the pipe, uncompressed, and come back with the same grads."""
    script = tmp_path / "chain.py"
    script.write_text(SCRIPT)
    events = []
    result = run_capture(str(script), timeout=120, on_event=events.append)
    assert result.trace.error is None, (result.trace.error, result.output)
    transfers = [e for e in events if e.get("type") == "transfer"]
    assert {e["of"] for e in transfers} == {"call_trace", "trace"} and {e["codec"] for e in transfers} == {"raw"}
    call = [e for e in transfers if e["of"] == "call_trace"][-1]
    assert call["decoded"] == call["raw"] < call["received"]  # each chunk as it is, after its length
    (captured,) = result.trace.calls
    assert captured.node_count == 702 and captured.leaf_grads["x"].data == [1.0, 1.0, 1.0]


def _kinds(data: bytes) -> dict:
    return {path: (kind, payload) for path, kind, payload in _columns(data)}


def test_each_column_is_packed_by_what_it_holds():
    call = residual_mlp_call(blocks=300)
    names = [t.name for t in call.tensors]
    names[5] = "two\nlines"  # a newline inside: that column cannot be joined by newlines
    made = [n.id for n in call.nodes if n.kind == "backward"]  # every other tensor made by a node
    call = replace(call, tensors=[replace(t, name=n, nbytes=2 ** 70 if i == 0 else t.nbytes,
                                          grad_fn=made[i] if i % 2 and i < len(made) else None)
                                  for i, (t, n) in enumerate(zip(call.tensors, names))])
    ids = [t.id for t in call.tensors]
    call = replace(call, storages=[StorageInfo(id=f"s{i}", nbytes=64, device="cpu", tensors=ids[i:i + i % 3])
                                   for i in range(len(ids))])
    data = tc.encode(call)
    kinds = _kinds(data)
    assert kinds["nodes.id"][0] == "text" and kinds["nodes.id"][1].split("\n") == [n.id for n in call.nodes]
    kind, (table, at) = kinds["nodes.name"]
    assert kind == "strs" and at.startswith("B:") and sorted(table) == sorted({n.name for n in call.nodes})
    assert kinds["tensors.shape"][0] == "i64s" and kinds["tensors.stride"][0] == "i64s"
    assert kinds["tensors.version"][0] == "i64" or "tensors.version" not in kinds
    assert kinds["nodes.next.input_nr"][0] == "i64"
    kind, (flags, lines) = kinds["nodes.line"]  # None among the lines: flags, then the lines there are
    assert kind == "i64?" and column_pack.unpack_mask(flags) == [n.line is not None for n in call.nodes]
    assert column_pack.unpack_ints(lines) == [n.line for n in call.nodes if n.line is not None]
    kind, (flags, text) = kinds["tensors.grad_fn"]  # the ids of the nodes that made them, None for leaves
    assert kind == "text?" and text.split("\n") == [t.grad_fn for t in call.tensors if t.grad_fn is not None]
    assert column_pack.unpack_mask(flags) == [t.grad_fn is not None for t in call.tensors]
    assert kinds["tensors.is_leaf"][0] == "bool"
    assert column_pack.unpack_bools(kinds["tensors.is_leaf"][1]) == [t.is_leaf for t in call.tensors]
    kind, (lens, text) = kinds["storages.tensors"]  # lists of tensor ids
    assert kind == "texts" and column_pack.unpack_ints(lens) == [len(s.tensors) for s in call.storages]
    assert text.split("\n") == [tid for s in call.storages for tid in s.tensors]
    assert kinds["tensors.nbytes"][0] == "vals"  # 2 ** 70 does not fit 64 bits: as JSON
    assert kinds["tensors.name"][0] == "vals"
    back = tr.decode(data, "call")
    assert back == call and back.tensors[5].name == "two\nlines" and back.tensors[0].nbytes == 2 ** 70
    assert [type(t.shape[0]) for t in back.tensors if t.shape] == [int] * sum(1 for t in back.tensors if t.shape)


@pytest.mark.parametrize("values, prefix", [([0, 255], "B:"), ([0, 256], "H:"), ([3, 70000], "I:"), ([-1, 5], "b:"),
                                            ([-129, 5], "h:"), ([-40000, 5], "i:"), ([2 ** 40], ""),
                                            ([-2 ** 63, 2 ** 63 - 1], ""), ([], "")])
def test_integers_pack_in_the_narrowest_type(values, prefix):
    packed = column_pack.pack_ints(values)
    assert packed[:2] == prefix if prefix else packed[1:2] != ":"
    assert column_pack.unpack_ints(packed) == values
    assert column_pack.packed_unsigned(packed) == (prefix[:1] in ("B", "H", "I") and prefix != "")


@pytest.mark.parametrize("path, kind, payload, message", [
    ("nodes.line", "i64", "Z:AAAA", "the packed integers are not readable"),
    ("nodes.line", "i64", "B:AAA", "the packed integers are not readable"),
    ("tensors.shape", "i64s", ["B:AQ==", "B:AQID"], "the packed integers do not match their lengths"),
    ("tensors.shape", "i64s", "B:AQ==", r"expected \[lengths, integers\]"),
    ("nodes.id", "text", ["n0"], "expected the column's strings as one text"),
    ("nodes.line", "i64?", ["AQE=", "B:Fg=="], "the packed integers do not match their flags"),  # two flags, one line
    ("nodes.line", "i64?", "B:Fg==", r"expected \[flags, integers\]"),
    ("tensors.name", "text?", ["AQAB", "x"], "the strings do not match their flags"),
    ("tensors.name", "text?", ["AgAB", "x\ny"], "the strings do not match their flags"),  # a flag of 2
    ("roots", "texts", ["B:AQ==", "n0\nn1"], "the strings do not match their lengths"),
    ("roots", "texts", ["b:/wM=", "n0\nn1"], "the strings do not match their lengths"),  # -1 and 3
    ("tensors.is_leaf", "bool", "AQI=", "expected a byte of 0 or 1 a row"),
    ("nodes.next", "mask", "AgEB", "expected a list of 0 / 1 flags"),
    ("nodes.next", "lens", "b:/w==", "expected a list of counts"),
])
def test_a_packed_column_that_is_wrong_is_named(path, kind, payload, message):
    data = tc.encode(residual_mlp_call(blocks=20))
    items = _columns(data)
    (item,) = [i for i in items if i[0] == path and (i[1] == kind or kind not in ("lens", "mask"))]
    item[1], item[2] = kind, payload
    with pytest.raises(TraceFormatError, match=rf"field '{re.escape(path)}': {message}"):
        tr.decode(_join(items), "call")


def test_string_indices_past_their_table_are_refused():
    data = tc.encode(residual_mlp_call(blocks=20))
    items = _columns(data)
    (item,) = [i for i in items if i[0] == "nodes.name"]
    table, at = item[2]
    item[2] = [table[:1], at]  # indices now point past a one-string table
    with pytest.raises(TraceFormatError, match=r"field 'nodes.name': string indices out of range"):
        tr.decode(_join(items), "call")


def test_a_big_frame_leaves_its_objects_out_of_later_collections(monkeypatch):
    monkeypatch.setattr(wire, "FREEZE_MIN_BYTES", 1)
    gc.unfreeze()
    enabled = gc.isenabled()
    try:
        got, _ = _stream(residual_mlp_call(blocks=50), "zlib", piece=4096)
        assert got[1]["call"] == residual_mlp_call(blocks=50)
        assert gc.get_freeze_count() > 1000 and gc.isenabled() == enabled
    finally:
        gc.unfreeze()


def test_the_worker_channel_compresses_columns_on_its_writer_thread():
    """The worker's own Channel: columns encoded on the sending thread, compressed and written on
    the writer thread, decoded by the app's StreamDecoder into the same trace."""
    read_fd, write_fd = os.pipe()
    trace = full_trace()
    channel = Channel(write_fd)
    channel.codec, channel.columns = "zlib", True
    out = bytearray()
    reader = threading.Thread(target=lambda: [out.extend(b) for b in iter(lambda: os.read(read_fd, 65536), b"")])
    reader.start()
    channel.send({"type": "trace", "trace": trace, "run": 3})
    os.close(write_fd)
    reader.join(30)
    os.close(read_fd)
    got = []
    wire.StreamDecoder(got.append).feed(bytes(out))
    assert got[0]["trace"] == trace and got[0]["run"] == 3 and not channel.broken
    assert out.count(b'"enc": "columns"') == 1 and len(out) < len(trace.to_json()) / 3


def _send_read(channel: Channel, read_fd: int, msg: dict) -> tuple[list, "wire.StreamDecoder", BaseException | None]:
    """Send ``msg`` on ``channel`` (whose pipe ``read_fd`` reads) and decode what came."""
    out = bytearray()
    reader = threading.Thread(target=lambda: [out.extend(b) for b in iter(lambda: os.read(read_fd, 65536), b"")])
    reader.start()
    raised = None
    try:
        channel.send(msg)
    except BaseException as exc:  # KeyboardInterrupt, here
        raised = exc
    channel.send({"type": "bye"})
    os.close(channel.fd)
    reader.join(30)
    os.close(read_fd)
    got = []
    decoder = wire.StreamDecoder(lambda m: got.append(m if isinstance(m, dict) else json.loads(m)))
    decoder.feed(bytes(out))
    return got, decoder, raised


def test_a_stop_that_comes_while_a_frame_is_made_waits_until_it_has_left(monkeypatch, sigint_gate):
    """Stop (``interrupt_main`` from the worker's command thread) lands while the script's thread
    encodes a call as a frame: the frame leaves whole, the next message after it, and the script
    gets its KeyboardInterrupt right after the send; once the script has ended the Stop is
    dropped. Before, the frame was cut where the interrupt landed, and the app waited for the
    rest of it."""
    import _thread

    from core.worker import channel as worker_channel

    gate = sigint_gate
    monkeypatch.setattr(worker_channel, "INTERRUPTS", gate)
    parts = wire.columns_parts

    def stopped_on_the_way(*args):
        for i, part in enumerate(parts(*args)):
            if i == 1:
                _thread.interrupt_main()  # what Cancel does, after the frame's header has gone
            yield part

    monkeypatch.setattr(wire, "columns_parts", stopped_on_the_way)
    call = residual_mlp_call(blocks=20)
    for active, expected in ((True, KeyboardInterrupt), (False, None)):
        gate.active = active  # the script runs / the script has ended
        read_fd, write_fd = os.pipe()
        channel = Channel(write_fd)
        channel.codec, channel.columns = "zlib", True
        got, decoder, raised = _send_read(channel, read_fd, {"type": "call_trace", "call": call, "position": 0})
        assert type(raised) is (expected or type(None))
        assert [m["type"] for m in got] == ["call_trace", "bye"] and got[0]["call"] == call
        assert not decoder.partial and gate.depth == 0 and not gate.pending


def test_a_channel_without_a_fallback_says_once_that_its_pipe_is_gone(tmp_path):
    """Behind a launcher (no fallback file) a pipe the script closed calls ``on_lost(True)`` once,
    on the first message that cannot go, small or framed; a pipe whose reader went away calls
    ``on_lost(False)``; with a fallback file the message goes there and nothing is called."""
    lost = []
    read_fd, write_fd = os.pipe()
    channel = Channel(write_fd)
    channel.codec, channel.on_lost = "zlib", lambda by_script: lost.append(("script", by_script))
    channel.send({"type": "call", "index": 0})
    assert os.read(read_fd, 100) == b'{"type":"call","index":0}\n' and lost == []
    os.close(write_fd)  # what the script did
    channel.send({"type": "memory", "samples": []})
    channel.send({"type": "trace", "trace": full_trace(), "run": 1})  # a frame, after the pipe is gone
    assert channel.broken and lost == [("script", True)]
    os.close(read_fd)
    read_fd, write_fd = os.pipe()  # the reader goes away: the descriptor is still the channel's pipe
    gone = Channel(write_fd)
    gone.on_lost = lambda by_script: lost.append(("reader", by_script))
    os.close(read_fd)
    gone.send({"type": "memory", "samples": []})
    assert gone.broken and lost[1:] == [("reader", False)]
    os.close(write_fd)
    lost.clear()
    fallback = tmp_path / "result.jsonl"
    fallback.write_bytes(b"")
    read_fd, write_fd = os.pipe()
    kept = Channel(write_fd, fallback=str(fallback))
    kept.on_lost = lambda by_script: lost.append(("kept", by_script))
    os.close(write_fd)
    kept.send({"type": "bye"})
    assert lost == [] and fallback.read_bytes() == b'{"type":"bye"}\n'
    os.close(read_fd)


def test_read_ahead_keeps_reading_while_the_caller_decodes():
    """The pipe is drained on a thread of its own: every piece arrives in order, the source runs
    ahead of a slow consumer, and an error in the source reaches the consumer."""
    made = []

    def source():
        for i in range(50):
            made.append(i)
            yield bytes([i])

    seen = []
    for chunk in wire.read_ahead(source()):
        if not seen:
            deadline = time.monotonic() + 5
            while len(made) < 50 and time.monotonic() < deadline:  # the consumer is busy: reading goes on
                time.sleep(0.01)
            assert len(made) == 50
        seen.append(chunk[0])
    assert seen == list(range(50))

    def broken():
        yield b"a"
        raise OSError("pipe gone")

    with pytest.raises(OSError, match="pipe gone"):
        list(wire.read_ahead(broken()))


def _call_with_leaf_grads(shared: bool):
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


def test_a_leafs_gradient_travels_once_as_a_row_of_its_tensors_grads():
    shared, copied = _call_with_leaf_grads(True), _call_with_leaf_grads(False)
    data = tc.encode(shared)
    refs = _kinds(data)["leaf_grads"]
    assert refs[0] == "refs"
    rows = column_pack.unpack_ints(refs[1])
    assert rows.count(-1) == 1 and sorted(r for r in rows if r >= 0) == list(range(len(rows) - 1))
    assert "leaf_grads#keys" in _kinds(data) and "leaf_grads.sample" not in _kinds(data)  # only "extra"'s data
    back = tr.decode(data, "call")
    assert back == shared == copied
    grads = {t.name: t.grad.values for t in back.tensors if t.grad is not None}
    assert all(back.leaf_grads[name] is values for name, values in grads.items())  # one object, as sent
    assert back.leaf_grads["extra"].data == [2.5]
    copied_data = tc.encode(copied)
    assert "refs" not in {kind for kind, _ in _kinds(copied_data).values()}
    assert len(data) < 0.85 * len(copied_data)


@pytest.mark.parametrize("rows, message", [("b:/w==", "expected row numbers"),  # -1 alone: no own row sent
                                           ("B:/w==", "refers to rows that 'tensors.grad.values' does not have"),
                                           ("b:/g==", "expected row numbers")])
def test_leaf_gradient_rows_that_are_wrong_are_named(rows, message):
    items = _columns(tc.encode(_call_with_leaf_grads(True)))
    (item,) = [i for i in items if i[0] == "leaf_grads" and i[1] == "refs"]
    count = len(column_pack.unpack_ints(item[2]))
    if rows == "b:/w==":  # as many rows as keys, all -1: the own table holds one row, not all of them
        item[2] = column_pack.pack_ints([-1] * count)
        message = r"expected \d+ rows, got 1"
    elif rows == "B:/w==":
        item[2] = column_pack.pack_ints([255] * count)
    else:
        item[2] = column_pack.pack_ints([-2] * count)
    with pytest.raises(TraceFormatError, match=rf"field 'leaf_grads[^']*': {message}"):
        tr.decode(_join(items), "call")


def test_floats_that_are_float32_travel_in_four_bytes_and_come_back_equal():
    singles = [struct.unpack("<f", struct.pack("<f", x))[0] for x in (0.1, -2.5e-8, 3.4e38, 1.0, -0.0)]
    packed = pack_floats(singles)
    assert packed.startswith("f:") and len(column_pack.unb64(packed[2:])) == 4 * len(singles)
    back = column_pack.unpack_floats(packed, len(singles))
    assert back == singles and struct.pack("<5d", *back) == struct.pack("<5d", *singles)  # -0.0 stays -0.0
    for doubles in ([0.1], [float("nan")], [1e300], [5e-324], singles + [0.1]):  # not all exact in 4 bytes
        packed = pack_floats(doubles)
        assert not packed.startswith("f:") and len(column_pack.unb64(packed)) == 8 * len(doubles)
        assert struct.pack(f"<{len(doubles)}d", *column_pack.unpack_floats(packed, len(doubles))) == \
            struct.pack(f"<{len(doubles)}d", *doubles)
    assert column_pack.unpack_floats("f:" + column_pack.b64(b"\0" * 6), None) is None  # not whole floats
    assert column_pack.unpack_floats(pack_floats(singles), 4) is None  # not the count asked for


def test_a_frame_is_sent_and_read_with_a_short_switch_interval(monkeypatch):
    """The writer thread and the read-ahead thread get the GIL within half a millisecond while a
    frame travels; the interval in force before comes back after it, also for a frame cut off."""
    from core.protocol import switch_interval

    before = sys.getswitchinterval()
    seen = []
    real = wire.chunk_packer

    def packer(codec):
        pack = real(codec)
        return lambda batch: (seen.append(sys.getswitchinterval()), pack(batch))[1]

    monkeypatch.setattr(wire, "chunk_packer", packer)
    read_fd, write_fd = os.pipe()
    out = bytearray()
    reader = threading.Thread(target=lambda: [out.extend(b) for b in iter(lambda: os.read(read_fd, 65536), b"")])
    reader.start()
    channel = Channel(write_fd)
    channel.codec, channel.columns = "zlib", True
    channel.send({"type": "call_trace", "call": residual_mlp_call(blocks=20), "run": 1})
    os.close(write_fd)
    reader.join(30)
    os.close(read_fd)
    assert seen and set(seen) == {min(before, switch_interval.STEP_SWITCH_S)}
    assert sys.getswitchinterval() == before
    during = []
    decoder = wire.StreamDecoder(lambda msg: during.append(sys.getswitchinterval()))
    decoder.feed(bytes(out[: len(out) // 2]))
    assert sys.getswitchinterval() == min(before, switch_interval.STEP_SWITCH_S) and decoder.partial
    decoder.close()  # the connection dropped mid-frame
    assert sys.getswitchinterval() == before
    wire.StreamDecoder(lambda msg: during.append(sys.getswitchinterval())).feed(bytes(out))
    assert during == [before]  # restored before the message is handed on


def test_big_tables_travel_in_blocks_each_built_as_it_comes(monkeypatch):
    """A call's nodes, tensors and storages go in blocks of BLOCK_ROWS rows, each followed by its
    row count; the reader has built every node (and freed their columns) before the tensors come."""
    monkeypatch.setattr(tc, "BLOCK_ROWS", 50)
    call = residual_mlp_call(blocks=30)  # 182 nodes: blocks of 50, 50, 50, 32
    lines = tc.encode(call).splitlines()
    done = [json.loads(line)[2] for line in lines if json.loads(line)[:2] == ["nodes", "done"]]
    assert done == [50, 50, 50, 32]
    reader = tr.ColumnReader("call")
    first_tensor = next(i for i, line in enumerate(lines) if line.startswith(b'["tensors.'))
    for line in lines[:first_tensor]:
        reader.feed(line)
    assert reader.built["nodes"] == call.nodes
    assert not [key for key in reader.cols if key[0].startswith("nodes.")]
    for line in lines[first_tensor:]:
        reader.feed(line)
    back = reader.result()
    assert back == call and back.nodes == reader.built["nodes"]
    trace = full_trace()
    monkeypatch.setattr(tc, "BLOCK_ROWS", 3)  # blocks that run across the two calls
    assert tr.decode(tc.encode(trace)).to_json() == trace.to_json()


def test_a_streamed_calls_nested_tables_travel_inside_its_blocks(monkeypatch):
    """Only the call's own lists go in blocks: each node's saved values and edges travel inside
    its node's block, however many there are (a call_trace message, as Debug streams it)."""
    monkeypatch.setattr(tc, "BLOCK_ROWS", 50)
    call = residual_mlp_call(blocks=30)
    call = replace(call, nodes=[replace(n, saved=[Saved(name="self", tensor=call.tensors[0].id), Saved(name="dim",
                                                                                                  value=[i, 2])])
                                for i, n in enumerate(call.nodes)])  # 364 saved rows, 50 nodes a block
    lines = [json.loads(line) for line in tc.encode(call).splitlines()]
    blocks = [p for p, kind, rows in lines if kind == "done" and rows]
    assert blocks == ["nodes"] * 4 + ["tensors"] * -(-len(call.tensors) // 50)
    assert [rows for p, kind, rows in lines if p == "nodes.saved" and kind == "done"] == [None] * 4
    got, _ = _stream(call, "zlib")
    assert got[1]["call"] == call


def test_a_wrong_value_in_a_later_block_is_named_by_its_row_in_the_whole_table(monkeypatch):
    monkeypatch.setattr(tc, "BLOCK_ROWS", 3)
    trace = full_trace()
    first = len(trace.calls[0].tensors)  # 10: blocks of rows 0-2, 3-5, 6-8, 9-11 (the second call's 0-2)
    items = _columns(tc.encode(trace))
    shapes = [i for i in items if i[0] == "calls.tensors.shape"]
    assert len(shapes) == 5
    shapes[3][1], shapes[3][2] = "vals", [[1], [2, -3], [4]]  # rows 9, 10, 11
    assert first == 10
    with pytest.raises(TraceFormatError, match=r"field 'calls\[1\]\.tensors\[0\]\.shape': expected a list of "
                                               r"non-negative integers"):
        tr.decode(_join(items))


def test_a_leafs_gradient_refers_to_its_row_across_blocks(monkeypatch):
    monkeypatch.setattr(tc, "BLOCK_ROWS", 2)
    call = _call_with_leaf_grads(True)
    back = tr.decode(tc.encode(call), "call")
    assert back == call
    grads = {t.name: t.grad.values for t in back.tensors if t.grad is not None}
    assert len(grads) > 2 and all(back.leaf_grads[name] is values for name, values in grads.items())


@pytest.mark.parametrize("change, message", [
    (lambda items: items.__setitem__(_where(items, "nodes", "done"), ["nodes", "done", 0]),
     r"field 'nodes': expected a block's row count, got 0"),
    (lambda items: items.__setitem__(_where(items, "nodes", "done"), ["nodes", "done", "50"]),
     r"field 'nodes': expected a block's row count, got '50'"),
    (lambda items: items.insert(_where(items, "nodes", "done"), ["nodes.next", "done", 3]),
     r"field 'nodes.next': is not a table that travels in blocks"),
    (lambda items: items.__setitem__(_where(items, "nodes", "done"), ["nodes", "done", 60]),
     r"field 'nodes\[0\]\.id': expected 60 rows, got 50"),
    (lambda items: items.__setitem__(_where(items, "nodes", "done"), ["nodes", "done", 10 ** 9]),
     r"field 'nodes': a block of 1000000000 rows after 0 runs past the table's 182"),
    (lambda items: items.pop(_where(items, "nodes", "done", last=True)),
     r"field 'nodes': expected 182 rows in its blocks, got 150"),
])
def test_blocks_whose_row_counts_are_wrong_are_refused(monkeypatch, change, message):
    monkeypatch.setattr(tc, "BLOCK_ROWS", 50)
    items = _columns(tc.encode(residual_mlp_call(blocks=30)))
    change(items)
    with pytest.raises(TraceFormatError, match=message):
        tr.decode(_join(items), "call")


def _where(items: list, path: str, kind: str, last: bool = False) -> int:
    at = [i for i, item in enumerate(items) if item[:2] == [path, kind]]
    return at[-1] if last else at[0]


def test_a_lone_calls_links_are_checked_from_its_id_columns_and_named_when_wrong():
    call = residual_mlp_call(blocks=20)
    assert tr.decode(tc.encode(call), "call") == call
    items = _columns(tc.encode(call))
    (targets,) = [i for i in items if i[0] == "nodes.next.node"]
    names = targets[2].split("\n")
    names[5] = "n_nowhere"
    targets[1], targets[2] = "vals", names
    owner = next(i for i, n in enumerate(call.nodes) if sum(map(len, (m.next for m in call.nodes[:i + 1]))) > 5)
    with pytest.raises(TraceFormatError, match=rf"field 'nodes\[{owner}\]\.next\[\d\]': node 'n_nowhere' is not in"):
        tr.decode(_join(items), "call")
    items = _columns(tc.encode(call))
    (ids,) = [i for i in items if i[0] == "nodes.id"]
    names = ids[2].split("\n")
    names[3] = names[2]
    ids[1], ids[2] = "vals", names
    with pytest.raises(TraceFormatError, match=rf"field 'nodes\[3\]\.id': node id '{names[2]}' appears twice"):
        tr.decode(_join(items), "call")
