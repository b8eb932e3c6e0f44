"""Snapshot a live grad_fn DAG into trace dataclasses (runs in the worker, imports torch).

The walk uses an explicit stack and a visited map, never recursion, so a 200-step unrolled
RNN or a 50,000-node graph does not hit Python's recursion limit. Which ``_saved_*``
attributes a node type has is cached per type: calling ``dir()`` on every node costs as
much as the computation on small tensors. Value previews live in ``core.worker.capture.values``, the graph
numbering and labelling in ``core.worker.capture.node_graph`` (both re-exported here).
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch

from core.worker.capture.cuts import cuts_of, hook_names
from core.worker.capture.edge_marks import edge_marks
from core.worker.capture.node_graph import (grad_fn_of, node_kind, node_name, number_nodes, plain_ints,
                                            saved_attr_names, shape_of, version_of)
from core.model.attrs import signed_int64
from core.model.trace import Edge, GradInfo, NodeInfo, Saved, Stale, StorageInfo, TensorInfo, fast_new
from core.worker.capture.values import FULL_VALUES, VALUE_BUDGET, ValueBatch, _json_number


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _saved_value(value: Any) -> Any:
    if type(value) is int:
        return signed_int64(value)  # autograd reads int64 attributes back as unsigned
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    if isinstance(value, float):
        return _json_number(value)
    if isinstance(value, (torch.Size, tuple, list)):
        return [_saved_value(v) for v in value]
    if isinstance(value, (torch.dtype, torch.device)):
        return str(value)
    return repr(value)


class Snapshotter:
    """Collects nodes, tensors and storages of one snapshot; tensor ids are shared across it."""

    def __init__(self, names: Callable[[torch.Tensor], str | None], module_paths: dict[int, str] | None = None,
                 inplace: dict[int, list] | None = None, origin: Callable[[torch.Tensor], str | None] | None = None):
        self.names = names
        self.origin = origin  # 'detach' / 'no_grad' for tensors cut off the graph (core.worker.capture.cuts)
        self.inplace = inplace or {}
        self.module_paths = module_paths or {}
        self.tensors: dict[int, dict] = {}  # key -> raw fields
        # tensor id -> live tensor, for the grads read after the call; ``release()`` keeps only the
        # tensors that can get one, so the snapshot never keeps an activation alive through backward.
        self.objects: dict[str, torch.Tensor] = {}
        # ids of non-leaf tensors the call may give a .grad though they retain none yet: backward's
        # ``inputs=[h]`` calls h.retain_grad() as it starts (torch's engine, out of the capture's view)
        self.gets_grad: set[str] = set()
        self.by_key: dict[int, str] = {}
        self.by_layout: dict[tuple, str] = {}
        self.storages: dict[tuple, str] = {}
        self.storage_nbytes: dict[str, tuple[int, str]] = {}
        # Big graphs: once this many values are stored, further tensors keep a sample and stats.
        self.value_budget = VALUE_BUDGET
        self._batch = ValueBatch()
        self.walked: list = []  # node wrappers of the last walk, in preorder

    # -- tensors --------------------------------------------------------------------------
    def storage_id(self, t: torch.Tensor) -> str | None:
        try:
            st = t.untyped_storage()
            return self._storage_key(str(t.device), st.data_ptr(), st.nbytes())
        except Exception:
            return None

    def _storage_key(self, device: str, ptr: int, nbytes: int) -> str | None:
        if ptr == 0:
            return None
        key = (device, ptr, nbytes)
        sid = self.storages.get(key)
        if sid is None:
            sid = f"s{len(self.storages)}"
            self.storages[key] = sid
            self.storage_nbytes[sid] = (nbytes, device)
        return sid

    def tensor_id(self, t: torch.Tensor, saved: bool = False) -> str:
        key = t._cdata
        tid = self.by_key.get(key)
        if tid is not None:
            return tid
        device = str(t.device)
        try:
            st = t.untyped_storage()
            ptr, nbytes = st.data_ptr(), st.nbytes()
            offset, stride = t.storage_offset(), plain_ints(t.stride())
        except Exception:  # sparse, nested and other storage-less tensors
            ptr, nbytes, offset, stride = 0, 0, 0, []
        shape = shape_of(t)
        layout = (device, ptr, offset, tuple(shape), tuple(stride), t.dtype)
        if saved and ptr != 0 and layout in self.by_layout:
            # A saved output unpacks as a new tensor object over the same data: same tensor.
            return self.by_layout[layout]
        tid = f"t{len(self.tensors)}"
        self.by_key[key] = tid
        if ptr != 0:
            self.by_layout.setdefault(layout, tid)
        self.objects[tid] = t
        grad_fn = grad_fn_of(t)
        is_leaf = t.is_leaf
        raw = dict(
            id=tid,
            name=self.names(t),
            shape=shape,
            dtype=dtype_name(t.dtype),
            device=device,
            requires_grad=t.requires_grad,
            is_leaf=is_leaf,
            retains_grad=False if is_leaf else t.retains_grad,
            stride=stride,
            storage_offset=offset,
            storage=self._storage_key(device, ptr, nbytes),
            version=version_of(t),
            values=None,
            is_view=t._is_view(),
            grad_fn_name=node_name(grad_fn) if grad_fn is not None else None,
            element_size=t.element_size(),
            nbytes=nbytes,
            _grad_fn=grad_fn,
        )
        if grad_fn is not None and t.output_nr:
            raw["output_nr"] = t.output_nr  # which output of a multi-output node (unbind, split, max)
        hooks = t._backward_hooks if t.requires_grad else None
        if hooks:
            raw["hooks"] = hook_names(hooks)
        if self.origin is not None and not t.requires_grad:
            origin = self.origin(t)
            if origin is not None:
                raw["origin"] = origin
        self.tensors[key] = raw
        self._values(raw, "values", t)
        base = t._base
        if base is not None:
            raw["base"] = self.tensor_id(base)
        return tid

    def _values(self, target: dict, key: str, t: torch.Tensor) -> None:
        """Queue ``t``'s preview into ``target[key]`` (computed in bulk by ``flush``)."""
        numel = t.numel()
        if numel <= FULL_VALUES and numel <= self.value_budget:
            self.value_budget -= numel
            self._batch.add(target, key, t, full=True)
        else:
            self._batch.add(target, key, t, full=False, sample=8)

    def release(self, node_ids: dict[int, str]) -> None:
        """Compute the queued previews, then drop every reference the script would not hold:
        node wrappers and all tensors except those that can receive a ``.grad``."""
        self._batch.flush()
        self.walked = []
        for raw in self.tensors.values():
            fn = raw.pop("_grad_fn", None)
            if fn is not None:
                raw["grad_fn"] = node_ids.get(id(fn))
        self.objects = {
            tid: t for tid, t in self.objects.items()
            if (t.requires_grad and t.is_leaf) or (not t.is_leaf and t.retains_grad) or tid in self.gets_grad
        }

    def finish_tensors(self, node_ids: dict[int, str] | None = None, read_grads: bool = True) -> list[TensorInfo]:
        self._batch.flush()
        raws = []
        for raw in self.tensors.values():
            raw = dict(raw)
            fn = raw.pop("_grad_fn", None)
            if node_ids is not None and fn is not None:
                raw["grad_fn"] = node_ids.get(id(fn))
            t = self.objects.get(raw["id"])
            if t is not None and read_grads and (t.is_leaf or t.retains_grad):
                raw["retains_grad"] = not t.is_leaf  # as the call left it (backward's inputs= retains)
                g = t.grad
                if g is not None:
                    raw["_grad_shape"] = shape_of(g)
                    self._values(raw, "_grad_values", g)
                raw["version"] = version_of(t)
            raws.append(raw)
        self._batch.flush()
        out = []
        for raw in raws:
            shape = raw.pop("_grad_shape", None)
            if shape is not None:
                raw["grad"] = GradInfo(shape=shape, values=raw.pop("_grad_values"))
            out.append(fast_new(TensorInfo, raw))
        return out

    def finish_storages(self, tensors: list[TensorInfo]) -> list[StorageInfo]:
        members: dict[str, list[str]] = {}
        for t in tensors:
            if t.storage is not None:
                members.setdefault(t.storage, []).append(t.id)
        return [
            StorageInfo(id=sid, nbytes=nb, device=dev, tensors=members.get(sid, []))
            for sid, (nb, dev) in self.storage_nbytes.items()
        ]

    # -- graphs ---------------------------------------------------------------------------
    def walk(self, roots: list) -> tuple[list[NodeInfo], dict[int, str], str]:
        """Snapshot every node reachable from ``roots``; returns nodes, id map and a structure hash."""
        order, ids = number_nodes(roots)
        # The wrappers stay alive until ``release()``, so the ``id()`` keys of ``ids`` stay valid.
        self.walked = order
        nodes = []
        parts: list[str] = []  # hashed once at the end: the same bytes as feeding each piece in turn
        for node in order:
            info = self._node_info(node, ids)
            nodes.append(info)
            parts.append(info.name)
            parts.extend(f"|{e.node}:{e.input_nr}" if e else "|-" for e in info.next)
            parts.append(";")
        return nodes, ids, hashlib.sha1("".join(parts).encode()).hexdigest()

    def _node_info(self, node, ids: dict[int, str]) -> NodeInfo:
        kind, info_name = _kind_and_name(node)
        fns = node.next_functions
        nxt = [_edge(ids[id(fn)], nr) if fn is not None else None for fn, nr in fns]
        saved: list[Saved] = []
        stale = None
        variable = None
        if kind == "accumulate_grad":
            variable = self.tensor_id(node.variable)
        else:
            for attr, name, raw_attr in _saved_names(node):
                if raw_attr is not None and _packed_by_script(node, raw_attr):
                    # Unpacking would call the script's unpack hook (which may print, load a file,
                    # or delete it): the snapshot leaves it for the script's own backward.
                    saved.append(fast_new(Saved, {"name": name, "value": PACKED_BY_HOOK}))
                    continue
                try:
                    value = getattr(node, attr)
                except RuntimeError as exc:
                    msg = str(exc)
                    if "modified by an inplace operation" in msg:
                        stale = stale or _stale_from(name, msg)
                        saved.append(Saved(name=name, freed=False, value="stale"))
                    else:
                        saved.append(Saved(name=name, freed=True))
                    continue
                except Exception:
                    continue
                if isinstance(value, torch.Tensor):
                    saved.append(fast_new(Saved, {"name": name, "tensor": self.tensor_id(value, saved=True)}))
                elif isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
                    for i, v in enumerate(value):
                        saved.append(Saved(name=f"{name}[{i}]", tensor=self.tensor_id(v, saved=True)))
                else:
                    saved.append(fast_new(Saved, {"name": name, "value": _saved_value(value)}))
        meta = _metadata(node)
        if stale is not None:
            stale = self._stale_culprit(stale, meta.get("bps_storages", ()))
        cut = cuts_of(nxt, meta.get("bps_cuts"), self.names) if None in nxt else None
        marks = edge_marks(node, info_name, fns) if kind != "accumulate_grad" else None
        module = meta.get("bps_module")
        if module is not None:
            module = self.module_paths.get(module)
        values = {"id": ids[id(node)], "name": info_name, "kind": kind, "next": nxt, "saved": saved,
                  "variable": variable, "line": meta.get("bps_line"), "module": module, "stale": stale,
                  "device": meta.get("bps_device"), "inplace": meta.get("bps_inplace")}
        if cut:
            values["cuts"] = cut
        if marks:
            values["edge_marks"] = marks
        if saved and meta.get("bps_recomputed"):
            values["recomputed"] = True
        if kind != "accumulate_grad":  # AccumulateGrad's number is UINT64_MAX: it is made apart from any op
            values["seq"] = node._sequence_nr()  # the forward replay's order (core.model.forward_order)
        created = meta.get("bps_created")
        if created is not None:
            values["created"] = created
        return fast_new(NodeInfo, values)

    def _stale_culprit(self, stale: Stale, storages) -> Stale:
        """Name the in-place op (and its line) that moved a saved tensor past its saved version."""
        for ptr in storages:
            for version, line, op in self.inplace.get(ptr, ()):
                if stale.saved_version is None or version > stale.saved_version:
                    return replace(stale, op=op, op_line=line)
        return stale


_KINDS: dict[tuple, tuple[str, str]] = {}  # (node type, node.name()) -> (kind, display name)
# node type -> ((attribute, saved name, its SavedTensor attribute or None), ...)
_SAVED: dict[type, tuple[tuple[str, str, str | None], ...]] = {}
PACKED_BY_HOOK = "packed by the script's hook"  # a saved tensor's value when only its hook can unpack it
_TORCH_DIR = str(Path(torch.__file__).resolve().parent)
_HOOK_OWNERS: dict = {}  # an unpack hook's code -> whether it is the script's (not torch's own)


def _kind_and_name(node) -> tuple[str, str]:
    """``node_kind`` and ``node_name`` of a node, worked out once per node type and name."""
    key = (type(node), node.name())
    found = _KINDS.get(key)
    if found is None:
        found = _KINDS[key] = (node_kind(node), node_name(node))
    return found


def _saved_names(node) -> tuple[tuple[str, str, str | None], ...]:
    """The node type's ``_saved_*`` attributes, each with the name the trace gives it and the
    ``_raw_saved_*`` attribute that holds it as a SavedTensor (None for saved numbers, sizes)."""
    found = _SAVED.get(type(node))
    if found is None:
        raw = {a for a in dir(node) if a.startswith("_raw_saved_")}
        found = _SAVED[type(node)] = tuple((a, a[len("_saved_"):], "_raw" + a if "_raw" + a in raw else None)
                                           for a in saved_attr_names(node))
    return found


def _packed_by_script(node, raw_attr: str) -> bool:
    """Whether a saved tensor was packed by the script's saved-tensor hooks
    (``torch.autograd.graph.saved_tensors_hooks``, ``SavedTensor.register_hooks``). torch's own
    hooks (non-reentrant checkpointing, ``save_on_cpu``) unpack as they would in backward."""
    try:
        raw = getattr(node, raw_attr)
    except Exception:  # freed, or a node that refuses it: the saved attribute says which
        return False
    for one in raw if isinstance(raw, (list, tuple)) else (raw,):
        hook = getattr(one, "unpack_hook", None)
        if hook is not None and _scripts_hook(hook):
            return True
    return False


def _scripts_hook(hook) -> bool:
    code = getattr(hook, "__code__", None)
    if code is None:  # a partial, a callable object: not one of torch's functions
        return True
    mine = _HOOK_OWNERS.get(code)
    if mine is None:
        try:
            mine = not str(Path(code.co_filename).resolve()).startswith(_TORCH_DIR + "/")
        except (OSError, ValueError):
            mine = True
        _HOOK_OWNERS[code] = mine
    return mine


def _edge(node_id: str, input_nr: int) -> Edge:
    """``Edge(node_id, input_nr)`` without the frozen dataclass's per-field ``__init__``."""
    edge = _new_edge(Edge)
    edge.__dict__.update(node=node_id, input_nr=input_nr)
    return edge


_new_edge = Edge.__new__


def _metadata(node) -> dict:
    try:
        return node.metadata
    except Exception:
        return {}


def _stale_from(name: str, message: str) -> Stale:
    """Parse 'is at version 1; expected version 0 instead' from the engine's message."""
    import re

    now = re.search(r"is at version (\d+)", message)
    then = re.search(r"expected version (\d+)", message)
    return Stale(
        saved=name,
        saved_version=int(then.group(1)) if then else None,
        version=int(now.group(1)) if now else None,
        message=message.split("Hint:")[0].strip(),
    )
