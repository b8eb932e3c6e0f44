"""The trace's JSON round trip: dataclasses to plain dicts, and back with every field checked.

``Trace.to_dict`` (core.model.trace) writes a trace; ``trace_from_dict``, ``trace_from_json`` and
``load_trace`` here read one back (this module imports core.model.trace, never the reverse). Reading is
hand-written rather than a schema library's: a first pass trusts the data and fills each frozen
dataclass's ``__dict__`` directly (several times faster on a 50,000-node trace); anything odd
makes it start over in careful mode, which checks every field and names the first bad one in
a ``TraceFormatError``. The format is described in ``docs/trace-format.md``.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, fields
from itertools import chain
from operator import attrgetter
from pathlib import Path
from typing import Any, Callable

from core.model.trace import (FORMAT, VERSION, CallInfo, Edge, ErrorInfo, GradInfo, MemorySample, NodeInfo, Saved,
                              Stale, StorageInfo, TensorInfo, Trace, TraceFormatError, Values, _fast_spec, _plain,
                              paused_gc)
from core.model.trace_checks import (MAX_CALL_COUNT, MAX_FILE_BYTES, MAX_MEMORY_SAMPLES, check_call, check_trace,
                                     kept_samples, size_problem)

# -- reading -------------------------------------------------------------------------------


class _Retry(Exception):
    """The fast pass met something wrong: read again carefully to name the field."""


class _Reader:
    """Builds dataclasses from dicts, naming the path of any field that is wrong.

    A first pass trusts the data (no per-field checks, no path strings), which reads a
    50,000-node trace several times faster; anything odd makes it start over in careful mode,
    which checks every field and names the first bad one.
    """

    def __init__(self, source: str, careful: bool = False, whole: bool = False):
        self.source = source
        self.careful = careful
        # A file opened whole (not a call streamed from a run): the invariants of
        # core.model.trace_checks are checked too, and long memory records thinned.
        self.whole = whole
        self.notes: list[str] = []

    def fail(self, path: str, what: str) -> None:
        if not self.careful:
            raise _Retry()
        raise TraceFormatError(f"{self.source}: field '{path}': {what}")

    def build(self, cls, data: Any, path: str):
        if not isinstance(data, dict):
            self.fail(path, f"expected an object, got {type(data).__name__}")
        required, known = _field_spec(cls)
        for name in required:
            if name not in data:
                self.fail(f"{path}.{name}" if path else name, "missing")
        if all(k in known for k in data):
            return dict(data)
        return {k: v for k, v in data.items() if k in known}

    def obj(self, cls, data: Any, path: str, nested: dict[str, Any] | None = None):
        if not self.careful:
            if type(data) is not dict:
                raise _Retry()
            required, known, defaults, factories = _fast_spec(cls)
            if not (data.keys() <= known and required <= data.keys()):
                raise _Retry()
            checks = _CHECKS.get(cls)
            if checks is not None:
                for key, value in data.items():
                    check = checks.get(key)
                    if check is not None and check(value) is not None:
                        raise _Retry()
            # Frozen dataclasses set each field through object.__setattr__ in __init__, the
            # main cost of reading big traces; the fields were just checked, so fill __dict__.
            made = cls.__new__(cls)
            values = made.__dict__
            values.update(defaults)
            for name, factory in factories:
                values[name] = factory()
            values.update(data)
            if nested:
                for key, conv in nested.items():
                    value = values.get(key)
                    if value is not None:
                        values[key] = conv(value, path)
            return made
        kwargs = self.build(cls, data, path)
        checks = _CHECKS.get(cls, {})
        for key, value in kwargs.items():
            check = checks.get(key)
            problem = check(value) if check is not None else None
            if problem is not None:
                self.fail(f"{path}.{key}" if path else key, problem)
        for key, conv in (nested or {}).items():
            if key in kwargs and kwargs[key] is not None:
                kwargs[key] = conv(kwargs[key], f"{path}.{key}")
        try:
            return cls(**kwargs)
        except TypeError as exc:
            self.fail(path, str(exc))

    def lst(self, conv, data: Any, path: str) -> list:
        if not isinstance(data, list):
            self.fail(path, f"expected a list, got {type(data).__name__}")
        if not self.careful:
            return [conv(item, path) for item in data]
        return [conv(item, f"{path}[{i}]") for i, item in enumerate(data)]

    # converters
    def values(self, d, p):
        return self.obj(Values, d, p)

    def grad(self, d, p):
        return self.obj(GradInfo, d, p, {"values": self.values})

    def tensor(self, d, p):
        t = self.obj(TensorInfo, d, p, {"values": self.values, "grad": self.grad})
        if not isinstance(t.id, str):
            self.fail(f"{p}.id", "expected a string id")
        return t

    def error(self, d, p):
        return self.obj(ErrorInfo, d, p)

    def edge(self, d, p):
        if d is None:
            return None
        return self.obj(Edge, d, p)

    def saved(self, d, p):
        return self.obj(Saved, d, p)

    def stale(self, d, p):
        return self.obj(Stale, d, p)

    def node(self, d, p):
        n = self.obj(
            NodeInfo,
            d,
            p,
            {
                "next": lambda v, q: self.lst(self.edge, v, q),
                "saved": lambda v, q: self.lst(self.saved, v, q),
                "stale": self.stale,
            },
        )
        if not isinstance(n.id, str):
            self.fail(f"{p}.id", "expected a string id")
        return n

    def storage(self, d, p):
        return self.obj(StorageInfo, d, p)

    def call(self, d, p):
        c = self.obj(
            CallInfo,
            d,
            p,
            {
                "nodes": lambda v, q: self.lst(self.node, v, q),
                "tensors": lambda v, q: self.lst(self.tensor, v, q),
                "storages": lambda v, q: self.lst(self.storage, v, q),
                "error": self.error,
                "leaf_grads": self.value_map,
                "edge_grads": self.grad_lists,
            },
        )
        check_links(c, f"{p}.", self.fail)
        if self.whole:
            check_call(c, f"{p}.", self.fail)
        return c

    def value_map(self, d, p):
        if not isinstance(d, dict):
            self.fail(p, f"expected an object, got {type(d).__name__}")
        return {k: self.values(v, f"{p}.{k}") for k, v in d.items()}

    def grad_lists(self, d, p):
        if not isinstance(d, dict):
            self.fail(p, f"expected an object, got {type(d).__name__}")
        return {k: self.lst(lambda v, q: None if v is None else self.grad(v, q), v, f"{p}.{k}")
                for k, v in d.items()}

    def memory(self, d, p):
        return self.obj(MemorySample, d, p)

    def memory_list(self, d, p):
        """The memory samples; past MAX_MEMORY_SAMPLES in a file, only those ``kept_samples`` picks."""
        if not isinstance(d, list) or not self.whole or len(d) <= MAX_MEMORY_SAMPLES:
            return self.lst(self.memory, d, p)
        keep = kept_samples(d)
        self.notes = [f"memory: {len(d):,} samples, {len(keep):,} kept (evenly spread, with every peak)"]
        return [self.memory(d[i], f"{p}[{i}]") for i in keep]


_SPECS: dict[type, tuple[tuple[str, ...], frozenset[str]]] = {}


def _field_spec(cls) -> tuple[tuple[str, ...], frozenset[str]]:
    """(required field names, all field names) of a dataclass, computed once per class."""
    spec = _SPECS.get(cls)
    if spec is None:
        fs = fields(cls)
        required = tuple(f.name for f in fs if f.default is MISSING and f.default_factory is MISSING)
        spec = (required, frozenset(f.name for f in fs))
        _SPECS[cls] = spec
    return spec


# -- field types ------------------------------------------------------------------------------
# Every field is checked on read, so whatever is accepted can be summarised, laid out and
# inspected. A check returns None when the value fits, else what was expected. Fields
# without a check (added later, or free-form like ``Saved.value``) are taken as they are.


def _short(value: Any) -> str:
    text = repr(value) if isinstance(value, (str, int, float, bool, type(None))) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _t_str(v):
    return None if isinstance(v, str) else f"expected a string, got {_short(v)}"


def _t_opt_str(v):
    return None if v is None or isinstance(v, str) else f"expected a string or null, got {_short(v)}"


def _t_bool(v):
    return None if isinstance(v, bool) else f"expected true or false, got {_short(v)}"


def _t_int(v):
    return None if _is_int(v) else f"expected an integer, got {_short(v)}"


def _t_count(v):
    return None if _is_int(v) and v >= 0 else f"expected a non-negative integer, got {_short(v)}"


def _t_opt_int(v):
    return None if v is None or _is_int(v) else f"expected an integer or null, got {_short(v)}"


def _t_num(v):
    return None if _is_num(v) else f"expected a number, got {_short(v)}"


def _t_opt_num(v):
    if v is None or _is_num(v) or v in ("nan", "inf", "-inf"):
        return None
    return f"expected a number or null, got {_short(v)}"


def _t_obj(v):
    return None if isinstance(v, dict) else f"expected an object, got {_short(v)}"


def _t_opt_obj(v):
    return None if v is None or isinstance(v, dict) else f"expected an object or null, got {_short(v)}"


def _t_list(v):
    return None if isinstance(v, list) else f"expected a list, got {_short(v)}"


def _t_shape(v):
    if not isinstance(v, list) or not all(_is_int(x) and x >= 0 for x in v):
        return f"expected a list of non-negative integers, got {_short(v)}"
    return None


def _t_ints(v):
    if not isinstance(v, list) or not all(_is_int(x) for x in v):
        return f"expected a list of integers, got {_short(v)}"
    return None


def _t_strs(v):
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        return f"expected a list of strings, got {_short(v)}"
    return None


def _element(x) -> bool:
    if x is None or isinstance(x, (int, float, str)):  # str: "nan", "inf", a complex as text
        return True
    return isinstance(x, list) and len(x) == 2 and _is_num(x[0]) and _is_num(x[1])  # complex as [re, im]


def _t_elements(v):
    if v is None:
        return None
    if not isinstance(v, list) or not all(_element(x) for x in v):
        return f"expected a list of numbers (or their text) or null, got {_short(v)}"
    return None


def _t_edges(v):
    if not isinstance(v, list) or not all(x is None or isinstance(x, dict) for x in v):
        return f"expected a list of edges (objects or null), got {_short(v)}"
    return None


def _t_objs(v):
    if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
        return f"expected a list of objects, got {_short(v)}"
    return None


def _t_options(v):
    problem = _t_free(v)
    if problem is not None:
        return problem
    if "inputs" in v and _t_strs(v["inputs"]) is not None:
        return "'inputs': expected a list of tensor ids"
    for key, check in _OPTION_CHECKS.items():
        if key in v:
            problem = check(v[key])
            if problem is not None:
                return f"'{key}': {problem}"
    results = v.get("results")
    if results is not None:
        if not isinstance(results, list):
            return "'results': expected a list"
        for item in results:
            if not isinstance(item, dict) or _t_opt_str(item.get("tensor")) or _t_opt_obj(item.get("values")) \
                    or (item.get("values") is not None and _t_values_dict(item["values"])):
                return "'results': expected objects with 'tensor' and 'values'"
    return None


def _t_cells(v):
    if not isinstance(v, list) or not all(
            isinstance(c, dict) and all(_is_int(c.get(k)) and c.get(k) >= 0 for k in ("cell", "first", "lines"))
            for c in v):
        return f"expected a list of {{cell, first, lines}} objects of non-negative integers, got {_short(v)}"
    return None


def _t_opt_bool(v):
    return None if v is None or isinstance(v, bool) else f"expected true, false or null, got {_short(v)}"


def _t_opt_count(v):
    return None if v is None or (_is_int(v) and v >= 0) else f"expected a non-negative integer or null, got {_short(v)}"


def _t_call_count(v):
    if _is_int(v) and 0 <= v <= MAX_CALL_COUNT:
        return None
    return f"expected a count of calls from 0 to {MAX_CALL_COUNT:,}, got {_short(v)}"


def _t_opt_strs(v):
    return None if v is None else _t_strs(v)


def _t_str_map(v):
    if not isinstance(v, dict) or not all(isinstance(x, str) for x in v.values()):
        return f"expected an object of strings, got {_short(v)}"
    return None


def _entries(v, required: dict, optional: dict, what: str):
    """None when ``v`` is null or a list of objects whose keys pass the given checks, else what was expected."""
    if v is None:
        return None
    if isinstance(v, list):
        for x in v:
            if not isinstance(x, dict) or any(k not in x or check(x[k]) for k, check in required.items()) \
                    or any(k in x and check(x[k]) for k, check in optional.items()):
                break
        else:
            return None
    return f"expected null or a list of {what}, got {_short(v)}"


def _t_pair(check):
    return lambda v: None if isinstance(v, list) and len(v) == 2 and not any(map(check, v)) else "a pair"


def _t_cuts(v):
    return _entries(v, {"input": _t_count}, {"cause": _t_opt_str, "name": _t_opt_str, "value": _t_opt_str},
                    "{input, cause, name, value} objects")


def _t_marks(v):
    return _entries(v, {"input": _t_count}, {"sum": _t_pair(_t_shape), "dtype": _t_pair(_t_str)},
                    "{input, sum: [shape, shape], dtype: [from, to]} objects")


def _t_numpy(v):
    return _entries(v, {"name": _t_str, "shape": _t_shape, "strides": _t_ints, "offset": _t_int}, {"dtype": _t_str},
                    "{name, shape, strides, offset, dtype} objects")


SAVED_DEPTH = 8  # lists in lists a saved value may hold (an op's padding: a list of ints)


def _t_saved_value(v):
    if not _shallow(v, SAVED_DEPTH, dicts=False):
        return f"expected a number, a string or a list of them, nested at most {SAVED_DEPTH} deep"
    return None


FREE_DEPTH = 16  # objects and lists in a free-form field (options, seeds): writing one back recurses per level


def _shallow(v, depth: int, dicts: bool = True) -> bool:
    """``v`` nests lists (and objects, if ``dicts``) at most ``depth`` deep: walked level by level, not recursed."""
    level = [v]
    for _ in range(depth + 1):
        nested = []
        for x in level:
            if isinstance(x, list):
                nested += x
            elif isinstance(x, dict):
                if not dicts:
                    return False
                nested += x.values()
        if not nested:
            return True
        level = nested
    return False


def _t_free(v):
    if not isinstance(v, dict):
        return f"expected an object, got {_short(v)}"
    return None if _shallow(v, FREE_DEPTH) else f"expected objects and lists nested at most {FREE_DEPTH} deep"


def _t_values_dict(v):
    """A Values record as options hold it: an object with a count and checked fields."""
    if not isinstance(v, dict) or "numel" not in v:
        return "an object with 'numel'"
    checks = _CHECKS[Values]
    if any(k not in checks or checks[k](x) for k, x in v.items()):
        return "an object of Values fields"
    data, numel = v.get("data"), v["numel"]
    if data is not None and len(data) != numel:
        return f"'data' holds {len(data):,} values, but numel is {numel:,}"
    return None


def _t_call_indices(v):
    if isinstance(v, list) and all(_is_int(x) and x >= 0 for x in v):
        return None
    return f"expected a list of call indices, got {_short(v)}"


def _t_seeds(v):
    if isinstance(v, list) and all(x is None or _t_values_dict(x) is None for x in v):
        return None
    return f"expected a list of values (objects with 'numel') or nulls, got {_short(v)}"


_FAILED_INPUT = {"position": _t_count, "name": _t_opt_str, "shape": _t_shape, "dtype": _t_str,
                 "requires_grad": _t_bool, "is_leaf": _t_bool, "node": _t_opt_str}


def _t_failed_inputs(v):
    if not isinstance(v, list):
        return f"'inputs': expected a list of inputs, got {_short(v)}"
    for i, entry in enumerate(v):
        if not isinstance(entry, dict):
            return f"'inputs[{i}]': expected an object, got {_short(entry)}"
        for key, check in _FAILED_INPUT.items():
            problem = "missing" if key not in entry else check(entry[key])
            if problem is not None:
                return f"'inputs[{i}].{key}': {problem}"
        unknown = next((k for k in entry if k not in _FAILED_INPUT), None)
        if unknown is not None:
            return f"'inputs[{i}]': unknown key {_short(unknown)}"
    return None


_FAILED_OP = {"name": _t_str, "text": _t_str, "line": _t_opt_int, "inputs": _t_failed_inputs}


def _failed_op(v, extra: dict, what: str):
    """A failed op's record (``core.model.forward_errors``): every key known, each of its type."""
    if v is None and "call" in extra:
        return None
    if not isinstance(v, dict):
        return f"expected {what}, got {_short(v)}"
    for key, check in _FAILED_OP.items():
        if key not in v:
            return f"'{key}' missing"
        problem = check(v[key])
        if problem is not None:
            return problem if key == "inputs" else f"'{key}': {problem}"
    for key, value in v.items():
        if key in _FAILED_OP:
            continue
        check = extra.get(key)
        if check is None:
            return f"unknown key {_short(key)}"
        problem = check(value)
        if problem is not None:
            return f"'{key}': {problem}"
    missing = [k for k in ("type", "message") if k in extra and k not in v]
    return f"'{missing[0]}' missing" if missing else None


def _t_norm(v) -> bool:
    return v is None or _is_num(v) or v in ("nan", "inf")


def _t_grad_norms(v):
    """``CallInfo.grad_norms``: null, or {"params": {name: {"module", "grad", "param", "ratio"[, "added"]}},
    "modules": {path: norm}}; a norm is a number, null, "nan" or "inf"."""
    if v is None:
        return None
    if not isinstance(v, dict) or set(v) != {"params", "modules"} or not isinstance(v["params"], dict) \
            or not isinstance(v["modules"], dict):
        return "expected null or an object with 'params' and 'modules'"
    for name, p in v["params"].items():
        if not isinstance(p, dict) or not {"module", "grad", "param", "ratio"} <= p.keys() \
                or not p.keys() <= {"module", "grad", "param", "ratio", "added"} or not isinstance(p["module"], str) \
                or not all(_t_norm(p[k]) for k in p if k != "module"):
            return f"'params.{name}': expected {{module, grad, param, ratio[, added]}} with numbers"
    if not all(isinstance(k, str) and _t_norm(n) for k, n in v["modules"].items()):
        return "'modules': expected module paths with numbers"
    return None


_EVENT_FIELDS = {"clip_grad_norm_": {"max_norm", "norm_type", "total_norm", "clip_coef", "norm_after", "params"},
                 "clip_grad_value_": {"clip_value", "total_norm", "norm_after", "params"},
                 "clip_grads_with_norm_": {"max_norm", "total_norm", "clip_coef", "norm_after", "params"},
                 "get_total_norm": {"norm_type", "total_norm", "tensors"},
                 "optimizer.step": {"optimizer", "update"}, "zero_grad": set(),
                 "scaler.step": {"optimizer", "scale", "skipped", "scale_after"}}


def _t_grad_events(v):
    """``Trace.grad_events``: a list of {"kind", "after_call", "line", ...the kind's own fields}."""
    if not isinstance(v, list):
        return f"expected a list, got {_short(v)}"
    for i, e in enumerate(v):
        own = _EVENT_FIELDS.get(e.get("kind")) if isinstance(e, dict) else None
        if own is None or set(e) != {"kind", "after_call", "line"} | own:
            return f"[{i}]: expected an event with 'kind' (one of {', '.join(_EVENT_FIELDS)}), 'after_call', " \
                   "'line' and that kind's fields"
        if _t_opt_int(e["after_call"]) or _t_opt_int(e["line"]):
            return f"[{i}]: 'after_call' and 'line' must be integers or null"
        if e["kind"] == "optimizer.step":
            if not isinstance(e["optimizer"], str) or not isinstance(e["update"], dict) \
                    or not all(isinstance(k, str) and _t_norm(n) for k, n in e["update"].items()):
                return f"[{i}]: 'update' must map module paths to numbers"
        elif e["kind"] == "scaler.step":
            if not isinstance(e["optimizer"], str) or not isinstance(e["skipped"], bool) \
                    or not _is_num(e["scale"]) or not (e["scale_after"] is None or _is_num(e["scale_after"])):
                return f"[{i}]: a scaler step has an 'optimizer' name, a 'scale', 'skipped' (true or false) " \
                       "and a 'scale_after' (a number or null)"
        elif not all(_t_norm(e[k]) for k in own):
            return f"[{i}]: {', '.join(sorted(own))} must be numbers"
    return None


def _scalar(v) -> bool:
    return _is_num(v) or v in ("nan", "inf", "-inf")


def _t_scalars(v):
    """``CallInfo.scalars``: null, or {"loss": a number or null, "values": {name: [numbers]}, "grads": {...}};
    a number may be "nan", "inf" or "-inf" (a diverging loop's)."""
    if v is None:
        return None
    if not isinstance(v, dict) or set(v) - {"loss", "values", "grads"}:
        return f"expected null or an object with 'loss', 'values' and 'grads', got {_short(v)}"
    if v.get("loss") is not None and not _scalar(v["loss"]):
        return "'loss' must be a number or null"
    for key in ("values", "grads"):
        part = v.get(key, {})
        if not isinstance(part, dict) or not all(
                isinstance(k, str) and isinstance(x, list) and all(_scalar(n) for n in x)
                for k, x in part.items()):
            return f"'{key}' must map names to lists of numbers"
    return None


def _t_error_failed_op(v):
    return _failed_op(v, {"call": _t_opt_str, "where": _t_str}, "null or a failed op's record")


def _t_call_failed_op(v):
    return _failed_op(v, {"type": _t_str, "message": _t_str, "where": _t_str}, "a failed op's record")


# The options views read (core.model.call_notes, core.model.values, the layout's folded boxes, the
# failed-op mark).
_OPTION_CHECKS = {"grad_before": _t_str_map, "module_classes": _t_str_map, "inside": _t_str, "nested_in": _t_opt_int,
                  "nested": _t_call_indices, "seed": _t_seeds, "failed_op": _t_call_failed_op}


_CHECKS: dict[type, dict[str, Any]] = {
    ErrorInfo: {"type": _t_str, "message": _t_str, "line": _t_opt_int, "traceback": _t_str, "kind": _t_str,
                "file": _t_opt_str, "fault": _t_str, "where": _t_str, "reason": _t_str,
                "failed_op": _t_error_failed_op},
    Values: {"numel": _t_count, "data": _t_elements, "sample": _t_elements, "min": _t_opt_num,
             "max": _t_opt_num, "mean": _t_opt_num, "approx": _t_bool},
    GradInfo: {"shape": _t_shape, "values": _t_obj, "norm": _t_opt_num},
    TensorInfo: {"id": _t_str, "name": _t_opt_str, "shape": _t_shape, "dtype": _t_str, "device": _t_str,
                 "requires_grad": _t_bool, "is_leaf": _t_bool, "retains_grad": _t_bool, "stride": _t_shape,
                 "storage_offset": _t_count, "storage": _t_opt_str, "version": _t_int, "values": _t_obj,
                 "grad": _t_opt_obj, "base": _t_opt_str, "is_view": _t_bool, "grad_fn": _t_opt_str,
                 "grad_fn_name": _t_opt_str, "element_size": _t_count, "nbytes": _t_count, "origin": _t_opt_str,
                 "output_nr": _t_opt_count, "hooks": _t_opt_strs},
    Edge: {"node": _t_str, "input_nr": _t_count},
    Saved: {"name": _t_str, "tensor": _t_opt_str, "freed": _t_bool, "value": _t_saved_value},
    Stale: {"saved": _t_str, "saved_version": _t_opt_int, "version": _t_opt_int, "message": _t_str,
            "op_line": _t_opt_int, "op": _t_opt_str},
    NodeInfo: {"id": _t_str, "name": _t_str, "kind": _t_str, "next": _t_edges, "saved": _t_objs,
               "variable": _t_opt_str, "tensor": _t_opt_str, "label": _t_opt_str, "line": _t_opt_int,
               "module": _t_opt_str, "stale": _t_opt_obj, "device": _t_opt_str, "inplace": _t_opt_str,
               "cuts": _t_cuts, "edge_marks": _t_marks, "recomputed": _t_opt_bool,
               "seq": _t_opt_count, "created": _t_opt_num},
    StorageInfo: {"id": _t_str, "nbytes": _t_count, "device": _t_str, "tensors": _t_strs, "numpy": _t_numpy},
    CallInfo: {"id": _t_str, "index": _t_count, "api": _t_str, "line": _t_opt_int, "roots": _t_strs,
               "nodes": _t_objs, "tensors": _t_objs, "error": _t_opt_obj, "storages": _t_objs,
               "options": _t_options, "snapshot": _t_str, "same_as": _t_opt_str, "structure": _t_str,
               "node_count": _t_count, "edge_count": _t_count, "leaf_grads": _t_obj, "duration_s": _t_num,
               "edge_grads": _t_obj, "grad_norms": _t_grad_norms, "scalars": _t_scalars},
    MemorySample: {"t": _t_num, "device": _t_str, "allocated": _t_count, "reserved": _t_count, "rss": _t_count,
                   "saved_bytes": _t_count, "phase": _t_str, "max_allocated": _t_count, "mark": _t_str,
                   "where": _t_str, "kept_bytes": _t_count, "kept_in": _t_str,
                   "call": _t_opt_int},
    Trace: {"calls": _t_objs, "error": _t_opt_obj, "script": _t_str, "source": _t_str, "device": _t_str,
            "mode": _t_str, "output": _t_str, "duration_s": _t_num, "torch_version": _t_str,
            "call_count": _t_call_count, "tensors": _t_objs, "storages": _t_objs, "memory": _t_objs,
            "format": _t_str, "version": _t_count, "cells": _t_cells, "seeds": _t_free,
            "grad_events": _t_grad_events},
}


# The NaN/Inf check's record (``Trace.nan_check``): every key present, each of its type.
_NAN_COUNTS = {"shape": _t_shape, "numel": _t_count, "nan": _t_count, "posinf": _t_count, "neginf": _t_count}
_NAN_INPUT = {"position": _t_count, "name": _t_opt_str, "shape": _t_shape, "dtype": _t_str, "min": _t_opt_num,
              "max": _t_opt_num}
_NAN_FORWARD = {"op": _t_str, "text": _t_str, "line": _t_opt_int, "module": _t_opt_str, "output": _t_count,
                **_NAN_COUNTS, "inputs": _t_list, "call": _t_opt_str, "node": _t_opt_str}
_NAN_BACKWARD = {"call": _t_str, "node": _t_str, "name": _t_str, "line": _t_opt_int, "module": _t_opt_str,
                 "input": _t_count, "to": _t_opt_str, **_NAN_COUNTS}


def _exact_keys(v, checks: dict, what: str):
    """None when ``v`` is an object with exactly the keys of ``checks``, each passing its check."""
    if not isinstance(v, dict):
        return f"expected {what}, got {_short(v)}"
    if set(v) != set(checks):
        odd = sorted(set(v) ^ set(checks))[0]
        return f"'{odd}' {'missing' if odd in checks else 'is not a key of ' + what}"
    for key, check in checks.items():
        problem = check(v[key])
        if problem is not None:
            return f"'{key}': {problem}"
    return None


def _t_nan_check(v):
    if v is None:
        return None
    problem = _exact_keys(v, {"forward": _t_opt_obj, "backward": _t_opt_obj}, "the NaN/Inf check's record")
    if problem is not None:
        return problem
    if v["forward"] is not None:
        problem = _exact_keys(v["forward"], _NAN_FORWARD, "a forward op's record")
        if problem is not None:
            return f"'forward': {problem}"
        for i, entry in enumerate(v["forward"]["inputs"]):
            problem = _exact_keys(entry, _NAN_INPUT, "an input's record")
            if problem is not None:
                return f"'forward.inputs[{i}]': {problem}"
    if v["backward"] is not None:
        problem = _exact_keys(v["backward"], _NAN_BACKWARD, "a backward node's record")
        if problem is not None:
            return f"'backward': {problem}"
    return None


_CHECKS[Trace]["nan_check"] = _t_nan_check


def call_to_dict(call: CallInfo) -> dict:
    """One call in the trace format (the ``calls`` entry), JSON-ready."""
    with paused_gc():
        return _plain(call)


def call_from_dict(data: Any, source: str = "call") -> CallInfo:
    """One call from its trace-format dict, raising TraceFormatError that names the bad field.

    A CallInfo (read from columns on the wire) is returned as it is, and a TraceFormatError
    (what reading those columns raised) is raised here, where the call is read."""
    if isinstance(data, CallInfo):
        return data
    if isinstance(data, TraceFormatError):
        raise data
    trace = trace_from_dict({"format": FORMAT, "version": VERSION, "calls": [data]}, source)
    return trace.calls[0]


def trace_from_dict(data: Any, source: str = "trace") -> Trace:
    """Build a Trace from decoded JSON, raising TraceFormatError that names the bad field.

    A Trace (read from columns on the wire) is returned as it is; a TraceFormatError is raised."""
    if isinstance(data, Trace):
        return data
    if isinstance(data, TraceFormatError):
        raise data
    return _read_checked(data, source, whole=False)


def _read_checked(data: Any, source: str, whole: bool) -> Trace:
    with paused_gc():
        try:
            return _read(data, _Reader(source, whole=whole))
        except _Retry:
            return _read(data, _Reader(source, careful=True, whole=whole))


def load_notes(trace: Trace) -> list[str]:
    """What opening the file changed, to tell the person who opened it (samples thinned)."""
    return list(trace.__dict__.get("_load_notes", ()))


def trace_from_json(text: str, source: str = "trace") -> Trace:
    """A Trace from the text of a trace file; a TraceFormatError names what is wrong, ``source`` first.

    A file is checked whole (``core.model.trace_checks``): ids, cycles, values against shapes,
    views against storages, and the sizes the app opens."""
    if not text.strip():
        raise TraceFormatError(f"{source}: the file is empty")
    try:
        with paused_gc():
            data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(
            f"{source}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            "the file may be truncated"
        ) from None
    except RecursionError:
        raise TraceFormatError(f"{source}: JSON nested too deeply to be a trace") from None
    except ValueError as exc:  # e.g. an integer of thousands of digits
        raise TraceFormatError(f"{source}: not readable JSON: {exc}") from None
    if isinstance(data, dict):
        problem = size_problem(data)
        if problem is not None:
            raise TraceFormatError(f"{source}: {problem}")
    return _read_checked(data, source, whole=True)


def load_trace(path: str | Path) -> Trace:
    """The trace saved at ``path`` (``Trace.save``); a TraceFormatError says why it cannot be read."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:  # decoded, JSON takes 5-10 times its size in memory
            raise TraceFormatError(f"{path}: {size / 2 ** 20:,.0f} MiB; Backprop Studio opens trace files of up to "
                                   f"{MAX_FILE_BYTES // 2 ** 20:,} MiB")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"{path}: cannot read: {exc}") from None
    except MemoryError:
        raise TraceFormatError(f"{path}: too big to read") from None
    return trace_from_json(text, str(path))


def _read(data: Any, r: "_Reader") -> Trace:
    source = r.source
    if not isinstance(data, dict):
        r.fail("", f"expected a JSON object at the top level, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        r.careful = True
        r.fail("format", f"expected '{FORMAT}', got {_short(data.get('format'))}: not a Backprop Studio trace")
    version = data.get("version")
    if type(version) is not int or version < 1:
        r.careful = True
        r.fail("version", f"expected a positive integer, got {_short(version)}")
    if version > VERSION:
        raise TraceFormatError(
            f"{source}: field 'version': trace version {_short(version)} is newer than this Backprop Studio reads "
            f"(version {VERSION}); update Backprop Studio to open it"
        )
    trace = r.obj(
        Trace,
        data,
        "",
        {
            "calls": lambda v, q: r.lst(r.call, v, q.lstrip(".")),
            "error": lambda v, q: r.error(v, q.lstrip(".")),
            "tensors": lambda v, q: r.lst(r.tensor, v, q.lstrip(".")),
            "storages": lambda v, q: r.lst(r.storage, v, q.lstrip(".")),
            "memory": lambda v, q: r.memory_list(v, q.lstrip(".")),
        },
    )
    if r.whole:
        check_trace(trace, r.fail)
    if r.notes:
        trace.__dict__["_load_notes"] = r.notes  # "_": never written back to a file
    return trace


def check_links(call: CallInfo, prefix: str, fail: Callable[[str, str], None]) -> None:
    """Ids are unique and every root and edge names a node of ``call``; ``fail(path, what)`` is
    called on the first that is not (``prefix`` leads each path, e.g. ``"calls[0]."``). Whole
    columns are checked at once; rows are walked only to name the field that is wrong."""
    ids = set(map(attrgetter("id"), call.nodes))
    if len(ids) != len(call.nodes):
        seen: set = set()
        for i, node in enumerate(call.nodes):
            if node.id in seen:
                fail(f"{prefix}nodes[{i}].id", f"node id '{node.id}' appears twice")
            seen.add(node.id)
    if len(set(map(attrgetter("id"), call.tensors))) != len(call.tensors):
        seen = set()
        for i, t in enumerate(call.tensors):
            if t.id in seen:
                fail(f"{prefix}tensors[{i}].id", f"tensor id '{t.id}' appears twice")
            seen.add(t.id)
    for i, root in enumerate(call.roots):
        if root not in ids:
            fail(f"{prefix}roots[{i}]", f"node '{root}' is not in the call's nodes")
    targets = set(map(attrgetter("node"), filter(None, chain.from_iterable(map(attrgetter("next"), call.nodes)))))
    if not targets <= ids:
        for i, node in enumerate(call.nodes):
            for j, e in enumerate(node.next):
                if e is not None and e.node not in ids:
                    fail(f"{prefix}nodes[{i}].next[{j}]", f"node '{e.node}' is not in the call's nodes")
