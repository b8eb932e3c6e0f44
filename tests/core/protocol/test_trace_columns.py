"""The columnar wire encoding of traces: exact round trips, the field named for anything wrong,
each column packed by what it holds, leaf gradients sent once, and a lone call's links checked."""

import json
import math
import random
import re
import struct
import zlib
from dataclasses import FrozenInstanceError, fields, replace

import pytest

from core.model.trace import GradInfo, Saved, StorageInfo, Trace, TraceFormatError, Values
from core.model.trace_json import call_to_dict, trace_from_dict
from core.protocol import column_pack
from core.protocol import column_reader as tr
from core.protocol import columns as tc
from core.protocol.column_pack import pack_floats
from tests.core.protocol.column_data import call_with_leaf_grads, column_items, full_trace, joined, replaced_column
from tests.fixtures_graphs import residual_mlp_call


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


def test_a_wrong_value_is_named_by_its_field_path():
    trace = full_trace()
    data = tc.encode(trace)
    shapes = [t.shape for c in trace.calls for t in c.tensors]
    bad = list(shapes)
    bad[len(trace.calls[0].tensors) + 1] = [2, -3]  # the second tensor of the second call
    with pytest.raises(TraceFormatError, match=r"field 'calls\[1\]\.tensors\[1\]\.shape': expected a list of "
                                               r"non-negative integers, got list"):
        tr.decode(replaced_column(data, "calls.tensors.shape", bad))
    names = [n.name for c in trace.calls for n in c.nodes]
    names[2] = 7
    with pytest.raises(TraceFormatError, match=r"field 'calls\[0\]\.nodes\[2\]\.name': expected a string, got 7"):
        tr.decode(replaced_column(data, "calls.nodes.name", names))
    # An edge to a node that is not in the call, as the JSON reader says it.
    targets = [e.node for c in trace.calls for n in c.nodes for e in n.next if e is not None]
    targets[0] = "n_nowhere"
    first = next(n for n in trace.calls[0].nodes if any(n.next))
    where = f"calls[0].nodes[{trace.calls[0].nodes.index(first)}].next[0]"
    with pytest.raises(TraceFormatError, match=re.escape(f"field '{where}': node 'n_nowhere' is not in")):
        tr.decode(replaced_column(data, "calls.nodes.next.node", targets))


def test_missing_cut_short_and_foreign_columns_are_refused():
    data = tc.encode(full_trace())
    items = column_items(data)
    with pytest.raises(TraceFormatError, match="end early"):
        tr.decode(joined(items[:-1]))
    with pytest.raises(TraceFormatError, match=r"field 'calls\[0\]\.nodes\[0\]\.name': missing"):
        tr.decode(joined([i for i in items if i[0] != "calls.nodes.name"]))
    with pytest.raises(TraceFormatError, match="not a columnar Backprop Studio trace"):
        tr.decode(joined([["", "head", {"format": "other"}]] + items[1:]))
    (times,) = [i for i in items if i[0] == "memory.t"]
    assert times[1] == "f64" and times[2][0] is None  # twelve doubles, packed
    times[2][1] = times[2][1][:-12] + "="  # eleven and a half
    with pytest.raises(TraceFormatError, match="field 'memory.t': the packed numbers do not match their count"):
        tr.decode(joined(items))
    times[2][1] = pack_floats([0.5] * 11)
    with pytest.raises(TraceFormatError, match=r"field 'memory\[0\].t': expected 12 rows, got 11"):
        tr.decode(joined(items))
    with pytest.raises(TraceFormatError, match="not readable JSON"):
        tr.decode(data[:200] + b"{oops\n" + data[200:])


@pytest.mark.slow
@pytest.mark.parametrize("block_rows", [tc.BLOCK_ROWS, 3])
def test_whatever_the_columns_accept_the_json_reader_accepts_too(block_rows, monkeypatch):
    """Seeded mutations of single column values: each is refused with a TraceFormatError, or read
    into a trace that the trace file's own reader also accepts, field for field; also where the
    tables come in blocks of three rows, each read (and checked) as it arrives."""
    monkeypatch.setattr(tc, "BLOCK_ROWS", block_rows)
    base = column_items(tc.encode(full_trace()))
    rng = random.Random(16)
    odd = [None, True, 0, -1, 2 ** 70, 1.5, float("inf"), "", "x", [], [1], [-1], ["a"], [None], {}, {"a": 1}]
    refused = accepted = 0
    for _ in range(300):
        items = json.loads(json.dumps(base))
        item = rng.choice([i for i in items if i[1] == "vals" and i[2]])
        item[2][rng.randrange(len(item[2]))] = rng.choice(odd)
        try:
            trace = tr.decode(joined(items))
        except TraceFormatError as exc:
            assert "field '" in str(exc) or "column" in str(exc), exc
            refused += 1
            continue
        accepted += 1
        assert trace_from_dict(json.loads(trace.to_json())) == trace
    assert refused > 100 and accepted > 20


def _kinds(data: bytes) -> dict:
    return {path: (kind, payload) for path, kind, payload in column_items(data)}


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
    items = column_items(data)
    (item,) = [i for i in items if i[0] == path and (i[1] == kind or kind not in ("lens", "mask"))]
    item[1], item[2] = kind, payload
    with pytest.raises(TraceFormatError, match=rf"field '{re.escape(path)}': {message}"):
        tr.decode(joined(items), "call")


def test_string_indices_past_their_table_are_refused():
    data = tc.encode(residual_mlp_call(blocks=20))
    items = column_items(data)
    (item,) = [i for i in items if i[0] == "nodes.name"]
    table, at = item[2]
    item[2] = [table[:1], at]  # indices now point past a one-string table
    with pytest.raises(TraceFormatError, match=r"field 'nodes.name': string indices out of range"):
        tr.decode(joined(items), "call")


def test_a_leafs_gradient_travels_once_as_a_row_of_its_tensors_grads():
    shared, copied = call_with_leaf_grads(True), call_with_leaf_grads(False)
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
    items = column_items(tc.encode(call_with_leaf_grads(True)))
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
        tr.decode(joined(items), "call")


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


def test_a_lone_calls_links_are_checked_from_its_id_columns_and_named_when_wrong():
    call = residual_mlp_call(blocks=20)
    assert tr.decode(tc.encode(call), "call") == call
    items = column_items(tc.encode(call))
    (targets,) = [i for i in items if i[0] == "nodes.next.node"]
    names = targets[2].split("\n")
    names[5] = "n_nowhere"
    targets[1], targets[2] = "vals", names
    owner = next(i for i, n in enumerate(call.nodes) if sum(map(len, (m.next for m in call.nodes[:i + 1]))) > 5)
    with pytest.raises(TraceFormatError, match=rf"field 'nodes\[{owner}\]\.next\[\d\]': node 'n_nowhere' is not in"):
        tr.decode(joined(items), "call")
    items = column_items(tc.encode(call))
    (ids,) = [i for i in items if i[0] == "nodes.id"]
    names = ids[2].split("\n")
    names[3] = names[2]
    ids[1], ids[2] = "vals", names
    with pytest.raises(TraceFormatError, match=rf"field 'nodes\[3\]\.id': node id '{names[2]}' appears twice"):
        tr.decode(joined(items), "call")
