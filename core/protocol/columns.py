"""A compact columnar encoding of traces and calls, for the wire between worker and app.

The saved trace format stays the JSON of ``core.model.trace_json``; this encoding is what a worker
behind a launcher sends in its compressed frames (``core.protocol.wire``). Where the JSON repeats every
key on every one of 50,000 nodes and builds a dict per object, this sends each dataclass
field as one column: a list of every row's value, strings that repeat (op names, dtypes,
devices, module paths) interned in a table with integer indices, fields equal to their
default left out, nested objects (a tensor's ``values``, a node's ``next`` edges) as tables
of their own with row counts or presence masks, objects the worker shares between two tables
(a leaf's gradient is its tensor's ``grad.values``) once, as row numbers in the second. Each
column is a JSON line of its own (``[path, kind, payload]``), and a call's big tables go in
blocks of rows, so the sender compresses and sends the first columns while it encodes the
rest, and the reader parses each line and builds each block as it arrives, overlapping the
transfer at both ends.

This module holds the layout of the columns (which fields nest which tables, which rows are
shared) and the writer; ``core.protocol.column_reader`` reads them back. Hand-written because
no standard-library or pure-Python package encodes dataclass tables column by column, and the
worker must run with nothing but torch and the standard library.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, fields
from itertools import chain, compress, repeat
from operator import attrgetter, itemgetter
from typing import Iterator

from core.model.trace import (CallInfo, Edge, ErrorInfo, GradInfo, MemorySample, NodeInfo, Saved, Stale, StorageInfo,
                              TensorInfo, Trace, Values, paused_gc)
from core.protocol.column_pack import column_hint, pack_column, pack_ints, pack_mask
from core.protocol.norm_pack import pack_grad_norms

MAGIC = "backprop-studio-columns"
COLUMNS_VERSION = 5  # 2: leaf gradients as rows of their tensors' grads, float32 floats in 4 bytes; 3: row blocks;
# 4: strings and integers with gaps, lists of strings and booleans packed; 5: gradient norms packed

# A call's nodes, tensors and storages (and a trace's own tensors, storages, memory) travel in
# blocks of this many rows, each block's columns followed by its ``done``: the reader builds
# each block's objects while the next one is encoded and carried, instead of building 50,000
# nodes after the last of their columns came, and the sender's first bytes leave after a
# block's worth of work instead of a whole table's.
BLOCK_ROWS = 4096

# Fields holding other dataclasses: (how, class). "one": always an object; "opt": an object or None;
# "list": a list of objects; "list?": a list of objects or None; "map": a dict of objects;
# "maplist?": a dict of lists of objects or None.
NESTED: dict[type, dict[str, tuple[str, type]]] = {
    Trace: {"calls": ("list", CallInfo), "error": ("opt", ErrorInfo), "tensors": ("list", TensorInfo),
            "storages": ("list", StorageInfo), "memory": ("list", MemorySample)},
    CallInfo: {"nodes": ("list", NodeInfo), "tensors": ("list", TensorInfo), "storages": ("list", StorageInfo),
               "error": ("opt", ErrorInfo), "leaf_grads": ("map", Values), "edge_grads": ("maplist?", GradInfo)},
    NodeInfo: {"next": ("list?", Edge), "saved": ("list", Saved), "stale": ("opt", Stale)},
    TensorInfo: {"values": ("one", Values), "grad": ("opt", GradInfo)},
    GradInfo: {"values": ("one", Values)},
}
ROOTS = {"trace": Trace, "call": CallInfo}

# Tables whose objects are, in the worker, the very objects of another table: a leaf's gradient
# is its tensor's ``grad.values``. Such rows travel as row numbers into that table (``refs``),
# and the reader hands out the objects it built there: 16,666 previews not sent twice on the
# 50,000-node example. The source's path is relative to the table holding the field.
SHARED = {(CallInfo, "leaf_grads"): "tensors.grad.values"}
SHARED_SOURCES = tuple(SHARED.values())

NONE_TYPE = type(None)
_SPECS: dict[type, tuple] = {}


def spec_of(cls) -> tuple:
    """(field names, {name: static default}, required-or-factory names) of a dataclass."""
    spec = _SPECS.get(cls)
    if spec is None:
        fs = fields(cls)
        spec = (tuple(f.name for f in fs), {f.name: f.default for f in fs if f.default is not MISSING},
                frozenset(f.name for f in fs if f.default is MISSING))
        _SPECS[cls] = spec
    return spec


# -- writing --------------------------------------------------------------------------------


def encode_lines(obj: Trace | CallInfo) -> Iterator[bytes]:
    """The columnar encoding of a Trace or a CallInfo, one JSON line (bytes) at a time."""
    root = "trace" if isinstance(obj, Trace) else "call"
    yield _line(["", "head", {"format": MAGIC, "version": COLUMNS_VERSION, "root": root}])
    with paused_gc():
        for item in _table(type(obj), [obj], "", {}):
            yield _line(item)
    yield _line(["", "end", None])


def encode(obj: Trace | CallInfo) -> bytes:
    return b"".join(encode_lines(obj))


_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=True).encode


def _line(item: list) -> bytes:
    return (_dumps(item) + "\n").encode("ascii")


def under(path: str, name: str) -> str:
    """The path of field ``name`` of the table at ``path`` (the root's table has the path "")."""
    return f"{path}.{name}" if path else name


def _table(cls, objs: list, path: str, seen: dict) -> Iterator[list]:
    """The columns of ``objs`` (all of ``cls``) at ``path``. ``seen`` maps each table of
    ``SHARED_SOURCES`` encoded so far (by path) to ``{id(object): row}``."""
    names, defaults, _ = spec_of(cls)
    nested = NESTED.get(cls, {})
    n = len(objs)
    if path.endswith(SHARED_SOURCES):  # rows numbered across the blocks of the table above
        rows = seen.setdefault(path, {})
        start = seen.get((path,), 0)
        rows.update(zip(map(id, objs), range(start, start + n)))
        seen[(path,)] = start + n
    if not n:
        return  # no rows: the reader needs no columns
    # Wide tables in one pass over the objects' dicts (a getter per field is 1.5x slower there, and
    # a dict lookup a quarter faster than an attribute's), narrow ones a field at a time
    # (transposing thousands of short tuples is slower there). Tuples as zip makes them: JSON
    # and every step below read a tuple as they read a list.
    columns = list(zip(*map(itemgetter(*names), map(vars, objs)))) if len(names) > 7 else \
        [list(map(attrgetter(name), objs)) for name in names]
    # Plain fields first, then nested tables: a call's options and the like travel (and are read)
    # while its blocks of nodes and tensors are still being encoded, not after them.
    for name, col in sorted(zip(names, columns), key=lambda item: item[0] in nested):
        p = under(path, name)
        how = nested.get(name)
        if how is None:
            if name in defaults and n and col.count(defaults[name]) == n \
                    and set(map(type, col)) == {type(defaults[name])}:
                continue  # every row has the default: the reader fills it in
            if cls is CallInfo and name == "grad_norms":
                yield norms_column(p, col)
                continue
            yield pack_column(p, col, column_hint(cls, name))
            continue
        kind, sub = how
        if kind == "one":
            yield from _table(sub, col, p, seen)
        elif kind == "opt":
            present = list(filter(None, col))  # dataclass objects are always true
            if not present and defaults.get(name, 0) is None:
                continue
            yield [p, "mask", pack_mask(col)]
            yield from _table(sub, present, p, seen)
        elif kind in ("list", "list?"):
            yield [p, "lens", pack_ints(list(map(len, col)))]
            flat = list(chain.from_iterable(col))
            if kind == "list?":
                yield [p, "mask", pack_mask(flat)]
                flat = list(filter(None, flat))
            if not blocked(kind, cls, sub):
                yield from _table(sub, flat, p, seen)
                yield [p, "done", None]
                continue
            for at in range(0, len(flat), BLOCK_ROWS):  # the reader builds each block as it comes
                block = flat[at:at + BLOCK_ROWS]
                yield from _table(sub, block, p, seen)
                yield [p, "done", len(block)]
        elif kind == "map":
            yield [p, "lens", pack_ints(list(map(len, col)))]
            yield pack_column(p + "#keys", list(chain.from_iterable(col)), "str")
            values = list(chain.from_iterable(d.values() for d in col))
            rows = seen.get(under(path, SHARED.get((cls, name), "-")))
            if rows:
                at = list(map(rows.get, map(id, values), repeat(-1)))
                if at.count(-1) < len(at):
                    yield [p, "refs", pack_ints(at)]  # -1: a row of its own, in the table below
                    values = list(compress(values, map((-1).__eq__, at)))
            yield from _table(sub, values, p, seen)
        else:  # "maplist?"
            yield [p, "lens", pack_ints(list(map(len, col)))]
            yield pack_column(p + "#keys", list(chain.from_iterable(col)), "str")
            lists = list(chain.from_iterable(d.values() for d in col))
            yield [p + "#items", "lens", pack_ints(list(map(len, lists)))]
            flat = list(chain.from_iterable(lists))
            yield [p + "#items", "mask", pack_mask(flat)]
            yield from _table(sub, list(filter(None, flat)), p + "#items", seen)


def norms_column(path: str, col: list) -> list:
    """Calls' gradient norms as ``norms`` (each row packed, ``core.protocol.norm_pack``, or None),
    or as JSON where one does not pack exactly."""
    packed = [None if v is None else pack_grad_norms(v) for v in col]
    if any(p is None and v is not None for p, v in zip(packed, col)):
        return [path, "vals", col]
    return [path, "norms", packed]


def top_list(kind: str | None, parent) -> bool:
    """A list field of a trace or a call: the tables the reader builds as soon as they are in."""
    return kind == "list" and (parent is CallInfo or parent is Trace)


def blocked(kind: str | None, parent, cls) -> bool:
    """A list field of ``parent`` holding ``cls`` objects that travels in blocks of rows: a
    call's nodes, tensors, storages, and a trace's own tensors, storages and memory samples
    (not the calls, which hold those)."""
    return top_list(kind, parent) and cls is not CallInfo
