"""Bytes of the tensors live autograd graphs save for backward (in the worker; torch imported lazily).

Storages are counted once however many saved tensors view them (the graph keeps the storage
alive). ``core.worker.memory.MemorySampler`` calls these on the script's thread only: walking
grad_fn graphs from another thread could race with the engine freeing saved tensors.
"""

from __future__ import annotations

import gc
from typing import Iterable

# Imported here, not inside the functions: they run while the script does, when the app's
# modules are out of sys.modules (the worker keeps the script's imports its own).
from core.worker.capture.node_graph import node_name
from core.worker.capture.node_graph import number_nodes, root_nodes


# Saved tensors are read through ``node._raw_saved_<name>`` (a SavedTensor) and its ``data``: the
# tensor the graph holds, or None once a backward freed it. Unlike ``node._saved_<name>`` this
# raises nothing for freed tensors (an exception costs ~20 us, a whole freed graph tens of ms), it
# still counts tensors modified in place since they were saved (they are held all the same), and
# with saved-tensor hooks it sees what the pack hook returned (``save_on_cpu``'s CPU copy).
_raw_names: dict[type, tuple[str, ...]] = {}


def _raw_saved_names(node) -> tuple[str, ...]:
    cls = type(node)
    names = _raw_names.get(cls)
    if names is None:
        names = _raw_names[cls] = tuple(a for a in dir(node) if a.startswith("_raw_saved_"))
    return names


def _storages_of(value, tensor_type, out: dict) -> None:
    if isinstance(value, tensor_type):
        try:
            st = value.untyped_storage()
            ptr = st.data_ptr()
            if ptr:
                device = value.get_device()
                out[ptr if device < 0 else (device, ptr)] = st.nbytes()
        except Exception:  # sparse, nested and other storage-less tensors
            pass
    elif isinstance(value, (tuple, list)):
        for v in value:
            if isinstance(v, tensor_type):
                _storages_of(v, tensor_type, out)


def node_storages(node, tensor_type=None) -> dict:
    """The distinct storages one node's saved tensors hold: ``data_ptr`` (``(device, data_ptr)``
    off the CPU) -> nbytes. Cheap (a few microseconds): the per-op accounting of a forward pass uses it."""
    if tensor_type is None:
        import torch

        tensor_type = torch.Tensor
    storages: dict = {}
    for attr in _raw_saved_names(node):
        try:
            raw = getattr(node, attr)
        except Exception:  # a custom Function's saved tensors after its backward
            continue
        for saved in raw if isinstance(raw, (tuple, list)) else (raw,):
            try:
                data = saved.data
            except Exception:
                continue
            if data is not None:
                _storages_of(data, tensor_type, storages)
    return storages


def _walk_saved(roots: Iterable) -> tuple[list, list[dict]]:
    """Nodes reachable from ``roots`` in Snapshotter's DFS preorder, each with the distinct
    storages its saved tensors hold: ``data_ptr`` (``(device, data_ptr)`` off the CPU) -> nbytes.

    The cyclic GC is paused meanwhile: the walk allocates a wrapper per node and tensor, which
    on a big graph would otherwise set off full collections that cost more than the walk.
    """
    import torch

    tensor_type = torch.Tensor
    held: list[dict] = []
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        order, _ = number_nodes(root_nodes(roots))
        for node in order:
            held.append(node_storages(node, tensor_type))
    finally:
        if was_enabled:
            gc.enable()
    return order, held


def saved_storages(roots: Iterable) -> dict:
    """Every distinct storage held by saved tensors of the graphs behind ``roots``: key -> nbytes."""
    seen: dict = {}
    for storages in _walk_saved(roots)[1]:
        seen.update(storages)
    return seen


class LiveStorages(dict):
    """The storages (key -> nbytes) saved by every graph the script reaches, with ``kept``: by list
    name, the bytes of those only the graphs in that list hold (``losses.append(loss)`` keeping a
    graph per epoch). A storage reached both from a list and elsewhere counts as the list's."""

    def __init__(self, storages: dict, kept: dict[str, int]):
        super().__init__(storages)
        self.kept = kept


def _walk_into(roots: list, visited: set, out: dict, tensor_type) -> None:
    """Add to ``out`` the storages of the nodes behind ``roots`` not yet in ``visited`` (ids)."""
    stack = [r for r in roots if r is not None]
    keep = []  # the wrappers stay alive while the walk runs, so the id() keys stay valid
    while stack:
        node = stack.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        keep.append(node)
        out.update(node_storages(node, tensor_type))
        for fn, _ in node.next_functions:
            if fn is not None and id(fn) not in visited:
                stack.append(fn)


def live_storages(roots: Iterable, kept: dict[str, list] | None = None) -> LiveStorages:
    """Saved storages of the graphs behind ``roots``, the ``kept`` lists' roots (by list name) first.

    Each storage counts once: a graph shared by two lists, or a list's graph also named
    directly (``loss`` is ``losses[-1]``), is the first list's. Script thread only.
    """
    import torch

    tensor_type = torch.Tensor
    visited: set = set()
    everything: dict = {}
    by_list: dict[str, int] = {}
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for name, fns in (kept or {}).items():
            own: dict = {}
            _walk_into(root_nodes(fns), visited, own, tensor_type)
            fresh = {k: v for k, v in own.items() if k not in everything}
            everything.update(fresh)
            if fresh:
                by_list[name] = sum(fresh.values())
        rest: dict = {}
        _walk_into(root_nodes(roots), visited, rest, tensor_type)
        for key, nbytes in rest.items():
            everything.setdefault(key, nbytes)
    finally:
        if was_enabled:
            gc.enable()
    return LiveStorages(everything, by_list)


def saved_tensor_bytes(roots: Iterable) -> int:
    """Bytes of distinct storages held by saved tensors of the graphs behind ``roots``.

    ``roots`` are tensors (their grad_fn) or graph nodes. A storage saved by several nodes,
    or twice by one (``b * b``), counts once; tensors a backward already freed count 0.
    Call it on the thread that runs the script (see the module docstring).
    """
    seen: dict = {}
    for storages in _walk_saved(roots)[1]:
        seen.update(storages)
    return sum(seen.values())


def memory_report(roots: Iterable) -> dict:
    """Who holds memory: ``{"nodes": held_by_nodes rows, "total": bytes, "node_count"}`` in one walk."""
    order, storages = _walk_saved(roots)
    seen: dict = {}
    rows = []
    for i, (node, held) in enumerate(zip(order, storages)):
        seen.update(held)
        if held:
            rows.append({"node_index": i, "name": node_name(node), "bytes": sum(held.values()),
                         "tensors": len(held)})
    rows.sort(key=lambda r: (-r["bytes"], r["node_index"]))
    return {"nodes": rows, "total": sum(seen.values()), "node_count": len(order)}


def held_by_nodes(roots: Iterable) -> list[dict]:
    """Nodes ranked by the bytes their saved tensors hold: the "who holds memory" view.

    Each row is ``{"node_index", "name", "bytes", "tensors"}``; ``node_index`` is the node's
    position in the DFS preorder that numbers trace nodes n0, n1, ... . A storage saved by two
    nodes counts in both rows (the total, from ``memory_report`` or ``saved_tensor_bytes``,
    counts it once); nodes holding nothing are left out. Largest first, ties in graph order.
    """
    return memory_report(roots)["nodes"]
