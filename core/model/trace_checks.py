"""What a trace file must hold beyond each field's type, checked when a file is opened.

``core.model.trace_json`` checks each field as it reads it; what is checked here needs several
fields or records at once: ids that name nodes and tensors of the call, a graph without cycles
(autograd's never has one), values as many as their count says, views inside their storages,
strides one per dimension. Each check calls ``fail(path, what)`` on the first problem, the path naming
the field as ``calls[0].nodes[3].next[0]``; a file that passes can be shown by every view.

The sizes the app opens are here too: files of ``MAX_FILE_BYTES``, ``MAX_CALL_NODES`` nodes (and
``MAX_CALL_TENSORS`` tensors) in one call, refused above before anything is built; past ``MAX_MEMORY_SAMPLES``
memory samples, ``kept_samples`` picks the ones kept (evenly spread, each stretch's peaks kept).
"""

from __future__ import annotations

import graphlib
from itertools import repeat
from math import prod
from operator import attrgetter
from typing import Any, Callable, Sequence

from core.model.trace import CallInfo, GradInfo, StorageInfo, TensorInfo, Trace, Values

# A 200,000-node call takes about 6 s to read and 0.5 GB on a shared 2-core machine (bench/big_traces.py);
# a 1,000,000-node one took over 180 s before this limit.
MAX_CALL_NODES = 200_000
MAX_CALL_TENSORS = 400_000  # a node saves a tensor or two: twice the nodes
MAX_MEMORY_SAMPLES = 100_000  # 33 minutes at 50 Hz; more are thinned on opening
# A trace file's bytes, read before anything is decoded: a fan-in of 1,000,000 leaves is 324 MiB,
# a 200,000-node chain 27 MiB and the 50,000-node example 51 MiB.
MAX_FILE_BYTES = 512 * 2 ** 20
MAX_CALL_COUNT = 2 ** 31 - 1  # Qt's spin boxes (the memory panel's call picker) count to this
MAX_BYTES = 2 ** 62  # past it, a storage index no longer fits the 64-bit integers views compute in

Fail = Callable[[str, str], None]


def _id(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _missing(kind: str, value: Any, owner: str = "this call") -> str:
    return f"names {kind} '{_id(value)}', which {owner} does not have"


# -- values ----------------------------------------------------------------------------------


def check_values(v: Values, path: str, fail: Fail) -> None:
    """``data`` holds ``numel`` values and ``sample`` at most that many. (``numel`` need not be the
    shape's product: a nested tensor's shape is its padded one.)"""
    if v.data is not None and len(v.data) != v.numel:
        fail(f"{path}.data", f"holds {len(v.data):,} values, but numel is {v.numel:,}")
    if v.sample is not None and len(v.sample) > v.numel:
        fail(f"{path}.sample", f"holds {len(v.sample):,} values, more than numel ({v.numel:,})")


def check_grad(g: GradInfo, path: str, fail: Fail) -> None:
    check_values(g.values, f"{path}.values", fail)


# -- tensors ---------------------------------------------------------------------------------


def check_tensors(tensors: Sequence[TensorInfo], storages: Sequence[StorageInfo], prefix: str, fail: Fail,
                  node_ids: set | None = None) -> None:
    """Each tensor of ``tensors`` (``prefix`` names the list, e.g. ``calls[0].tensors``): a stride per
    dimension, values of its shape, every element inside its storage, and ``grad_fn`` (when
    ``node_ids`` is given) and ``base`` naming what exists."""
    by_id = {s.id: s for s in storages}
    ids = set(map(attrgetter("id"), tensors))
    for i, t in enumerate(tensors):
        p = f"{prefix}[{i}]"
        shape, stride = t.shape, t.stride
        numel = prod(shape)
        # A sparse or strided nested tensor has no strides (and no storage the capture can name);
        # a tensor whose shape could not be read is recorded with shape [].
        if len(stride) != len(shape) and (stride or t.storage is not None) and shape:
            fail(f"{p}.stride", f"has {len(stride)} entries for the {len(shape)} dimensions of shape {_id(shape)}")
        check_values(t.values, f"{p}.values", fail)
        if t.grad is not None:
            check_grad(t.grad, f"{p}.grad", fail)
        if numel and len(stride) == len(shape):
            size = max(t.element_size, 1)
            end = (t.storage_offset + sum((n - 1) * s for n, s in zip(shape, stride)) + 1) * size
            field = "storage_offset" if (t.storage_offset + 1) * size > MAX_BYTES else "stride"
            if end > MAX_BYTES:
                fail(f"{p}.{field}", f"puts the last element at byte {end:,}, past any storage")
            info = by_id.get(t.storage) if t.storage is not None else None
            nbytes = info.nbytes if info is not None else t.nbytes if t.storage is not None else 0
            if nbytes and end > nbytes:  # 0: not recorded, or a storage resized to nothing
                field = "storage_offset" if t.storage_offset * size >= nbytes else "stride"
                fail(f"{p}.{field}", f"the view reaches byte {end:,} of storage '{_id(t.storage)}', "
                                     f"which holds {nbytes:,} bytes")
        if node_ids is not None and t.grad_fn is not None and t.grad_fn not in node_ids:
            fail(f"{p}.grad_fn", _missing("node", t.grad_fn))
        if t.base is not None and t.base not in ids:
            fail(f"{p}.base", _missing("tensor", t.base, "this list of tensors"))


# -- one call --------------------------------------------------------------------------------


def check_call(call: CallInfo, prefix: str, fail: Fail) -> None:
    """Everything of ``call`` beyond its fields' types and ``check_links`` (ids unique, roots and
    edges naming nodes): ``prefix`` leads each path, e.g. ``"calls[0]."``."""
    node_ids = set(call.node_map())
    tensor_ids = set(call.tensor_map())
    check_tensors(call.tensors, call.storages, f"{prefix}tensors", fail, node_ids)
    for i, n in enumerate(call.nodes):
        p = f"{prefix}nodes[{i}]"
        if n.variable is not None and n.variable not in tensor_ids:
            fail(f"{p}.variable", _missing("tensor", n.variable))
        if n.tensor is not None and n.tensor not in tensor_ids:
            fail(f"{p}.tensor", _missing("tensor", n.tensor))
        for j, s in enumerate(n.saved):
            if s.tensor is not None and s.tensor not in tensor_ids:
                fail(f"{p}.saved[{j}].tensor", _missing("tensor", s.tensor))
        for k, cut in enumerate(n.cuts or ()):
            at = cut["input"]
            if at >= len(n.next):
                fail(f"{p}.cuts[{k}].input", f"is {at}, but the node has {len(n.next)} inputs")
            if n.next[at] is not None:
                fail(f"{p}.cuts[{k}].input", f"input {at} leads to node '{_id(n.next[at].node)}': "
                                             "a cut marks an input that gets no gradient")
        for k, mark in enumerate(n.edge_marks or ()):
            if mark["input"] >= len(n.next):
                fail(f"{p}.edge_marks[{k}].input", f"is {mark['input']}, but the node has {len(n.next)} inputs")
    nodes = call.node_map()
    for key, grads in call.edge_grads.items():
        node = nodes.get(key)
        if node is None:
            fail(f"{prefix}edge_grads.{_id(key)}", _missing("node", key))
        elif len(grads) > len(node.next):
            fail(f"{prefix}edge_grads.{_id(key)}", f"holds {len(grads)} gradients for the {len(node.next)} "
                                                   f"inputs of node '{_id(key)}'")
        for j, g in enumerate(grads):
            if g is not None:
                check_grad(g, f"{prefix}edge_grads.{_id(key)}[{j}]", fail)
    for name, values in call.leaf_grads.items():
        check_values(values, f"{prefix}leaf_grads.{_id(name)}", fail)
    failed = (call.options or {}).get("failed_op")
    if failed is not None:
        check_failed_inputs(failed, call, f"{prefix}options.failed_op", fail)
    check_acyclic(call, prefix, fail)


def check_failed_inputs(op: dict, call: CallInfo, path: str, fail: Fail) -> None:
    """Each input of a failed op (``core.model.forward_errors``) names a node of ``call``, or none."""
    node_ids = call.node_map()
    for k, entry in enumerate(op["inputs"]):
        if entry["node"] is not None and entry["node"] not in node_ids:
            fail(f"{path}.inputs[{k}].node", _missing("node", entry["node"], f"call '{_id(call.id)}'"))


def check_acyclic(call: CallInfo, prefix: str, fail: Fail) -> None:
    """A backward graph has no cycle: name the edge that closes one.

    Edges that all lead to later nodes (a chain, a tree) prove it at once; otherwise the
    standard library's topological sorter decides and names a cycle's nodes."""
    index = {n.id: i for i, n in enumerate(call.nodes)}
    if all(index[e.node] > i for i, n in enumerate(call.nodes) for e in n.next if e is not None):
        return
    sorter = graphlib.TopologicalSorter({n.id: [e.node for e in n.next if e is not None] for n in call.nodes})
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        # Each node of the cycle is a next function of the one after it: gradients flow back along it.
        cycle = list(reversed(exc.args[1]))[:-1]  # the first node is repeated at the end
        # Name an edge back to a node listed earlier in the file: the one a writer most likely added.
        at = next(k for k in range(len(cycle)) if index[cycle[(k + 1) % len(cycle)]] <= index[cycle[k]])
        cycle = cycle[at:] + cycle[:at] + [cycle[at]]
        src, dst = cycle[0], cycle[1]
        i = index[src]
        j = next(k for k, e in enumerate(call.nodes[i].next) if e is not None and e.node == dst)
        loop = " → ".join(_id(x) for x in cycle[:6]) + (" → …" if len(cycle) > 6 else "")
        fail(f"{prefix}nodes[{i}].next[{j}]", f"names node '{_id(dst)}', which leads back to '{_id(src)}' "
                                              f"({loop}): a backward graph has no cycles")


# -- the whole trace -------------------------------------------------------------------------


def check_trace(trace: Trace, fail: Fail) -> None:
    """The trace's own tensors, and the calls each call names."""
    check_tensors(trace.tensors, trace.storages, "tensors", fail)
    ids: dict[str, int] = {}
    for i, call in enumerate(trace.calls):
        if call.id in ids:
            fail(f"calls[{i}].id", f"call id '{_id(call.id)}' appears twice (calls[{ids[call.id]}] has it)")
        ids[call.id] = i
    for i, call in enumerate(trace.calls):
        if call.same_as is not None and call.same_as not in ids:
            fail(f"calls[{i}].same_as", _missing("call", call.same_as, "this trace"))
    failed = trace.error.failed_op if trace.error is not None else None
    if failed is not None and failed.get("call") is not None:
        at = ids.get(failed["call"])
        if at is None:
            fail("error.failed_op.call", _missing("call", failed["call"], "this trace"))
        elif "failed_op" not in (trace.calls[at].options or {}):
            fail("error.failed_op.call", f"names call '{_id(failed['call'])}', which holds no failed op")
        else:
            check_failed_inputs(failed, trace.calls[at], "error.failed_op", fail)
    check_nan_check(trace, ids, fail)
    check_grad_events(trace, fail)


def check_grad_events(trace: Trace, fail: Fail) -> None:
    """Each clipping / optimizer event follows a call the run made."""
    for i, event in enumerate(trace.grad_events):
        after = event["after_call"]
        if after is not None and after >= max(trace.call_count, len(trace.calls)):
            fail(f"grad_events[{i}].after_call", f"names call {after}, past the {trace.call_count} calls of this run")


def check_nan_check(trace: Trace, ids: dict[str, int], fail: Fail) -> None:
    """The NaN/Inf check's records name calls of this trace, and nodes of those calls kept in full."""
    for part in ("forward", "backward"):
        record = (trace.nan_check or {}).get(part)
        if record is None or record["call"] is None:
            continue
        at = ids.get(record["call"])
        if at is None:
            fail(f"nan_check.{part}.call", _missing("call", record["call"], "this trace"))
        elif trace.calls[at].snapshot == "full" and trace.calls[at].node(record["node"]) is None:
            fail(f"nan_check.{part}.node", _missing("node", record["node"], f"call '{_id(record['call'])}'"))

def size_problem(data: dict) -> str | None:
    """Why a decoded trace is too big to open (a call past ``MAX_CALL_NODES`` nodes), read from the
    decoded JSON's list lengths before any record is built; None when it is not."""
    calls = data.get("calls")
    if not isinstance(calls, list):
        return None
    for i, c in enumerate(calls):
        if not isinstance(c, dict):
            continue
        for key, cap in (("nodes", MAX_CALL_NODES), ("tensors", MAX_CALL_TENSORS)):
            items = c.get(key)
            if isinstance(items, list) and len(items) > cap:
                return (f"field 'calls[{i}].{key}': {len(items):,} {key} in call {i}; Backprop Studio opens calls "
                        f"of up to {cap:,} {key}")
    tensors = data.get("tensors")
    if isinstance(tensors, list) and len(tensors) > MAX_CALL_TENSORS:
        return f"field 'tensors': {len(tensors):,} tensors; Backprop Studio opens traces of up to {MAX_CALL_TENSORS:,}"
    return None


_PEAKS = ("rss", "allocated", "reserved", "saved_bytes")


def kept_samples(samples: list, cap: int = MAX_MEMORY_SAMPLES) -> list[int]:
    """Indices (in order) of at most ``cap`` of ``samples`` (decoded memory samples): the list cut
    into stretches of equal length, and of each stretch its first sample and those holding its
    highest RSS, allocated, reserved and saved bytes, so every peak the chart would draw is
    kept; then samples with a mark (zero_grad, optimizer.step), and evenly spread ones, while
    room remains."""
    n = len(samples)
    if n <= cap:
        return list(range(n))
    per = len(_PEAKS) + 1
    stretch = -(-n * per // cap)  # samples per stretch, rounded up: at most cap // per stretches
    keep: set[int] = set()
    dicts = [s if type(s) is dict else {} for s in samples]
    for key in _PEAKS:
        column = [v if type(v) is int or type(v) is float else 0 for v in map(dict.get, dicts, repeat(key, n))]
        for start in range(0, n, stretch):
            part = column[start:start + stretch]
            keep.add(start + part.index(max(part)))
    keep.update(range(0, n, stretch))
    room = cap - len(keep)
    if room > 0:
        marks = [i for i, s in enumerate(samples) if type(s) is dict and s.get("mark") and i not in keep]
        keep.update(marks[:room])
    room = cap - len(keep)
    if room > 0:  # the rest of the room: samples spread evenly over the whole record
        keep.update(range(0, n, -(-n // room)))
    return sorted(keep)
