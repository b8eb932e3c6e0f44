"""Reading the columnar encoding of ``core.protocol.columns``: ``ColumnReader`` rebuilds a Trace
or CallInfo from the lines as they arrive, ``decode`` from a whole message.

Reading checks each column in bulk (the set of value types, the range of counts and indices:
C loops, not a Python call per value), then each row again only when a column is wrong, to
name the field as the JSON reader does (``calls[0].tensors[12].shape``). Each block of rows is
built as soon as its ``done`` line came, overlapping the transfer.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from itertools import accumulate, compress, repeat
from typing import Any

from core.model.trace import (FORMAT, VERSION, CallInfo, NodeInfo, TensorInfo, Trace, TraceFormatError,
                              paused_gc)
from core.model.trace_json import _CHECKS, _short, check_links
from core.protocol.column_pack import (bulk_ok, ints_in, packed_unsigned, row_maker, split, spread, typed_ok,
                                       unpack_bools, unpack_floats, unpack_ints, unpack_mask, unpack_present)
from core.protocol.columns import (COLUMNS_VERSION, MAGIC, NESTED, NONE_TYPE, ROOTS, SHARED, SHARED_SOURCES, blocked,
                                   spec_of, top_list, under)
from core.protocol.norm_pack import NormPackError, unpack_grad_norms

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
        self._typed: dict[str, str] = {}  # column path -> what its packed kind guarantees (see column_pack.typed_ok)
        self.tables: dict[str, list] = {}  # the objects of each table of SHARED_SOURCES, by path
        self._ids: dict[str, list] = {}  # a blocked table of nodes or tensors -> the ids of its rows
        self._targets: dict[str, list] = {}  # a blocked table of nodes -> the node each of its edges names

    def fail(self, path: str, what: str):
        raise TraceFormatError(f"{self.source}: field '{path}': {what}")

    def _pair(self, path: str, payload, first: str, second: str, at: int | None = None, kind: type = object):
        """A packed column's payload is ``[first, second]`` (its item ``at`` of type ``kind``)."""
        if not (isinstance(payload, list) and len(payload) == 2 and (at is None or isinstance(payload[at], kind))):
            self.fail(path, f"expected [{first}, {second}]")

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
            if payload is None:
                self._build_early(path)
            elif type(payload) is int and payload > 0:
                self._build_block(path, payload)
            else:
                self.fail(path, f"expected a block's row count, got {_short(payload)}")
            return
        if kind == "strs":
            self._pair(path, payload, "strings", "indices", 0, list)
            table, at = payload
            unsigned, at = packed_unsigned(at), unpack_ints(at)
            if not isinstance(table, list) or not ints_in(at, len(table), unsigned):
                self.fail(path, "string indices out of range")
            payload, kind = list(map(table.__getitem__, at)), "vals"
            kinds = set(map(type, table))
            if kinds <= {str, NONE_TYPE}:  # then the rows need no check of their own
                self._typed[path] = "str" if NONE_TYPE not in kinds else "str?"
        elif kind == "f64":
            self._pair(path, payload, "flags", "doubles")
            flags, packed = payload
            if flags is None:
                values = unpack_floats(packed, None)
            else:
                values = unpack_present(unpack_mask(flags), unpack_floats(packed, None))
            if values is None:
                self.fail(path, "the packed numbers do not match their count")
            payload, kind = values, "vals"
            self._typed[path] = "num?" if flags is not None else "num"
        elif kind == "f64s":
            self._pair(path, payload, "lengths", "doubles")
            lens, packed = unpack_ints(payload[0]), payload[1]
            values = None
            if lens is not None and (not lens or min(lens) >= -1):
                values = unpack_floats(packed, sum(lens) + lens.count(-1))
            if values is None:
                self.fail(path, "the packed numbers do not match their lengths")
            payload, kind = split(values, lens), "vals"
            self._typed[path] = "floats"
        elif kind == "norms":
            if not isinstance(payload, list):
                self.fail(path, "expected a list of packed gradient norms")
            rows = []
            for i, row in enumerate(payload):
                try:
                    rows.append(None if row is None else unpack_grad_norms(row))
                except NormPackError as exc:
                    self.fail(self._name(path, i), str(exc))
            payload, kind = rows, "vals"
        elif kind == "text":
            if not isinstance(payload, str):
                self.fail(path, "expected the column's strings as one text")
            payload, kind = payload.split("\n"), "vals"
            self._typed[path] = "str"
        elif kind == "text?":
            self._pair(path, payload, "flags", "text", 1, str)
            payload = unpack_present(unpack_mask(payload[0]), payload[1].split("\n"))
            if payload is None:
                self.fail(path, "the strings do not match their flags")
            kind = "vals"
            self._typed[path] = "str?"
        elif kind == "texts":
            self._pair(path, payload, "lengths", "text", 1, str)
            lens = unpack_ints(payload[0])
            if not ints_in(lens, None, packed_unsigned(payload[0])) or sum(lens) != payload[1].count("\n") + 1:
                self.fail(path, "the strings do not match their lengths")
            payload, kind = split(payload[1].split("\n"), lens), "vals"
            self._typed[path] = "strlists"
        elif kind == "bool":
            payload, kind = unpack_bools(payload), "vals"
            if payload is None:
                self.fail(path, "expected a byte of 0 or 1 a row")
            self._typed[path] = "bool"
        elif kind == "i64?":
            self._pair(path, payload, "flags", "integers")
            payload = unpack_present(unpack_mask(payload[0]), unpack_ints(payload[1]))
            if payload is None:
                self.fail(path, "the packed integers do not match their flags")
            kind = "vals"
            self._typed[path] = "int?"
        elif kind == "i64":
            unsigned, payload = packed_unsigned(payload), unpack_ints(payload)
            if payload is None:
                self.fail(path, "the packed integers are not readable")
            kind = "vals"
            self._typed[path] = "uint" if unsigned else "int"
        elif kind == "i64s":
            self._pair(path, payload, "lengths", "integers")
            unsigned, flat = packed_unsigned(payload[1]), unpack_ints(payload[1])
            lens = unpack_ints(payload[0])
            if flat is None or not ints_in(lens, None, packed_unsigned(payload[0])) or sum(lens) != len(flat):
                self.fail(path, "the packed integers do not match their lengths")
            payload, kind = split(flat, lens), "vals"
            self._typed[path] = "uints" if unsigned or not flat else "ints"
        elif kind == "refs":
            payload = unpack_ints(payload)
            if payload is None or (payload and min(payload) < -1):
                self.fail(path, "expected row numbers (or -1)")
        elif kind in ("lens", "mask"):
            if kind == "mask":
                payload = unpack_mask(payload)
            else:
                unsigned, payload = packed_unsigned(payload), unpack_ints(payload)
                payload = payload if ints_in(payload, None, unsigned) else None
            if payload is None:
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
                    self._check_links(call, f"calls[{i}]", "calls." if len(obj.calls) == 1 else None)
            else:
                self._check_links(obj, "", "")
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
        names, defaults, no_default = spec_of(cls)
        nested = NESTED.get(cls, {})
        checks = _CHECKS.get(cls, {})
        keys, cols = [], []  # in field order, as __init__ would fill __dict__
        for name in names:
            p = under(path, name)
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
                if check is not None and not typed_ok(check, self._typed.get(p)) and not bulk_ok(check, col):
                    for i, v in enumerate(col):
                        problem = check(v)
                        if problem is not None:
                            self.fail(self._name(p, i), problem)
            else:
                col = self._nested(how, p, n, name in no_default or defaults.get(name, 0) is not None,
                                   SHARED.get((cls, name)), cls)
                if col is None:
                    col = repeat(defaults[name])
            keys.append(name)
            cols.append(col)
        objs = row_maker(cls, tuple(keys))(cols, n)  # keys in field order, as __init__ would set them
        if path.endswith(SHARED_SOURCES):
            self.tables[path] = objs
        return objs

    def _build_early(self, path: str) -> None:
        """Build a trace's calls as soon as their columns are in (their nodes, tensors and storages
        came in blocks, built already), while the trace's own tables are still on their way.
        Anything wrong is left for ``result``, which builds them again and names the field in full."""
        parent, kind, cls = self._table_at(path)
        if not top_list(kind, parent):
            return
        lens = self.cols.get((path, "lens"))
        if lens is None:
            return
        try:
            self.built[path] = self._build(cls, path, sum(lens))
        except TraceFormatError:
            self.built.pop(path, None)
            return
        self._free_columns(path)

    def _build_block(self, path: str, rows: int) -> None:
        """Build the block of ``rows`` rows whose columns just came, after the blocks before it,
        and free its columns. Anything wrong is named now, by the row's place in the whole table
        (the block's own columns are gone once the next block comes)."""
        parent, kind, cls = self._table_at(path)
        if not blocked(kind, parent, cls):
            self.fail(path, "is not a table that travels in blocks")
        built = self.built.setdefault(path, [])
        table = path
        while table:  # each list above, for naming a row: calls[1].tensors[3]
            parent = table.rpartition(".")[0]
            lens = self.cols.get((table, "lens"))
            if lens is None:
                self.fail(path, "a block came before its table's row counts")
            self._where[table] = (parent, "list", list(accumulate(lens)), None)
            table = parent
        parent, how, ends, _ = self._where[path]
        total = ends[-1] if ends else 0
        if len(built) + rows > total:
            self.fail(path, f"a block of {rows} rows after {len(built)} runs past the table's {total}")
        self._where[path] = (parent, how, ends, range(len(built), len(built) + rows))
        inner = path + "."
        shared = {key: objs for key, objs in self.tables.items() if key.startswith(inner)}
        built.extend(self._build(cls, path, rows))
        if cls is NodeInfo or cls is TensorInfo:  # for checking links without walking the objects again
            self._ids.setdefault(path, []).extend(self.cols[(inner + "id", "vals")])
            if cls is NodeInfo:
                self._targets.setdefault(path, []).extend(self.cols.get((inner + "next.node", "vals"), ()))
        for key, before in shared.items():  # a shared table's rows run on across the blocks
            before.extend(self.tables[key])
            self.tables[key] = before
        self._free_columns(path)

    def _free_columns(self, path: str) -> None:
        """The columns under the table at ``path`` are in its objects now: freed while the next
        columns travel, not at the end."""
        inner = path + "."
        for key in [key for key in self.cols if key[0].startswith(inner)]:
            del self.cols[key]

    def _table_at(self, path: str) -> tuple:
        """(class of the table holding it, how, class of its objects) of the table at ``path``;
        None for each that ``path`` does not name."""
        parent, kind, cls = None, None, ROOTS[self.root]
        for part in path.split("."):
            parent = cls
            kind, cls = NESTED.get(cls, {}).get(part, (None, None))
            if cls is None:
                return None, None, None
        return parent, kind, cls

    def _nested(self, how: tuple[str, type], p: str, n: int, required: bool, shared: str | None,
                parent) -> list | None:
        """The objects of field ``p`` of a ``parent`` table, for ``n`` rows; ``shared``: the table
        (relative to the field's own table) whose objects its ``refs`` column names."""
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
            at = list(compress(range(n), mask))
            self._where[p] = (p.rpartition(".")[0], "opt", at, None)
            return spread(self._build(sub, p, len(at)), at, n)
        lens = self._take(p, "lens", n)
        self._where[p] = (p.rpartition(".")[0], "list", list(accumulate(lens)), None)
        total = sum(lens)
        early = self.built.get(p)  # kept: a failed build of the table above may need it again
        if early is not None and len(early) == total and kind == "list":
            return split(early, lens)
        if early is not None and blocked(kind, parent, sub):  # its blocks' columns are gone
            self.fail(p, f"expected {total} rows in its blocks, got {len(early)}")
        if kind == "list":
            return split(self._build(sub, p, total), lens)
        if kind == "list?":
            return split(self._unmask(sub, p, total), lens)
        keys = self._take(p + "#keys", "vals", total)
        if not set(map(type, keys)) <= {str}:
            self.fail(self._name(p, 0), "expected string keys")
        if kind == "map":
            if (p, "refs") in self.cols:
                if not shared:
                    self.fail(self._name(p, 0), "has no table its rows could refer to")
                values = self._shared(sub, p, total, under(p.rpartition(".")[0], shared))
            else:
                values = self._build(sub, p, total)
        else:
            items = p + "#items"
            inner = self._take(items, "lens", total)
            self._where[items] = (p, "list", list(accumulate(inner)), None)
            values = split(self._unmask(sub, items, sum(inner)), inner)
        return list(map(dict, map(zip, split(keys, lens), split(values, lens))))

    def _shared(self, sub, p: str, total: int, source: str) -> list:
        """Rows given as row numbers into the table at ``source`` (-1: a row of this table's own)."""
        refs = self._take(p, "refs", total)
        objs = self.tables.get(source)
        if objs is None or (refs and max(refs) >= len(objs)):
            self.fail(self._name(p, 0), f"refers to rows that '{source}' does not have")
        own_rows = list(compress(range(total), map((-1).__eq__, refs)))
        parent, how, ends, _ = self._where[p]
        self._where[p] = (parent, how, ends, own_rows)
        rows = list(map(objs.__getitem__, refs))
        for i, obj in zip(own_rows, self._build(sub, p, len(own_rows))):
            rows[i] = obj
        return rows

    def _unmask(self, sub, p: str, total: int) -> list:
        mask = self._take(p, "mask", total)
        parent, how, ends, _ = self._where[p]
        at = list(compress(range(total), mask))
        self._where[p] = (parent, how, ends, at)
        return spread(self._build(sub, p, len(at)), at, total)

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

    def _check_links(self, call: CallInfo, where: str, tables: str | None) -> None:
        """``check_links`` of ``call``; first, where the call's columns are all there is in
        ``tables`` (a call alone, or a trace's one call), from the id columns the blocks left:
        sets of strings in one list each, not 50,000 objects and their edges walked again after
        the last column came. The walk runs only to name what is wrong."""
        if tables is not None:
            ids, tensor_ids = self._ids.get(tables + "nodes"), self._ids.get(tables + "tensors", [])
            if ids is not None and len(ids) == len(call.nodes) and len(tensor_ids) == len(call.tensors):
                known = set(ids)
                if len(known) == len(ids) and len(set(tensor_ids)) == len(tensor_ids) \
                        and known.issuperset(call.roots) and known.issuperset(self._targets[tables + "nodes"]):
                    return
        check_links(call, f"{where}." if where else "", self.fail)


def decode(data: bytes, source: str = "trace") -> Trace | CallInfo:
    reader = ColumnReader(source)
    for line in data.splitlines():
        if line.strip():
            reader.feed(line)
    return reader.result()
