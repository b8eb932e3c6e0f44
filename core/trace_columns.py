"""A compact columnar encoding of traces and calls, for the wire between worker and app.

The saved trace format stays the JSON of ``core.trace_json``; this encoding is what a worker
behind a launcher sends in its compressed frames (``core.wire``). Where the JSON repeats every
key on every one of 50,000 nodes and builds a dict per object, this sends each dataclass
field as one column: a list of every row's value, strings that repeat (op names, dtypes,
devices, module paths) interned in a table with integer indices, fields equal to their
default left out, nested objects (a tensor's ``values``, a node's ``next`` edges) as tables
of their own with row counts or presence masks. Each column is a JSON line of its own
(``[path, kind, payload]``), so the sender compresses and sends the first columns while it
encodes the rest, and the reader parses each line as it arrives, overlapping the transfer.

Reading checks each column in bulk (the set of value types, the range of counts and indices:
C loops, not a Python call per value), then each row again only when a column is wrong, to
name the field as the JSON reader does (``calls[0].tensors[12].shape``). Hand-written because
no standard-library or pure-Python package encodes dataclass tables column by column, and the
worker must run with nothing but torch and the standard library.
"""

from __future__ import annotations

import binascii
import json
import sys
from array import array
from bisect import bisect_right
from dataclasses import MISSING, fields
from itertools import accumulate, chain, repeat
from operator import attrgetter
from typing import Any, Iterator

from core.trace import (FORMAT, VERSION, CallInfo, Edge, ErrorInfo, GradInfo, MemorySample, NodeInfo, Saved,
                        Stale, StorageInfo, TensorInfo, Trace, TraceFormatError, Values, paused_gc)
from core import trace_json as tj
from core.trace_json import _CHECKS, _short

MAGIC = "backprop-studio-columns"
COLUMNS_VERSION = 1
INTERN_MIN_ROWS = 8  # string columns at least this long are interned when values repeat

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

_NONE = type(None)
_set_dict = object.__setattr__
_SPECS: dict[type, tuple] = {}


def _spec(cls) -> tuple:
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
        for item in _table(type(obj), [obj], ""):
            yield _line(item)
    yield _line(["", "end", None])


def encode(obj: Trace | CallInfo) -> bytes:
    return b"".join(encode_lines(obj))


_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=True).encode


def _line(item: list) -> bytes:
    return (_dumps(item) + "\n").encode("ascii")


def _table(cls, objs: list, path: str) -> Iterator[list]:
    names, defaults, _ = _spec(cls)
    nested = NESTED.get(cls, {})
    n = len(objs)
    if not n:
        return  # no rows: the reader needs no columns
    # One pass over the objects reads every field (a getter per field is twice as slow).
    columns = list(map(list, zip(*map(attrgetter(*names), objs)))) if n and len(names) > 1 else \
        [list(map(attrgetter(name), objs)) for name in names]
    for name, col in zip(names, columns):
        p = f"{path}.{name}" if path else name
        how = nested.get(name)
        if how is None:
            if name in defaults and n and col.count(defaults[name]) == n \
                    and set(map(type, col)) == {type(defaults[name])}:
                continue  # every row has the default: the reader fills it in
            yield _column(p, col, _hint(cls, name))
            continue
        kind, sub = how
        if kind == "one":
            yield from _table(sub, col, p)
        elif kind == "opt":
            if col.count(None) == n and defaults.get(name, 0) is None:
                continue
            yield [p, "mask", _pack_mask(col)]
            yield from _table(sub, [o for o in col if o is not None], p)
        elif kind in ("list", "list?"):
            yield [p, "lens", _pack_ints(list(map(len, col)))]
            flat = list(chain.from_iterable(col))
            if kind == "list?":
                yield [p, "mask", _pack_mask(flat)]
                flat = [o for o in flat if o is not None]
            yield from _table(sub, flat, p)
            yield [p, "done", None]  # the reader may build these objects while the rest arrives
        elif kind == "map":
            yield [p, "lens", _pack_ints(list(map(len, col)))]
            yield _column(p + "#keys", list(chain.from_iterable(col)), "str")
            yield from _table(sub, list(chain.from_iterable(d.values() for d in col)), p)
        else:  # "maplist?"
            yield [p, "lens", _pack_ints(list(map(len, col)))]
            yield _column(p + "#keys", list(chain.from_iterable(col)), "str")
            lists = list(chain.from_iterable(d.values() for d in col))
            yield [p + "#items", "lens", _pack_ints(list(map(len, lists)))]
            flat = list(chain.from_iterable(lists))
            yield [p + "#items", "mask", _pack_mask(flat)]
            yield from _table(sub, [o for o in flat if o is not None], p + "#items")


def _column(path: str, col: list, hint: str | None) -> list:
    """A column as ``[path, kind, payload]``: ``strs`` ([table, indices]) when its strings repeat,
    ``f64`` ([None or presence flags, base64 of the doubles]) for floats (or None), ``f64s``
    ([lengths, -1 for None, base64]) for lists of floats, else ``vals`` (the values as they are).
    ``hint`` (from the field's check) says which to try, so most columns are never scanned."""
    if len(col) < INTERN_MIN_ROWS or hint is None:
        return [path, "vals", col]
    if hint == "str":
        try:
            table = list(dict.fromkeys(col))
        except TypeError:  # unhashable values: the reader names the field
            return [path, "vals", col]
        if len(table) * 2 <= len(col):
            at = list(map({v: i for i, v in enumerate(table)}.__getitem__, col))
            return [path, "strs", [table, _pack_ints(at)]]
        return [path, "vals", col]
    types = set(map(type, col))
    if hint == "num" and float in types and types <= {float, _NONE}:
        if _NONE in types:
            return [path, "f64", [_b64(bytes([v is not None for v in col])), _pack([v for v in col if v is not None])]]
        return [path, "f64", [None, _pack(col)]]
    if hint == "floats" and types <= {list, _NONE} and list in types:
        lists = [v for v in col if v is not None] if _NONE in types else col
        flat = list(chain.from_iterable(lists))
        if flat and set(map(type, flat)) == {float}:
            return [path, "f64s", [_pack_ints([-1 if v is None else len(v) for v in col]), _pack(flat)]]
    return [path, "vals", col]


_HINTS: dict[tuple[type, str], str | None] = {}


def _hint(cls, name: str) -> str | None:
    """What a field's column may pack into, from its check: strings, numbers, lists of numbers."""
    key = (cls, name)
    if key not in _HINTS:
        check = _CHECKS.get(cls, {}).get(name)
        _HINTS[key] = {tj._t_str: "str", tj._t_opt_str: "str", tj._t_num: "num", tj._t_opt_num: "num",
                       tj._t_elements: "floats"}.get(check)
    return _HINTS[key]


def _pack(floats: list) -> str:
    """Doubles, bit for bit (little-endian), as base64 text: 10x faster to write and read than their decimal text."""
    data = array("d", floats)
    if sys.byteorder == "big":
        data.byteswap()
    return _b64(data.tobytes())


def _b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def _unb64(text: Any) -> bytes | None:
    if not isinstance(text, str):
        return None
    try:
        return binascii.a2b_base64(text)
    except (binascii.Error, ValueError):
        return None


def _pack_ints(ints: list) -> str:
    """Counts and indices as little-endian int64, base64: a C loop each way instead of decimal text."""
    data = array("q", ints)
    if sys.byteorder == "big":
        data.byteswap()
    return _b64(data.tobytes())


def _unpack_ints(text: Any) -> list | None:
    raw = _unb64(text)
    if raw is None or len(raw) % 8:
        return None
    data = array("q")
    data.frombytes(raw)
    if sys.byteorder == "big":
        data.byteswap()
    return data.tolist()


def _pack_mask(objs: list) -> str:
    """One byte per row, 1 where the row holds an object (dataclasses are always true), 0 for None."""
    return _b64(bytes(map(bool, objs)))


def _unpack_mask(text: Any) -> list | None:
    raw = _unb64(text)
    return None if raw is None else list(raw)


def _unpack(text: Any, count: int) -> list | None:
    if not isinstance(text, str):
        return None
    try:
        raw = binascii.a2b_base64(text)
    except (binascii.Error, ValueError):
        return None
    if len(raw) != 8 * count:
        return None
    data = array("d")
    data.frombytes(raw)
    if sys.byteorder == "big":
        data.byteswap()
    return data.tolist()


# -- reading --------------------------------------------------------------------------------


class ColumnReader:
    """Rebuilds a Trace or CallInfo from the lines of ``encode_lines``, fed one at a time.

    ``feed`` parses each line as it arrives; ``result`` builds the dataclasses once the end
    line came, raising TraceFormatError that names the field for anything wrong.
    """

    def __init__(self, source: str = "trace"):
        self.source = source
        self.cols: dict[tuple[str, str], Any] = {}
        self.root: str | None = None
        self.done = False
        self.built: dict[str, list] = {}  # tables built as soon as their columns were all in
        self._where: dict[str, tuple] = {}  # table path -> (parent path, how, running row counts, present rows)

    def fail(self, path: str, what: str):
        raise TraceFormatError(f"{self.source}: field '{path}': {what}")

    def feed(self, line: bytes | str) -> None:
        with paused_gc():  # a column is tens of thousands of new objects, none of them cyclic
            self._feed(line)

    def _feed(self, line: bytes | str) -> None:
        try:
            item = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise TraceFormatError(f"{self.source}: a column is not readable JSON: {str(exc)[:80]}") from None
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str) and isinstance(item[1], str)):
            raise TraceFormatError(f"{self.source}: expected a [path, kind, payload] column, got {_short(item)}")
        path, kind, payload = item
        if kind == "head":
            if not isinstance(payload, dict) or payload.get("format") != MAGIC:
                raise TraceFormatError(f"{self.source}: not a columnar Backprop Studio trace")
            if payload.get("version") != COLUMNS_VERSION or payload.get("root") not in ROOTS:
                raise TraceFormatError(f"{self.source}: columnar encoding version {_short(payload.get('version'))} "
                                       f"of a {_short(payload.get('root'))} is not the one this app reads "
                                       f"({COLUMNS_VERSION})")
            self.root = payload["root"]
            return
        if self.root is None:
            raise TraceFormatError(f"{self.source}: the columns do not start with their header")
        if kind == "end":
            self.done = True
            return
        if kind == "done":
            self._build_early(path)
            return
        if kind == "strs":
            if not (isinstance(payload, list) and len(payload) == 2 and isinstance(payload[0], list)):
                self.fail(path, "expected [strings, indices]")
            table, at = payload
            at = _unpack_ints(at)
            if not isinstance(table, list) or not _ints_in(at, len(table)):
                self.fail(path, "string indices out of range")
            payload, kind = list(map(table.__getitem__, at)), "vals"
        elif kind == "f64":
            if not (isinstance(payload, list) and len(payload) == 2):
                self.fail(path, "expected [flags, doubles]")
            flags, packed = payload
            if flags is None:
                values = _unpack(packed, len(packed) * 3 // 4 // 8 if isinstance(packed, str) else 0)
            elif _ints_in(flags := _unpack_mask(flags), 2):
                values = _unpack(packed, sum(flags))
                if values is not None:
                    it = iter(values)
                    values = [next(it) if f else None for f in flags]
            else:
                values = None
            if values is None:
                self.fail(path, "the packed numbers do not match their count")
            payload, kind = values, "vals"
        elif kind == "f64s":
            if not (isinstance(payload, list) and len(payload) == 2):
                self.fail(path, "expected [lengths, doubles]")
            lens, packed = _unpack_ints(payload[0]), payload[1]
            values = None
            if lens is not None and (not lens or min(lens) >= -1):
                values = _unpack(packed, sum(lens) + lens.count(-1))
            if values is None:
                self.fail(path, "the packed numbers do not match their lengths")
            payload, kind = _split(values, lens), "vals"
        elif kind in ("lens", "mask"):
            payload = _unpack_mask(payload) if kind == "mask" else _unpack_ints(payload)
            if not _ints_in(payload, 2 if kind == "mask" else None):
                self.fail(path, f"expected a list of {'0 / 1 flags' if kind == 'mask' else 'counts'}")
        elif kind != "vals" or not isinstance(payload, list):
            self.fail(path, f"unknown column kind {_short(kind)}")
        self.cols[(path, kind)] = payload

    def result(self) -> Trace | CallInfo:
        if not self.done:
            raise TraceFormatError(f"{self.source}: the columns end early (the transfer was cut off)")
        with paused_gc():
            objs = self._build(ROOTS[self.root], "", 1)
            obj = objs[0] if objs else self.fail("", "no rows")
            if isinstance(obj, Trace):
                if obj.format != FORMAT:
                    self.fail("format", f"expected '{FORMAT}', got {_short(obj.format)}")
                if not 1 <= obj.version <= VERSION:
                    self.fail("version", f"trace version {obj.version} is not one this Backprop Studio reads")
                for i, call in enumerate(obj.calls):
                    self._check_links(call, f"calls[{i}]")
            else:
                self._check_links(obj, "")
            return obj

    # building

    def _take(self, path: str, kind: str, n: int) -> list:
        col = self.cols.get((path, kind))
        if col is None:
            if not n:
                return []
            self.fail(self._name(path, 0), "missing")
        if len(col) != n:
            self.fail(self._name(path, 0), f"expected {n} rows, got {len(col)}")
        return col

    def _build(self, cls, path: str, n: int) -> list:
        names, defaults, no_default = _spec(cls)
        nested = NESTED.get(cls, {})
        checks = _CHECKS.get(cls, {})
        keys, cols = [], []  # in field order, as __init__ would fill __dict__
        for name in names:
            p = f"{path}.{name}" if path else name
            how = nested.get(name)
            if how is None:
                col = self.cols.get((p, "vals"))
                if col is None:
                    if name in no_default:
                        if n:
                            self.fail(self._name(p, 0), "missing")
                        continue
                    col = repeat(defaults[name])
                elif len(col) != n:
                    self.fail(self._name(p, 0), f"expected {n} rows, got {len(col)}")
                check = checks.get(name) if isinstance(col, list) else None
                if check is not None and not _bulk_ok(check, col):
                    for i, v in enumerate(col):
                        problem = check(v)
                        if problem is not None:
                            self.fail(self._name(p, i), problem)
            else:
                col = self._nested(how, p, n, name in no_default or defaults.get(name, 0) is not None)
                if col is None:
                    col = repeat(defaults[name])
            keys.append(name)
            cols.append(col)
        # Every object from C loops: its __dict__ made by dict(zip(keys, row)) and set in place
        # (frozen dataclasses' __init__ sets field by field through object.__setattr__: 4x slower).
        rows = zip(*cols, range(n))  # the range keeps n rows when every column is a constant
        dicts = map(dict, map(zip, repeat(keys), rows))
        objs = list(map(cls.__new__, repeat(cls, n)))
        for _ in map(_set_dict, objs, repeat("__dict__"), dicts):
            pass
        return objs

    def _build_early(self, path: str) -> None:
        """Build a top-level table (a call's nodes, tensors, storages) as soon as its columns are in,
        while the next columns are still on their way. Anything wrong is left for ``result``,
        which builds it again and names the field in full."""
        cls, kind = ROOTS[self.root], None
        for part in path.split("."):
            kind, cls = NESTED.get(cls, {}).get(part, (None, None))
            if cls is None:
                return
        if kind != "list" or path.count(".") > 1:
            return
        lens = self.cols.get((path, "lens"))
        if lens is None:
            return
        try:
            self.built[path] = self._build(cls, path, sum(lens))
        except TraceFormatError:
            self.built.pop(path, None)

    def _nested(self, how: tuple[str, type], p: str, n: int, required: bool) -> list | None:
        kind, sub = how
        if kind == "one":
            self._where[p] = (p.rpartition(".")[0], "one", None, None)
            return self._build(sub, p, n)
        if kind == "opt":
            mask = self.cols.get((p, "mask"), [] if not n else None)
            if mask is None:
                if required:
                    self.fail(self._name(p, 0), "missing")
                return None
            if len(mask) != n:
                self.fail(self._name(p, 0), f"expected {n} rows, got {len(mask)}")
            self._where[p] = (p.rpartition(".")[0], "opt", [i for i, m in enumerate(mask) if m], None)
            present = iter(self._build(sub, p, sum(mask)))
            return [next(present) if m else None for m in mask]
        lens = self._take(p, "lens", n)
        self._where[p] = (p.rpartition(".")[0], "list", list(accumulate(lens)), None)
        total = sum(lens)
        early = self.built.pop(p, None)
        if early is not None and len(early) == total and kind == "list":
            return _split(early, lens)
        if kind == "list":
            return _split(self._build(sub, p, total), lens)
        if kind == "list?":
            return _split(self._unmask(sub, p, total), lens)
        keys = self._take(p + "#keys", "vals", total)
        if not set(map(type, keys)) <= {str}:
            self.fail(self._name(p, 0), "expected string keys")
        if kind == "map":
            values = self._build(sub, p, total)
        else:
            items = p + "#items"
            inner = self._take(items, "lens", total)
            self._where[items] = (p, "list", list(accumulate(inner)), None)
            values = _split(self._unmask(sub, items, sum(inner)), inner)
        pairs = iter(zip(keys, values))
        return [dict(next(pairs) for _ in range(k)) for k in lens]

    def _unmask(self, sub, p: str, total: int) -> list:
        mask = self._take(p, "mask", total)
        parent, how, ends, _ = self._where[p]
        self._where[p] = (parent, how, ends, [i for i, m in enumerate(mask) if m])
        present = iter(self._build(sub, p, sum(mask)))
        return [next(present) if m else None for m in mask]

    def _name(self, path: str, row: int) -> str:
        """``calls[0].tensors[12].shape`` for row 12 of the flattened column ``calls.tensors.shape``."""
        table, _, field = path.rpartition(".")
        parts = [field]
        while table:
            parent, how, ends, present = self._where.get(table, ("", "one", None, None))
            name = table.rpartition(".")[2]
            if how == "opt":
                row = ends[row] if row < len(ends) else row
                parts.append(name)
            elif how == "list":
                if present is not None and row < len(present):
                    row = present[row]
                owner = bisect_right(ends, row)
                parts.append(f"{name}[{row - (ends[owner - 1] if owner else 0)}]")
                row = owner
            else:
                parts.append(name)
            table = parent
        return ".".join(reversed(parts))

    def _check_links(self, call: CallInfo, where: str) -> None:
        prefix = f"{where}." if where else ""
        ids = set(map(attrgetter("id"), call.nodes))
        if len(ids) != len(call.nodes):
            seen: set = set()
            for i, node in enumerate(call.nodes):
                if node.id in seen:
                    self.fail(f"{prefix}nodes[{i}].id", f"node id '{node.id}' appears twice")
                seen.add(node.id)
        if len(set(map(attrgetter("id"), call.tensors))) != len(call.tensors):
            seen = set()
            for i, t in enumerate(call.tensors):
                if t.id in seen:
                    self.fail(f"{prefix}tensors[{i}].id", f"tensor id '{t.id}' appears twice")
                seen.add(t.id)
        for i, root in enumerate(call.roots):
            if root not in ids:
                self.fail(f"{prefix}roots[{i}]", f"node '{root}' is not in the call's nodes")
        targets = set(map(attrgetter("node"), filter(None, chain.from_iterable(map(attrgetter("next"), call.nodes)))))
        if not targets <= ids:
            for i, node in enumerate(call.nodes):
                for j, e in enumerate(node.next):
                    if e is not None and e.node not in ids:
                        self.fail(f"{prefix}nodes[{i}].next[{j}]", f"node '{e.node}' is not in the call's nodes")


def decode(data: bytes, source: str = "trace") -> Trace | CallInfo:
    reader = ColumnReader(source)
    for line in data.splitlines():
        if line.strip():
            reader.feed(line)
    return reader.result()


def _split(flat: list, lens: list) -> list:
    """``flat`` cut into consecutive lists of ``lens[i]`` items (a length of -1 gives None)."""
    if -1 in lens:
        ends = list(accumulate(max(k, 0) for k in lens))
        return [None if k < 0 else flat[e - k:e] for k, e in zip(lens, ends)]
    ends = list(accumulate(lens))
    return list(map(flat.__getitem__, map(slice, [0] + ends[:-1], ends)))


def _ints_in(col: Any, bound: int | None) -> bool:
    """``col`` is a list of integers in ``0 .. bound - 1`` (any non-negative one without a bound)."""
    if not isinstance(col, list):
        return False
    if not col:
        return True
    return set(map(type, col)) == {int} and min(col) >= 0 and (bound is None or max(col) < bound)


# -- bulk checks: the same verdict as core.trace_json's per-value checks, in C loops --------


def _types(col) -> set:
    return set(map(type, col))


def _flat(col) -> list:
    return list(chain.from_iterable(col))


def _count_ok(col) -> bool:
    return _types(col) <= {int} and (not col or min(col) >= 0)


def _num_ok(col) -> bool:
    return _types(col) <= {int, float}


def _lists_of(col, allowed, non_negative=False) -> bool:
    if not _types(col) <= {list}:
        return False
    flat = _flat(col)
    return _types(flat) <= allowed and not (non_negative and flat and min(flat) < 0)


def _elements_ok(col) -> bool:
    if not _types(col) <= {list, _NONE}:
        return False
    return _types(_flat(c for c in col if c is not None)) <= {int, float, str, _NONE}


def _make_bulk() -> dict:
    return {
        tj._t_str: lambda c: _types(c) <= {str},
        tj._t_opt_str: lambda c: _types(c) <= {str, _NONE},
        tj._t_bool: lambda c: _types(c) <= {bool},
        tj._t_int: lambda c: _types(c) <= {int},
        tj._t_count: _count_ok,
        tj._t_opt_int: lambda c: _types(c) <= {int, _NONE},
        tj._t_num: _num_ok,
        tj._t_opt_num: lambda c: _types(c) <= {int, float, _NONE},
        tj._t_shape: lambda c: _lists_of(c, {int}, non_negative=True),
        tj._t_ints: lambda c: _lists_of(c, {int}),
        tj._t_strs: lambda c: _lists_of(c, {str}),
        tj._t_elements: _elements_ok,
    }


_BULK = _make_bulk()


def _bulk_ok(check, col: list) -> bool:
    """True when every value of ``col`` passes ``check``; False means: look row by row."""
    bulk = _BULK.get(check)
    if bulk is not None:
        return bulk(col)
    return all(check(v) is None for v in col)
